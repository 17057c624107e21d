"""The normalisation check of tests/python_worker_test.sh: what a Python worker sends with
--normalize-obs --normalize-reward, checked message by message against the raw observations and
rewards its envs returned (tests/python/cue_env.py make_scaled, $CUE_ENV_LOG), with an
independent numpy implementation of the rules of docs/ENVIRONMENTS.md ("Observation and reward
normalisation") and docs/PROTOCOL.md ("Normalisation statistics"); and the learner's merged statistics
against the same raw data.

  norm_tap.py proxy LEARNER_ENDPOINT ENDPOINT_FILE CAPTURE_FILE
      A pass-through between one worker and the learner (ROUTER in front, DEALER to the learner)
      that records every message both ways; writes its own endpoint to ENDPOINT_FILE; ends a
      second after it forwarded the learner's Stop.
  norm_tap.py check CAPTURE_FILE ENV_LOG --rollout-length T --gamma G [--clip 10]
      Replays the capture against the env log; exits 1 naming the first mismatch.

Needs python3 with zmq, google.protobuf (farm_pb2 on FARM_PYTHON_PATH) and numpy.
"""
import argparse
import json
import os
import struct
import sys
import time

EPS = 1e-8


def load_pb():
    for d in os.environ.get("FARM_PYTHON_PATH", "").split(os.pathsep):
        if d:
            sys.path.insert(0, d)
    import farm_pb2
    return farm_pb2


def proxy(args) -> int:
    import zmq
    pb = load_pb()
    ctx = zmq.Context()
    front = ctx.socket(zmq.ROUTER)
    front.setsockopt(zmq.LINGER, 2000)
    front.bind("tcp://127.0.0.1:*")
    back = ctx.socket(zmq.DEALER)
    back.setsockopt(zmq.LINGER, 0)
    back.setsockopt(zmq.ROUTING_ID, b"norm-tap")
    back.connect(args.learner)
    with open(args.endpoint_file + ".tmp", "w") as f:
        f.write(front.getsockopt_string(zmq.LAST_ENDPOINT))
    os.rename(args.endpoint_file + ".tmp", args.endpoint_file)
    poller = zmq.Poller()
    poller.register(front, zmq.POLLIN)
    poller.register(back, zmq.POLLIN)
    records = []
    worker = None
    stop_at = None
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and (stop_at is None or time.monotonic() < stop_at):
        for sock, _ in poller.poll(100):
            if sock is front:
                worker, msg = front.recv_multipart()
                records.append((b"W", msg))
                back.send(msg)
            else:
                msg = back.recv()
                records.append((b"L", msg))
                if worker is not None:
                    front.send_multipart([worker, msg])
                env = pb.Envelope()
                env.ParseFromString(msg)
                if env.WhichOneof("body") == "stop" and stop_at is None:
                    stop_at = time.monotonic() + 1.0
    with open(args.capture + ".tmp", "wb") as f:
        for direction, msg in records:
            f.write(direction + struct.pack("<I", len(msg)) + msg)
    os.rename(args.capture + ".tmp", args.capture)
    front.close()
    back.close()
    ctx.term()
    return 0 if stop_at is not None else 1


def read_capture(path, pb):
    out = []
    data = open(path, "rb").read()
    i = 0
    while i < len(data):
        direction = data[i:i + 1].decode()
        (n,) = struct.unpack("<I", data[i + 1:i + 5])
        env = pb.Envelope()
        env.ParseFromString(data[i + 5:i + 5 + n])
        out.append((direction, env))
        i += 5 + n
    return out


class Failure(Exception):
    pass


def check(args) -> int:
    import numpy as np
    pb = load_pb()
    f32 = np.float32
    T, gamma, clip = args.rollout_length, args.gamma, args.clip
    logs = sorted((json.loads(line) for line in open(args.env_log)), key=lambda e: e["id"])
    n_envs = len(logs)
    if [e["id"] for e in logs] != list(range(n_envs)):
        raise Failure(f"env log ids {[e['id'] for e in logs]}: expected 0..{n_envs - 1}")
    # Per env: the observations the worker sends (every one except those that ended an episode: those are
    # replaced by the reset's), and for each the observation that ended the episode just before (final obs).
    sent, final_before, rewards = [], [], []
    for e in logs:
        s, fb, pending_final = [], [], None
        for obs, ended in zip(e["obs"], e["ended"]):
            if ended:
                pending_final = obs
            else:
                s.append(obs)
                fb.append(pending_final)
                pending_final = None
        sent.append(np.array(s, dtype=f32))
        final_before.append(fb)
        rewards.append(np.array(e["rewards"], dtype=f32))
    # Step k (1-based) of env e is its k-th step call: its reward is rewards[e][k-1], and ended_by_step[e][k-1]
    # says whether it ended the episode (the log has a step's entry, then a reset's entry when it ended).
    ended_by_step = []
    for e in logs:
        flags = []
        it = iter(zip(e["obs"][1:], e["ended"][1:]))
        for _, ended in it:
            flags.append(ended)
            if ended:
                next(it, None)
        ended_by_step.append(flags)

    caps = read_capture(args.capture, pb)
    hello = next(env.hello for d, env in caps if d == "W" and env.WhichOneof("body") == "hello")
    nz = hello.normalization
    if not (hello.HasField("normalization") and nz.normalize_obs and nz.normalize_reward and nz.obs_clip == clip
            and nz.reward_clip == clip and nz.gamma == gamma):
        raise Failure(f"Hello.normalization: {nz} (expected both on, clips {clip}, gamma {gamma})")
    groups = hello.num_groups
    per_group = hello.num_envs // groups
    if hello.num_envs != n_envs:
        raise Failure(f"Hello.num_envs {hello.num_envs}, env log has {n_envs} envs")
    dim = sent[0].shape[1]

    # Independent state (numpy): every statistic from the raw rows it covers, by two passes.
    own_rows, pending_rows, own_g, pending_g = [], [], [], []
    view_obs = view_ret = None  # (count, mean, m2) from the learner
    frozen = False
    G = np.zeros(n_envs)
    replies = {}  # (group, seq) -> ActionReply
    stats = {"requests": 0, "deltas": 0, "merged": 0, "clipped": 0, "exact": 0, "values": 0, "max_diff": 0.0,
             "scaled_rewards": 0, "final_obs": 0}

    def moments(rows):
        a = np.asarray(rows, dtype=np.float64)
        if a.ndim == 1:
            a = a.reshape(-1, 1)
        if not len(a):
            return 0, np.zeros(a.shape[1]), np.zeros(a.shape[1])
        mean = a.mean(axis=0)
        return len(a), mean, ((a - mean) ** 2).sum(axis=0)

    def same_moments(what, got, count, mean, m2):
        if got.count != count:
            raise Failure(f"{what}: count {got.count}, expected {count}")
        gm, g2 = np.array(got.mean), np.array(got.m2)
        if not (np.allclose(gm, mean, rtol=1e-9, atol=1e-9 * (1 + np.abs(mean).max()))
                and np.allclose(g2, m2, rtol=1e-8, atol=1e-8 * (1 + np.abs(m2).max()))):
            raise Failure(f"{what}: mean {list(gm)} m2 {list(g2)}, expected {list(mean)} {list(m2)}")

    def apply_global(ns, what):
        nonlocal view_obs, view_ret, frozen
        if not (ns.HasField("obs") and ns.HasField("ret")):
            raise Failure(f"{what}: NormalizerStats without obs or ret")
        frozen = ns.frozen
        if frozen or ns.obs.count > 0:
            view_obs = (ns.obs.count, np.array(ns.obs.mean), np.array(ns.obs.m2))
        if frozen or ns.ret.count > 0:
            view_ret = (ns.ret.count, np.array(ns.ret.mean), np.array(ns.ret.m2))

    def transform(raw):
        count, mean, m2 = view_obs if view_obs is not None else moments(own_rows)
        var = m2 / count if count else np.ones(dim)
        mean32 = (mean if count else np.zeros(dim)).astype(f32)
        std32 = np.sqrt(var + EPS).astype(f32)
        return np.clip((raw - mean32) / std32, f32(-clip), f32(clip))

    def compare(what, got, expected):
        expected = np.asarray(expected, dtype=f32)
        if got.shape != expected.shape:
            raise Failure(f"{what}: shape {got.shape}, expected {expected.shape}")
        diff = np.abs(got.astype(np.float64) - expected.astype(np.float64))
        tol = 1e-4 * np.maximum(1.0, np.abs(expected))
        if not (diff <= tol).all():
            k = int(np.argmax(diff - tol))
            raise Failure(f"{what}: element {k} is {got.flat[k]!r}, expected {expected.flat[k]!r} "
                          f"(max difference {diff.max():g})")
        stats["values"] += got.size
        stats["exact"] += int((got == expected).sum())
        stats["max_diff"] = max(stats["max_diff"], float(diff.max()))

    def tensor(t, shape):
        a = np.frombuffer(t.data, dtype="<f4").astype(f32)
        if list(t.shape) != list(shape) or a.size != int(np.prod(shape)):
            raise Failure(f"tensor shape {list(t.shape)} ({a.size} values), expected {list(shape)}")
        return a.reshape(shape)

    deltas_sent = []  # (group, seq) of requests with a delta, in capture order
    welcome_seen = False
    for d, env in caps:
        kind = env.WhichOneof("body")
        if d == "L" and kind == "welcome":
            if not env.welcome.accepted:
                raise Failure(f"refused: {env.welcome.error}")
            if env.welcome.HasField("normalizer"):
                apply_global(env.welcome.normalizer, "Welcome.normalizer")
            welcome_seen = True
        elif d == "L" and kind == "action":
            a = env.action
            replies[(a.group, a.seq)] = a
            if a.HasField("normalizer"):
                if (a.group, a.seq) not in deltas_sent:
                    raise Failure(f"ActionReply group {a.group} seq {a.seq}: statistics in a reply to a request "
                                  "without a delta")
                # The learner's merged statistics: every group's observations up to this rollout's boundary
                # (sync mode: every boundary request is merged before the update and answered after it).
                rows = [sent[e][:a.seq + 1] for e in range(n_envs)]
                same_moments(f"learner's merged obs statistics (reply {a.group}/{a.seq})", a.normalizer.obs,
                             *moments(np.concatenate(rows)))
                gs = []
                for e in range(n_envs):
                    g = 0.0
                    for k in range(a.seq):
                        g = gamma * g + float(rewards[e][k])
                        gs.append(g)
                        if ended_by_step[e][k]:
                            g = 0.0
                same_moments(f"learner's merged return statistics (reply {a.group}/{a.seq})", a.normalizer.ret,
                             *moments(gs))
                stats["merged"] += 1
        elif d == "W" and kind == "step":
            if not welcome_seen:
                raise Failure("StepRequest before Welcome")
            r = env.step
            g, s = r.group, r.seq
            envs = range(g * per_group, (g + 1) * per_group)
            if s > 0:
                prev = replies.get((g, s - 1))
                if prev is None:
                    raise Failure(f"request {g}/{s} without a reply to {s - 1} before it")
                if prev.HasField("normalizer"):
                    apply_global(prev.normalizer, f"ActionReply {g}/{s - 1}")
            raw = np.stack([sent[e][s] for e in envs])
            if not frozen:
                pending_rows.extend(raw)
                if view_obs is None:
                    own_rows.extend(raw)
            obs = tensor(r.obs, [per_group, dim])
            expected = transform(raw)
            compare(f"request {g}/{s} obs", obs, expected)
            stats["clipped"] += int((np.abs(obs) == f32(clip)).sum())
            if s > 0:
                # Final observations of truncated envs: normalised with the same statistics, not counted.
                idx = list(r.final_obs_index)
                if idx:
                    fin = tensor(r.final_obs, [len(idx), dim])
                    raw_final = np.array([final_before[g * per_group + i][s] for i in idx], dtype=f32)
                    compare(f"request {g}/{s} final_obs", fin, transform(raw_final))
                    stats["final_obs"] += len(idx)
                raw_r = np.array([rewards[e][s - 1] for e in envs], dtype=f32)
                ended = [ended_by_step[e][s - 1] for e in envs]
                flags = [bool(a or b) for a, b in zip(r.terminated, r.truncated)]
                if flags != ended:
                    raise Failure(f"request {g}/{s}: ended flags {flags}, env log says {ended}")
                for j, e in enumerate(envs):
                    G[e] = gamma * G[e] + float(raw_r[j])
                    if not frozen:
                        pending_g.append(G[e])
                        if view_ret is None:
                            own_g.append(G[e])
                count, mean, m2 = view_ret if view_ret is not None else moments(own_g)
                var = m2[0] / count if count else 1.0
                expected_r = np.clip(raw_r.astype(np.float64) / np.sqrt(var + EPS), -clip, clip)
                compare(f"request {g}/{s} reward", tensor(r.reward, [per_group]), expected_r)
                stats["scaled_rewards"] += per_group
                for j, e in enumerate(envs):
                    if ended[j]:
                        G[e] = 0.0
                if s % T == 0 and not frozen:
                    if not r.HasField("stats_delta"):
                        raise Failure(f"request {g}/{s}: no stats_delta (rollout length {T})")
                    same_moments(f"request {g}/{s} stats_delta.obs", r.stats_delta.obs, *moments(pending_rows))
                    same_moments(f"request {g}/{s} stats_delta.ret", r.stats_delta.ret, *moments(pending_g))
                    pending_rows, pending_g = [], []
                    deltas_sent.append((g, s))
                    stats["deltas"] += 1
                elif r.HasField("stats_delta"):
                    raise Failure(f"request {g}/{s}: a stats_delta off the rollout boundary")
            elif r.HasField("stats_delta"):
                raise Failure(f"request {g}/0: a stats_delta on the first request")
            stats["requests"] += 1
    if stats["deltas"] < 2 * groups or stats["merged"] < 2 * groups:
        raise Failure(f"too short to check the statistics' round trip: {stats}")
    if stats["clipped"] == 0 or stats["final_obs"] == 0:
        raise Failure(f"the run never clipped an observation or sent a final observation: {stats}")
    print("norm_tap check ok:", json.dumps(stats))
    return 0


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("proxy")
    a.add_argument("learner")
    a.add_argument("endpoint_file")
    a.add_argument("capture")
    c = sub.add_parser("check")
    c.add_argument("capture")
    c.add_argument("env_log")
    c.add_argument("--rollout-length", type=int, required=True)
    c.add_argument("--gamma", type=float, required=True)
    c.add_argument("--clip", type=float, default=10.0)
    args = p.parse_args()
    if args.cmd == "proxy":
        return proxy(args)
    try:
        return check(args)
    except Failure as e:
        print(f"FAIL: norm_tap check: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
