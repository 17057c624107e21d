#!/usr/bin/env python3
"""A TCP forwarder that delays what it carries, each direction by DELAY_MS +- JITTER_MS (uniform, order kept):
tests/network_faults_test.sh puts it between the workers and the learner where the kernel has no netem
(sch_netem). It delays whole reads, not packets: TCP's own behaviour under delay (slow start, the window) is not
emulated, only the latency that ZeroMQ's messages see.

Usage: net_delay_proxy.py LISTEN_HOST LISTEN_PORT TARGET_HOST TARGET_PORT DELAY_MS JITTER_MS SEED
"""
import asyncio
import random
import sys


async def forward(reader, writer, delay_s, jitter_s, rng):
    """Copies reader to writer, each chunk released delay +- jitter after it was read, never before the last."""
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()

    async def release():
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        writer.close()

    releaser = asyncio.create_task(release())
    last_due = 0.0
    try:
        while True:
            data = await reader.read(1 << 16)
            last_due = max(last_due, loop.time() + delay_s + rng.uniform(-jitter_s, jitter_s))
            await queue.put((last_due, data))
            if not data:
                break
        await releaser
    except (ConnectionError, OSError):
        releaser.cancel()
        writer.close()


async def main():
    listen_host, listen_port, target_host, target_port = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    delay_s, jitter_s = float(sys.argv[5]) / 1000, float(sys.argv[6]) / 1000
    rng = random.Random(int(sys.argv[7]))

    async def on_client(client_reader, client_writer):
        try:
            target_reader, target_writer = await asyncio.open_connection(target_host, target_port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(forward(client_reader, target_writer, delay_s, jitter_s, rng),
                             forward(target_reader, client_writer, delay_s, jitter_s, rng))

    server = await asyncio.start_server(on_client, listen_host, listen_port)
    print(f"delaying {listen_host}:{listen_port} -> {target_host}:{target_port} by "
          f"{delay_s * 1000:g} +- {jitter_s * 1000:g} ms each way", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
