#!/usr/bin/env python3
"""A TCP listener on 127.0.0.1 that accepts every connection and resets it at once: what a worker sees of a
CURVE learner that detects a mechanism mismatch before the worker has read its greeting (the learner's reset
comes first on a fast machine, and the worker's ZeroMQ reports only a closed connection).

Usage: closing_listener.py PORT_FILE   (writes the port it listens on, then serves until killed)
"""
import socket
import struct
import sys


def main() -> None:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    tmp = sys.argv[1] + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(srv.getsockname()[1]))
    import os
    os.replace(tmp, sys.argv[1])
    while True:
        conn, _ = srv.accept()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
        conn.close()


if __name__ == "__main__":
    main()
