#!/usr/bin/env python3
"""Trains and evaluates a run with several policies (a config with `policies:`, or one given with --set policies=...)
over seeds: for each seed, `scripts/farm run CONFIG --set seed=S --set run_dir=RUNS_DIR/seedS`, then `farm-eval
RUNS_DIR/seedS` (every policy's checkpoint served together, deterministic unless --sample; --eval-set KEY=VALUE
changes the evaluation's config only). Prints one JSON object per seed and policy (training's last 100-episode mean,
env steps/s, the median explained variance from update 20, eval mean and std), then each policy's medians, and
writes them all to --out. A config without policies is measured the same way (policy "", the run's one), to compare.

    scripts/bench_policies.py CONFIG [--seeds 1,2,3] [--workers 2] [--eval-episodes 200] [--sample]
                              [--set key=value ...] [--eval-set key=value ...] [--runs-dir DIR] [--out FILE]

Needs a build (FARM_BUILD_DIR, default build/; FARM_SKIP_BUILD=1 is set for scripts/farm) and the env's modules on
PYTHONPATH.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ev_median(metrics_path):
    values = []
    with open(metrics_path) as f:
        for line in f:
            row = json.loads(line)
            if row.get("update", 0) >= 20 and row.get("explained_variance") is not None:
                values.append(row["explained_variance"])
    return statistics.median(values) if values else None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--eval-episodes", type=int, default=200)
    p.add_argument("--sample", action="store_true")
    p.add_argument("--set", action="append", default=[], dest="sets")
    p.add_argument("--eval-set", action="append", default=[], dest="eval_sets")
    p.add_argument("--runs-dir", default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    build = os.environ.get("FARM_BUILD_DIR", os.path.join(ROOT, "build"))
    runs = os.path.abspath(args.runs_dir or tempfile.mkdtemp(prefix="bench_policies-"))
    os.makedirs(runs, exist_ok=True)
    env = dict(os.environ, FARM_SKIP_BUILD="1", FARM_BUILD_DIR=build)
    sets = [a for kv in args.sets for a in ("--set", kv)]
    rows = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        run = os.path.join(runs, f"seed{seed}")
        start = time.monotonic()
        with open(run + ".log", "w") as log:
            rc = subprocess.call([os.path.join(ROOT, "scripts", "farm"), "run", args.config, "--workers",
                                  str(args.workers), "--set", f"seed={seed}", "--set", f"run_dir={run}"] + sets,
                                 stdout=log, stderr=subprocess.STDOUT, env=env)
        wall = time.monotonic() - start
        if rc != 0:
            raise SystemExit(f"bench_policies: seed {seed}: scripts/farm run exited with status {rc} ({run}.log)")
        cmd = [os.path.join(build, "tools", "farm-eval"), run, "--episodes", str(args.eval_episodes)]
        if args.sample:
            cmd.append("--sample")
        cmd += [a for kv in args.eval_sets for a in ("--set", kv)]
        out = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if out.returncode != 0:
            raise SystemExit(f"bench_policies: seed {seed}: farm-eval failed: {out.stderr.strip()}")
        evals = {r.get("policy", ""): r for r in (json.loads(line) for line in out.stdout.splitlines() if line.strip())}
        for name, e in evals.items():
            s = json.load(open(os.path.join(run, name, "summary.json")))
            row = {"policy": name, "seed": seed, "env_steps": s["env_steps"], "wall_s": round(wall, 1),
                   "env_steps_per_s": round(s["env_steps"] / wall, 1), "mean_return_100": s["mean_return_100"],
                   "ev_median_from_update_20": ev_median(os.path.join(run, name, "metrics.jsonl")),
                   "protocol_errors": s["protocol_errors"], "workers_lost": s.get("workers_lost"),
                   "eval_episodes": e["episodes"], "eval_mean": e["mean_return"], "eval_std": e["std_return"],
                   "eval_actions": e["actions"]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    for name in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == name]
        print(json.dumps({"policy": name, "median_eval_mean": statistics.median(r["eval_mean"] for r in mine),
                          "median_mean_return_100": statistics.median(r["mean_return_100"] for r in mine),
                          "median_env_steps_per_s": statistics.median(r["env_steps_per_s"] for r in mine)}))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
