#!/usr/bin/env python3
"""Rollout Farm benchmark suite: runs every case several times, prints a table
and writes every figure (medians and raw runs) with the machine's description
as JSON. Called by `scripts/farm bench [--quick] [--out FILE] [--cases LIST]`.

Cases (--cases, comma-separated; default all):
  env         env-only: CartPole steps/s per core, in process
  transport   transport-only: random actions, no model (2 workers x 2048 envs)
  inference   served rows/s against a plain forward loop
  training    PPO end to end with configs/cartpole_fast.yaml, seeds 1-3, one
              worker per core; also the worker and learner resident sets
  sweeps      workers x envs per worker, acting with the policy
  roofline    FLOPs per env step against the measured matmul peak
  scale       workers 1, 2, 4, 8, 16, 32, 64 on this machine for CartPole and
              uav_coverage (mlp; cnn too when a GPU is present): env and agent
              steps/s, seconds until the last worker joined, learner RSS,
              workers lost, rejoins and the learner's time split, beside the
              env-only limit of the same cores (the envs stepped with no
              learner) and the ratio of the two (--plot FILE.png draws it)
  python      the Python worker: its cost per env step on the pure and the
              numpy path (scripts/bench_python.py), then the numpy multi-UAV
              example (examples/python/uav_coverage.yaml) at 1 to 64 workers,
              as scale does
  recurrent   the cost of a recurrent core (ppo.core): CPU training env steps/s on
              CartPoleNoVel-v1 with configs/cartpole_fast.yaml's settings and a
              GRU of 64 against the same without a core, and the learner's
              served rows/s at batch 1,024 with a GRU against the MLP's; ratios
              from runs side by side
  encoders    the cost of an encoder written in PyTorch (ppo.actor_encoder_script): CPU
              training env steps/s on uav_coverage through examples/models/encoders.py's
              FarmCnn scripts against the built-in cnn of the same layers; ratios from
              runs side by side (needs python3-torch to make the scripts)
  learning    every built-in env's config over seeds 1-3 at the references' step
              budgets: final and best 100-episode mean, steps and seconds to the
              target, farm-eval's deterministic mean (scripts/bench_learning.py;
              --learning-envs picks the envs, --plot-dir draws the seeds' curves)
  ranks       data-parallel learner ranks: 1 rank against 2 with the same workers
              (CartPole mlp, uav_coverage mlp and cnn): env steps/s, and the
              all-reduce's bytes, seconds and share per update
  mujoco      MuJoCo's tasks (configs/mujoco): the physics limit, env-only steps/s
              on one core, and PPO training at 2 and 16 workers (--mujoco-workers)
              beside the env-only rate of the same cores (--mujoco-tasks picks them)
  stragglers  learner.sync_fraction: 2 CartPole ranks, rank 1's worker held to a
              quarter of the time, without preemption and with sync_fraction 0.5
              over the same seeds: env steps/s, updates/s, rank 1's cut rollouts
"""
import argparse
import json
import os
import platform
import statistics
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = ["env", "transport", "inference", "training", "sweeps", "roofline", "scale", "python", "recurrent", "encoders",
         "learning", "ranks", "stragglers", "mujoco"]
SLOW_CASES = ("scale", "python", "encoders", "learning", "ranks", "stragglers", "mujoco")  # minutes each: run only when named
SCALE_WORKERS = [1, 2, 4, 8, 16, 32, 64]


def hold_back_worker(run_dir, launcher, index, run_s, stop_s):
    """Worker `index` of the run in run_dir runs run_s of every run_s + stop_s seconds until it (or the launcher)
    exits."""
    pid = None
    while launcher.poll() is None and pid is None:
        found = subprocess.run(["pgrep", "-f", f"farm-worker.*run_dir={run_dir} .*--index {index}( |$)"],
                               capture_output=True, text=True).stdout.split()
        pid = int(found[0]) if found else None
        time.sleep(0.1)
    while pid is not None and launcher.poll() is None:
        try:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(stop_s)
            os.kill(pid, signal.SIGCONT)
            time.sleep(run_s)
        except ProcessLookupError:
            return
    if pid is not None:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def python_with_worker_deps():
    """The interpreter the Python worker runs with here: $FARM_PYTHON, python3 or Debian's /usr/bin/python3, the
    first that imports zmq, google.protobuf and numpy (as tests/lib.sh farm_python)."""
    for py in [os.environ.get("FARM_PYTHON"), "python3", "/usr/bin/python3"]:
        if py and subprocess.run([py, "-c", "import zmq, google.protobuf, numpy"], capture_output=True).returncode == 0:
            return py
    raise RuntimeError("no python3 here imports zmq, google.protobuf and numpy "
                       "(apt-get install -y python3-zmq python3-protobuf python3-numpy)")


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


class Bench:
    def __init__(self, build_dir, quick):
        self.build = build_dir
        self.quick = quick
        self.repeats = 3
        self.bench_bin = os.path.join(build_dir, "bench", "farm-bench")

    def micro(self, *args, seconds):
        out = subprocess.run([self.bench_bin, "--seconds", str(seconds), *args], check=True,
                             capture_output=True, text=True).stdout
        return json.loads(out.strip().splitlines()[-1])

    def farm_run(self, config, workers, overrides, worker_stats=False, timeout=900, learners=1, throttle=None):
        """Runs scripts/farm run (with `learners` ranks); returns (summary of rank 0, metrics rows, worker stats list,
        wall seconds incl. start-up, launch time). throttle (index, run_s, stop_s): worker `index` runs run_s of
        every run_s + stop_s seconds (SIGSTOP, SIGCONT) until it exits: a straggler."""
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = os.path.join(tmp, "run")
            env = dict(os.environ, FARM_BUILD_DIR=self.build)
            if worker_stats:
                env["FARM_WORKER_STATS_DIR"] = tmp
            cmd = [os.path.join(ROOT, "scripts", "farm"), "run", config, "--workers", str(workers),
                   "--learners", str(learners), "--set", f"run_dir={run_dir}", "--set", "learner.progress_interval_s=3600"]
            for o in overrides:
                cmd += ["--set", o]
            launch = time.time()
            if throttle is None:
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            else:
                with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
                    holder = threading.Thread(target=hold_back_worker, args=(run_dir, p, *throttle), daemon=False)
                    holder.start()
                    out, err = p.communicate(timeout=timeout)
                    holder.join()
                    proc = subprocess.CompletedProcess(cmd, p.returncode, out, err)
            wall = time.time() - launch
            if proc.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
            summary = json.load(open(os.path.join(run_dir, "summary.json")))
            metrics = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
            stats = []
            if worker_stats:
                for name in sorted(os.listdir(tmp)):
                    if name.startswith("worker-") and name.endswith(".json"):
                        stats.append(json.load(open(os.path.join(tmp, name))))
            return summary, metrics, stats, wall, launch

    # ---------------------------------------------------------------- cases
    def env_only(self):
        s = 1 if self.quick else 2
        runs = [self.micro("env", "--num-envs", "1024", seconds=s) for _ in range(self.repeats)]
        return {"steps_per_second_per_core": median([r["steps_per_second"] for r in runs]), "runs": runs}

    def transport_only(self, workers=2, num_envs=2048):
        secs = 3 if self.quick else 5
        runs = []
        for _ in range(self.repeats):
            summary, _, stats, _, _ = self.farm_run(
                os.path.join(ROOT, "configs", "cartpole.yaml"), workers,
                ["learner.random_actions=true", f"env.num_envs={num_envs}", "total_env_steps=1000000000000",
                 f"max_wall_seconds={secs}", "stop_at_target=false"], worker_stats=True)
            runs.append({"sps": summary["sps"],
                         "round_trip_us_p50": median([w["round_trip_us_p50"] for w in stats]),
                         "round_trip_us_p99": max(w["round_trip_us_p99"] for w in stats),
                         "worker_max_rss_mb": max(w["max_rss_mb"] for w in stats),
                         "batch_time": summary["time_seconds"]})
        return {"workers": workers, "envs_per_worker": num_envs,
                "env_steps_per_second": median([r["sps"] for r in runs]),
                "round_trip_us_p50": median([r["round_trip_us_p50"] for r in runs]),
                "round_trip_us_p99": median([r["round_trip_us_p99"] for r in runs]),
                "worker_max_rss_mb": max(r["worker_max_rss_mb"] for r in runs), "runs": runs}

    def inference(self, batch=1024):
        s = 1 if self.quick else 2
        pairs = []
        for _ in range(self.repeats):
            fwd = self.micro("forward", "--batch", str(batch), seconds=s)
            srv = self.micro("serve", "--batch", str(batch), seconds=s)
            pairs.append({"forward_rows_per_second": fwd["rows_per_second"],
                          "served_rows_per_second": srv["rows_per_second"],
                          "ratio": srv["rows_per_second"] / fwd["rows_per_second"]})
        return {"batch": batch, "forward_rows_per_second": median([p["forward_rows_per_second"] for p in pairs]),
                "served_rows_per_second": median([p["served_rows_per_second"] for p in pairs]),
                "ratio": median([p["ratio"] for p in pairs]), "runs": pairs}

    def training(self, workers):
        config = os.path.join(ROOT, "configs", "cartpole_fast.yaml")
        runs = []
        for seed in range(1, self.repeats + 1):
            summary, metrics, stats, wall, launch = self.farm_run(config, workers, [f"seed={seed}"],
                                                                 worker_stats=True)
            solved_unix = summary.get("solved_at_unix")
            rss = [m["rss_mb"] for m in metrics if m.get("rss_mb")]
            runs.append({
                "seed": seed, "sps": summary["sps"], "env_steps": summary["env_steps"],
                "mean_return_100": summary["mean_return_100"], "solved_at_steps": summary["solved_at_steps"],
                "solved_at_seconds": summary["solved_at_seconds"],
                "time_to_solve_incl_start_s": (solved_unix - launch) if solved_unix else None,
                "wall_incl_start_s": wall, "time_seconds": summary["time_seconds"],
                "learner_rss_mb_first": rss[0] if rss else None, "learner_rss_mb_last": rss[-1] if rss else None,
                "learner_max_rss_mb": summary.get("max_rss_mb"),
                "worker_max_rss_mb": max((w["max_rss_mb"] for w in stats), default=None),
                "updates": summary["updates"], "device": summary.get("device"),
                "torch_version": summary.get("torch_version")})
        return {"config": "configs/cartpole_fast.yaml", "workers": workers,
                "sps": median([r["sps"] for r in runs]),
                "mean_return_100": median([r["mean_return_100"] for r in runs]),
                "time_to_solve_incl_start_s": median([r["time_to_solve_incl_start_s"] for r in runs]),
                "solved_runs": sum(1 for r in runs if r["solved_at_steps"] is not None),
                "runs": runs}

    def encoders(self, workers):
        """A TorchScript encoder's cost against the built-in one of the same layers: uav_coverage with the farm's
        cnn written in PyTorch (examples/models/encoders.py; features 128, then the trunk [128]) against
        ppo.encoder cnn with hidden_sizes [128, 128], pairs run side by side (the order alternating by seed)."""
        secs = 25 if self.quick else 60
        torch_py = next((py for py in ("python3", "/usr/bin/python3")
                         if subprocess.run([py, "-c", "import torch"], capture_output=True).returncode == 0), None)
        if torch_py is None:
            raise RuntimeError("the encoders case needs a python3 that imports torch (apt-get install python3-torch)")
        uav = os.path.join(ROOT, "configs", "uav_coverage.yaml")
        base = ["stop_at_target=false", "total_env_steps=1000000000000", f"max_wall_seconds={secs}",
                "learner.checkpoint_every=0"]
        pairs = []
        with tempfile.TemporaryDirectory() as tmp:
            scripts = {}
            for name, shape in (("actor", ["5", "7", "7"]), ("critic", ["3", "32", "32"])):
                scripts[name] = os.path.join(tmp, f"{name}.pt")
                subprocess.run([torch_py, os.path.join(ROOT, "examples", "models", "encoders.py"), "cnn", "--shape",
                                *shape, "--features", "128", "--out", scripts[name]], check=True, capture_output=True)
            variants = {"builtin": ["ppo.encoder=cnn", "ppo.hidden_sizes=[128, 128]"],
                        "scripted": [f"ppo.actor_encoder_script={scripts['actor']}",
                                     f"ppo.critic_encoder_script={scripts['critic']}", "ppo.hidden_sizes=[128]"]}
            for seed in range(1, self.repeats + 1):
                row = {}
                order = ("builtin", "scripted") if seed % 2 else ("scripted", "builtin")
                for name in order:
                    summary, _, _, _, _ = self.farm_run(uav, workers, base + [f"seed={seed}"] + variants[name])
                    row[name] = {"sps": summary["sps"], "update_seconds": summary["time_seconds"]["update"],
                                 "updates": summary["updates"], "wall_seconds": summary["wall_seconds"]}
                row["ratio"] = row["scripted"]["sps"] / row["builtin"]["sps"]
                pairs.append(row)
                for r in (row["builtin"], row["scripted"]):
                    r["seconds_per_update"] = r["update_seconds"] / r["updates"] if r["updates"] else None
                log(f"encoders seed {seed}: built-in cnn {row['builtin']['sps']:.0f}, scripted "
                    f"{row['scripted']['sps']:.0f} env steps/s ({row['ratio']:.2f}x); per update "
                    f"{row['builtin']['seconds_per_update'] or 0:.1f} s and {row['scripted']['seconds_per_update'] or 0:.1f} s")
        return {"config": "configs/uav_coverage.yaml, cnn", "workers": workers, "seconds": secs,
                "sps_builtin": median([r["builtin"]["sps"] for r in pairs]),
                "sps_scripted": median([r["scripted"]["sps"] for r in pairs]),
                "ratio": median([r["ratio"] for r in pairs]), "runs": pairs}

    def recurrent(self, workers):
        """A GRU's cost against the same settings without a core: training and serving, pairs run side by side."""
        secs = 6 if self.quick else 12
        fast = os.path.join(ROOT, "configs", "cartpole_fast.yaml")
        base = ["env.name=CartPoleNoVel-v1", "stop_at_target=false", "total_env_steps=1000000000000",
                f"max_wall_seconds={secs}"]
        gru = ["ppo.core=gru", "ppo.core_size=64", "ppo.bptt=8"]
        train_pairs, serve_pairs = [], []
        for seed in range(1, self.repeats + 1):
            row = {}
            for name, extra in (("none", []), ("gru", gru)):
                summary, _, _, _, _ = self.farm_run(fast, workers, base + [f"seed={seed}"] + extra)
                row[name] = {"sps": summary["sps"], "update_seconds": summary["time_seconds"]["update"],
                             "updates": summary["updates"], "wall_seconds": summary["wall_seconds"]}
            row["ratio"] = row["gru"]["sps"] / row["none"]["sps"]
            train_pairs.append(row)
            log(f"recurrent training seed {seed}: {row['none']['sps']:.0f} -> {row['gru']['sps']:.0f} env steps/s "
                f"({row['ratio']:.2f}x)")
        novel = os.path.join(ROOT, "configs", "cartpole_novel.yaml")
        for _ in range(self.repeats):
            row = {}
            for name, extra in (("mlp", ["ppo.core=none"]), ("gru", [])):
                sets = []
                for o in extra:
                    sets += ["--set", o]
                r = self.micro("serve", "--config", novel, "--batch", "1024", "--envs", "1024", *sets,
                               seconds=2 if self.quick else 4)
                row[name] = r["rows_per_second"]
            row["ratio"] = row["gru"] / row["mlp"]
            serve_pairs.append(row)
            log(f"recurrent serving: {row['mlp']:.0f} -> {row['gru']:.0f} rows/s ({row['ratio']:.2f}x)")
        return {"training": {"config": "configs/cartpole_fast.yaml on CartPoleNoVel-v1", "workers": workers,
                             "seconds": secs, "sps_none": median([r["none"]["sps"] for r in train_pairs]),
                             "sps_gru": median([r["gru"]["sps"] for r in train_pairs]),
                             "ratio": median([r["ratio"] for r in train_pairs]), "runs": train_pairs},
                "serving": {"config": "configs/cartpole_novel.yaml", "batch": 1024,
                            "rows_per_second_mlp": median([r["mlp"] for r in serve_pairs]),
                            "rows_per_second_gru": median([r["gru"] for r in serve_pairs]),
                            "ratio": median([r["ratio"] for r in serve_pairs]), "runs": serve_pairs}}

    def sweeps(self):
        worker_counts = [1, 2, 4, 8]
        env_counts = [16, 64, 256, 1024]
        secs = 1.5 if self.quick else 3
        table = []
        for w in worker_counts:
            for e in env_counts:
                summary, _, _, _, _ = self.farm_run(
                    os.path.join(ROOT, "configs", "cartpole.yaml"), w,
                    ["learner.train=false", f"env.num_envs={e}", "total_env_steps=1000000000000",
                     f"max_wall_seconds={secs}", "stop_at_target=false"])
                table.append({"workers": w, "envs_per_worker": e, "sps": summary["sps"],
                              "batch_rows_avg": summary.get("batch_rows_avg")})
                log(f"sweep workers={w} envs={e}: {summary['sps']:.0f} steps/s")
        return {"mode": "acting with the policy (learner.train=false)", "table": table}

    def env_limit(self, env, num_envs, processes, seconds):
        """env steps/s of `processes` farm-bench env processes at once (one per core at most), summed: what this
        machine's cores step of the env with no learner and no transport."""
        procs = [subprocess.Popen([self.bench_bin, "--seconds", str(seconds), "env", "--env", env, "--num-envs",
                                   str(num_envs)], stdout=subprocess.PIPE, text=True) for _ in range(processes)]
        rates = []
        for p in procs:
            out, _ = p.communicate()
            rates.append(json.loads(out.strip().splitlines()[-1]))
        return {"env_steps_per_second": sum(r["steps_per_second"] for r in rates),
                "agent_steps_per_second": sum(r["agent_steps_per_second"] for r in rates), "processes": processes}

    def mujoco(self, tasks, worker_counts):
        """MuJoCo's tasks: the physics limit (env-only steps/s of one process on one core: mj_step through the env,
        in-process) and end-to-end training (configs/mujoco/TASK.yaml, PPO updating) at each worker count, beside the
        env-only rate of the same cores (one env-only process per core the workers use)."""
        cores = os.cpu_count() or 1
        secs = 8 if self.quick else 20
        rows = []
        for task in tasks:
            config = os.path.join(ROOT, "configs", "mujoco", f"{task}.yaml")
            env = self.config_env(config)
            one = [self.env_limit(env, 16, 1, 2 if self.quick else 3)["env_steps_per_second"] for _ in range(self.repeats)]
            row = {"task": task, "env": env, "env_only_steps_per_second_per_core": statistics.median(one),
                   "env_only_runs": one, "training": []}
            log(f"mujoco {env}: env-only {row['env_only_steps_per_second_per_core']:,.0f} steps/s on one core")
            for w in worker_counts:
                processes = min(w, cores)
                limit = self.env_limit(env, max(1, 4 * w // processes), processes, 2 if self.quick else 3)
                summary, _, _, _, _ = self.farm_run(config, w, ["total_env_steps=1000000000000",
                                                                f"max_wall_seconds={secs}"], timeout=secs + 300)
                point = {"workers": w, "env_steps_per_second": summary["sps"],
                         "env_only_steps_per_second": limit["env_steps_per_second"],
                         "fraction_of_env_only": summary["sps"] / limit["env_steps_per_second"],
                         "updates": summary["updates"], "device": summary.get("device")}
                row["training"].append(point)
                log(f"mujoco {env} workers={w}: {point['env_steps_per_second']:,.0f} env steps/s training, env-only "
                    f"{point['env_only_steps_per_second']:,.0f} on {processes} cores "
                    f"(fraction {point['fraction_of_env_only']:.2f}), {point['updates']} updates")
            rows.append(row)
        return {"cores": cores, "seconds": secs, "table": rows}

    @staticmethod
    def config_env(config):
        """env.name of a config file (the farm's configs put it on one `  name:` line under `env:`)."""
        section = None
        for line in open(config):
            if line and not line[0].isspace() and line.rstrip().endswith(":"):
                section = line.strip()[:-1]
            elif section == "env" and line.strip().startswith("name:"):
                return line.split(":", 1)[1].split("#")[0].strip()
        raise RuntimeError(f"{config}: no env.name")

    def scale(self, gpu):
        """Workers 1..64 for CartPole and uav_coverage on this machine (issue: the workload at workstation scale)."""
        cores = os.cpu_count() or 1
        workloads = [
            ("cartpole", os.path.join(ROOT, "configs", "cartpole_fast.yaml"), "CartPole-v1", 96,
             ["stop_at_target=false"], 6 if self.quick else 10),
            ("uav_coverage_mlp", os.path.join(ROOT, "configs", "uav_coverage.yaml"), "uav_coverage", 8,
             ["ppo.encoder=mlp"], 15 if self.quick else 30),
        ]
        if gpu:
            workloads.append(("uav_coverage_cnn", os.path.join(ROOT, "configs", "uav_coverage.yaml"), "uav_coverage",
                              8, ["ppo.encoder=cnn", "learner.device=cuda"], 15 if self.quick else 30))
        table = []
        for name, config, env, envs_per_worker, extra, secs in workloads:
            for w in SCALE_WORKERS:
                processes = min(w, cores)
                # The env-only limit of the same cores: min(workers, cores) processes stepping as many envs as the
                # workers of this point hold, split among them.
                limit = self.env_limit(env, max(1, envs_per_worker * w // processes), processes, 2 if self.quick else 3)
                table.append(self.scale_point(name, config, envs_per_worker, extra, secs, w, limit))
        return {"cores": cores, "gpu": gpu, "table": table}

    def scale_point(self, name, config, envs_per_worker, extra, secs, w, limit):
        """One run of `w` workers for `secs` seconds; its row (or an error row)."""
        try:
            summary, _, stats, wall, launch = self.farm_run(
                config, w, extra + ["total_env_steps=1000000000000", f"max_wall_seconds={secs}"],
                worker_stats=True, timeout=secs + 300)
        except RuntimeError as e:
            log(f"scale {name} workers={w}: failed: {e}")
            return {"workload": name, "workers": w, "error": str(e)[-500:]}
        row = {"workload": name, "workers": w, "envs_per_worker": envs_per_worker, "seconds": secs,
               "env_steps_per_second": summary["sps"], "agent_steps_per_second": summary["agent_sps"],
               "env_only_steps_per_second": limit["env_steps_per_second"],
               "ratio_to_env_only": summary["sps"] / limit["env_steps_per_second"],
               "last_join_seconds": summary.get("last_join_seconds"),
               "learner_max_rss_mb": summary.get("max_rss_mb"), "store_bytes": summary.get("store_bytes"),
               "workers_lost": summary.get("workers_lost"), "rejoins": summary.get("rejoins"),
               "connections_closed": summary.get("connections_closed"),
               "worker_reconnects": sum(s.get("reconnects", 0) for s in stats),
               "updates": summary["updates"], "batch_rows_avg": summary.get("batch_rows_avg"),
               "device": summary.get("device"), "time_seconds": summary["time_seconds"]}
        t = row["time_seconds"]
        log(f"scale {name} workers={w}: {row['env_steps_per_second']:,.0f} env steps/s "
            f"({row['agent_steps_per_second']:,.0f} agent), env-only {row['env_only_steps_per_second']:,.0f} "
            f"(ratio {row['ratio_to_env_only']:.2f}), last join {row['last_join_seconds']:.1f} s, RSS "
            f"{row['learner_max_rss_mb']:.0f} MiB, lost {row['workers_lost']}, rejoins {row['rejoins']}; "
            f"held {t['held_for_update']:.1f} s, forward {t['forward']:.1f} s of {t['total']:.1f} s")
        return row

    def ranks(self, gpu):
        """Data-parallel learner ranks: 1 rank against 2 with the same workers, for CartPole's mlp, uav_coverage's mlp
        and its cnn (centralised critic): env steps/s, and at 2 ranks the collectives' bytes, seconds and share per
        update (summary.json's `ranks`). On a CPU machine the ranks share its cores with the workers."""
        cores = os.cpu_count() or 1
        secs = 20 if self.quick else 45
        device = ["learner.device=cuda"] if gpu else []
        workloads = [
            ("cartpole_mlp", os.path.join(ROOT, "configs", "cartpole.yaml"), 2, ["stop_at_target=false"]),
            ("uav_coverage_mlp", os.path.join(ROOT, "configs", "uav_coverage.yaml"), 4, ["ppo.encoder=mlp"]),
            ("uav_coverage_cnn", os.path.join(ROOT, "configs", "uav_coverage.yaml"), 4, ["ppo.encoder=cnn"]),
        ]
        table = []
        for name, config, workers, extra in workloads:
            for learners in (1, 2):
                threads = max(1, cores // learners) if not gpu else 1
                overrides = extra + device + ["total_env_steps=1000000000000", f"max_wall_seconds={secs}",
                                              f"learner.threads={threads}"]
                runs = []
                for _ in range(self.repeats):
                    try:
                        summary, _, _, _, _ = self.farm_run(config, workers, overrides, timeout=secs + 300,
                                                            learners=learners)
                    except RuntimeError as e:
                        log(f"ranks {name} learners={learners}: failed: {e}")
                        continue
                    wall = summary["wall_seconds"]
                    if learners == 1:
                        t = summary["time_seconds"]
                        updates = max(1, summary["updates"])
                        runs.append({"env_steps_per_second": summary["sps"], "updates": summary["updates"],
                                     "update_seconds_per_update": t["update"] / updates,
                                     "allreduce_bytes_per_update": 0.0, "allreduce_seconds_per_update": 0.0,
                                     "allreduce_share_of_update": 0.0, "update_path": summary["update_path"]})
                    else:
                        per = summary["ranks"]
                        runs.append({"env_steps_per_second": summary["env_steps_all_ranks"] / wall,
                                     "updates": summary["updates"],
                                     "update_seconds_per_update": median([r["update_seconds_per_update"] for r in per]),
                                     "allreduce_bytes_per_update": median([r["allreduce_bytes_per_update"] for r in per]),
                                     "allreduce_seconds_per_update":
                                         median([r["allreduce_seconds_per_update"] for r in per]),
                                     "allreduce_share_of_update": median([r["allreduce_share_of_update"] for r in per]),
                                     "update_path": summary["update_path"], "backend": summary.get("dist_backend")})
                if not runs:
                    table.append({"workload": name, "learners": learners, "error": "every run failed"})
                    continue
                row = {"workload": name, "learners": learners, "workers": workers, "seconds": secs,
                       "learner_threads": threads, "runs": runs}
                for key in ("env_steps_per_second", "update_seconds_per_update", "allreduce_bytes_per_update",
                            "allreduce_seconds_per_update", "allreduce_share_of_update"):
                    row[key] = median([r[key] for r in runs])
                row["update_path"] = runs[0]["update_path"]
                table.append(row)
                log(f"ranks {name} learners={learners}: {row['env_steps_per_second']:,.0f} env steps/s, update "
                    f"{row['update_seconds_per_update'] * 1e3:.1f} ms ({row['update_path']}), all-reduce "
                    f"{row['allreduce_bytes_per_update'] / 1e6:.2f} MB and {row['allreduce_seconds_per_update'] * 1e3:.1f}"
                    f" ms per update ({100 * row['allreduce_share_of_update']:.0f} %)")
        for name, _, _, _ in workloads:
            one = next((r for r in table if r["workload"] == name and r["learners"] == 1 and "error" not in r), None)
            two = next((r for r in table if r["workload"] == name and r["learners"] == 2 and "error" not in r), None)
            if one and two:
                two["speedup_over_one_rank"] = two["env_steps_per_second"] / one["env_steps_per_second"]
        return {"cores": cores, "gpu": gpu, "table": table}

    def stragglers(self):
        """learner.sync_fraction, DD-PPO's preemption of stragglers: CartPole at 2 ranks x 1 worker, rank 1's worker
        held to a quarter of the time (10 ms of every 40), without preemption and with sync_fraction 0.5, the same
        seeds: env steps/s over both ranks, updates/s, and how rank 1's rollouts were cut. A short update (2 epochs)
        and rollouts of 128 steps, so that collecting, not updating, is what the straggler slows."""
        secs = 15 if self.quick else 25
        table = []
        for fraction in (0.0, 0.5):
            runs = []
            for seed in range(1, self.repeats + 1):
                overrides = ["stop_at_target=false", "total_env_steps=1000000000000", f"max_wall_seconds={secs}",
                             f"seed={seed}", "ppo.update_epochs=2", "ppo.rollout_length=128",
                             f"learner.sync_fraction={fraction}", "learner.threads=1"]
                try:
                    summary, _, _, _, _ = self.farm_run(os.path.join(ROOT, "configs", "cartpole.yaml"), 2, overrides,
                                                        timeout=secs + 300, learners=2, throttle=(1, 0.01, 0.03))
                except RuntimeError as e:
                    log(f"stragglers sync_fraction={fraction}: failed: {e}")
                    continue
                wall = summary["wall_seconds"]
                r1 = summary["ranks"][1]
                runs.append({"seed": seed, "env_steps_per_second": summary["env_steps_all_ranks"] / wall,
                             "updates_per_second": summary["updates"] / wall,
                             "rank1_cut_share": r1["cut_rollouts"] / max(1.0, r1["rollouts"]),
                             "rank1_cut_mean_length": r1["cut_mean_length"],
                             "rank_sps": [r["sps"] for r in summary["ranks"]]})
            if not runs:
                table.append({"sync_fraction": fraction, "error": "every run failed"})
                continue
            row = {"sync_fraction": fraction, "seconds": secs, "runs": runs}
            for key in ("env_steps_per_second", "updates_per_second", "rank1_cut_share", "rank1_cut_mean_length"):
                row[key] = median([r[key] for r in runs])
            table.append(row)
            log(f"stragglers sync_fraction={fraction}: {row['env_steps_per_second']:,.0f} env steps/s, "
                f"{row['updates_per_second']:.2f} updates/s, rank 1's rollouts cut {100 * row['rank1_cut_share']:.0f} %"
                f" (mean length {row['rank1_cut_mean_length']:.1f} of 128)")
        if len(table) == 2 and all("error" not in r for r in table):
            table[1]["speedup"] = table[1]["env_steps_per_second"] / table[0]["env_steps_per_second"]
        return {"table": table}

    def learning(self, envs, plot_dir):
        """scripts/bench_learning.py: its JSON, and its printed table to show under this suite's."""
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "learning.json")
            cmd = [sys.executable, os.path.join(ROOT, "scripts", "bench_learning.py"), "--build-dir", self.build,
                   "--out", out]
            if envs:
                cmd += ["--envs", envs]
            if plot_dir:
                cmd += ["--plot-dir", plot_dir]
            if self.quick:
                cmd += ["--seeds", "1"]
            table = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
            result = json.load(open(out))
        result["table"] = table.split("\n", 2)[-1] if table.startswith("\n") else table
        return result

    def python(self):
        """The Python worker: its own cost per env step on the pure and the numpy path (no learner), then the numpy
        multi-UAV example (examples/python/uav_coverage.yaml, env.python) at 1..64 workers against the env-only
        limit of the same cores (the env stepped alone by min(workers, cores) Python processes)."""
        py = python_with_worker_deps()
        helper = os.path.join(ROOT, "scripts", "bench_python.py")
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        s = 1 if self.quick else 2
        runs = [json.loads(subprocess.run([py, helper, "paths", str(s)], check=True, capture_output=True, text=True,
                                          env=env).stdout.strip().splitlines()[-1]) for _ in range(self.repeats)]
        paths = {}
        for key in runs[0]:
            if isinstance(runs[0][key], dict):
                paths[key] = {"us_per_env_step": median([r[key]["us_per_env_step"] for r in runs]),
                              "bytes_per_env_step": runs[0][key]["bytes_per_env_step"]}
            else:
                paths[key] = median([r[key] for r in runs])
        log("python paths (us per env step): " + ", ".join(
            f"{k} {v['us_per_env_step']:.1f}" for k, v in paths.items() if isinstance(v, dict)))
        cores = os.cpu_count() or 1
        config = os.path.join(ROOT, "examples", "python", "uav_coverage.yaml")
        secs = 15 if self.quick else 30
        table = []
        for w in SCALE_WORKERS:
            processes = min(w, cores)
            procs = [subprocess.Popen([py, helper, "env", str(2 if self.quick else 3)], stdout=subprocess.PIPE,
                                      text=True, env=env) for _ in range(processes)]
            rate = sum(json.loads(p.communicate()[0].strip().splitlines()[-1])["env_steps_per_second"] for p in procs)
            limit = {"env_steps_per_second": rate, "processes": processes}
            table.append(self.scale_point("uav_coverage_np", config, 8, [f"env.python_interpreter={py}"], secs, w,
                                          limit))
        return {"cores": cores, "python": py, "paths": paths, "table": table}

    def roofline(self, training_sps):
        """The training rate against a compute ceiling: FLOPs per env step (counted from the config's model and PPO
        settings) against the machine's peak FLOP/s. The peak is the larger of (a) the best measured fp32 matrix
        product over n = 512, 1024, 2048 on every core through LibTorch's BLAS, and (b) the CPU's nominal fp32 peak,
        cores x clock x FLOPs per cycle from /proc/cpuinfo (FMA width from its flags). (a) alone undercounts on a
        machine whose BLAS is the reference one (several times slower), while the fused PPO update uses its own
        kernels, not BLAS: a training rate above such a ceiling is what that looked like."""
        s = 1 if self.quick else 2
        flops = self.micro("flops", "--config", os.path.join(ROOT, "configs", "cartpole_fast.yaml"), seconds=s)
        cores = os.cpu_count() or 1
        gemm = []
        for n in (512, 1024, 2048):
            runs = [self.micro("matmul", "--threads", str(cores), "--n", str(n), seconds=s) for _ in range(self.repeats)]
            gemm.append({"n": n, "gflops": median([r["gflops"] for r in runs]), "blas": runs[0].get("blas"),
                         "blas_kernel": runs[0].get("blas_kernel")})
        gemm_peak = max(g["gflops"] for g in gemm)
        nominal = nominal_cpu_peak_gflops(cores)
        peak = max(gemm_peak, nominal["gflops"] or 0)
        ceiling = peak * 1e9 / flops["flops_per_env_step"]
        fraction = training_sps / ceiling if training_sps else None
        if fraction is not None and fraction > 1:
            log(f"roofline: a training rate {fraction:.2f}x the ceiling cannot be: the FLOP count or the peak is wrong")
        return {"flops_per_env_step": flops["flops_per_env_step"], "forward_flops": flops["forward_flops"],
                "gemm": gemm, "blas": gemm[0]["blas"], "blas_kernel": gemm[0]["blas_kernel"], "gemm_peak_gflops": gemm_peak, "nominal": nominal, "peak_gflops": peak,
                "threads": cores, "ceiling_sps": ceiling, "training_sps": training_sps,
                "fraction_of_ceiling": fraction}


def nominal_cpu_peak_gflops(cores):
    """cores x MHz x fp32 FLOPs per cycle (2 FMA pipes: 64 with AVX-512, 32 with AVX2+FMA, 16 with AVX, 8
    otherwise), read from /proc/cpuinfo; None where it cannot be read."""
    mhz, flags = None, set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("cpu MHz") and mhz is None:
                mhz = float(line.split(":", 1)[1])
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    per_cycle = 64 if "avx512f" in flags else 32 if {"avx2", "fma"} <= flags else 16 if "avx" in flags else 8
    gflops = cores * mhz * 1e6 * per_cycle / 1e9 if mhz else None
    return {"gflops": gflops, "mhz": mhz, "flops_per_cycle": per_cycle, "cores": cores}


def print_scale_rows(table, fmt):
    """The rows of a scale table (scale and python cases), one line each."""
    for row in table:
        if "error" in row:
            print(f"    {row['workload']:<18} {row['workers']:>4}  failed")
            continue
        print(f"    {row['workload']:<18} {row['workers']:>4} {fmt(row['env_steps_per_second']):>12} "
              f"{fmt(row['agent_steps_per_second']):>14} {fmt(row['env_only_steps_per_second']):>10} "
              f"{row['ratio_to_env_only']:>8.2f} {row['last_join_seconds']:>9.1f} "
              f"{fmt(row['learner_max_rss_mb']):>8} {row['workers_lost']:>5}")


def plot_scale(scale, png):
    """env steps/s against workers, a line per workload and its env-only limit (gnuplot, PNG)."""
    rows = [r for r in scale["table"] if "error" not in r]
    workloads = sorted({r["workload"] for r in rows})
    with tempfile.TemporaryDirectory() as tmp:
        plots = []
        for i, name in enumerate(workloads):
            data = os.path.join(tmp, f"{name}.dat")
            with open(data, "w") as f:
                for r in sorted((r for r in rows if r["workload"] == name), key=lambda r: r["workers"]):
                    f.write(f"{r['workers']} {r['env_steps_per_second']} {r['env_only_steps_per_second']}\n")
            plots.append(f"'{data}' using 1:2 with linespoints lw 2 lc {i + 1} title '{name}: training'")
            plots.append(f"'{data}' using 1:3 with lines dt 2 lc {i + 1} title '{name}: env only'")
        script = "\n".join([
            "set terminal pngcairo size 900,560", f"set output '{png}'",
            f"set title 'Rollout Farm: env steps/s against workers ({scale['cores']} cores{', GPU' if scale['gpu'] else ''})'",
            "set xlabel 'workers'", "set ylabel 'env steps/s'", "set logscale x 2", "set logscale y",
            "set key outside right", "set grid", "set termoption noenhanced", "plot " + ", ".join(plots)])
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
    log(f"plot written: {png}")


def machine():
    model = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cores": os.cpu_count(), "cpu_model": model, "platform": platform.platform()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--quick", action="store_true", help="shorter cases, fewer sweep seconds")
    ap.add_argument("--out", default="bench.json", help="JSON output file")
    ap.add_argument("--cases", default=",".join(c for c in CASES if c not in SLOW_CASES), metavar="LIST",
                    help="comma-separated subset of " + ",".join(CASES) + " (default: %(default)s; "
                         + ", ".join(SLOW_CASES) + " take minutes, so they run only when named)")
    ap.add_argument("--gpu", action="store_true", help="scale: add uav_coverage with the cnn encoder on cuda")
    ap.add_argument("--plot", metavar="FILE.png", help="scale: draw env steps/s against workers (gnuplot)")
    ap.add_argument("--learning-envs", metavar="LIST",
                    help="learning: the envs (default: scripts/bench_learning.py's, the classic control envs)")
    ap.add_argument("--mujoco-tasks", metavar="LIST", default="half_cheetah,hopper,walker2d,ant,humanoid,swimmer,"
                    "inverted_pendulum,inverted_double_pendulum,reacher",
                    help="mujoco: the configs/mujoco/TASK.yaml to measure (default: all)")
    ap.add_argument("--mujoco-workers", metavar="LIST", default="2,16",
                    help="mujoco: the worker counts of the training runs (default: 2,16)")
    ap.add_argument("--plot-dir", metavar="DIR", help="learning: draw DIR/learning-ENV.png, the seeds' curves")
    args = ap.parse_args()
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"--cases: unknown case(s) {', '.join(unknown)}; expected a comma-separated subset of "
                 f"{','.join(CASES)}")
    b = Bench(args.build_dir, args.quick)
    result = {"machine": machine(), "quick": args.quick, "repeats": b.repeats}
    workers = os.cpu_count() or 1
    if "env" in cases:
        log("env-only")
        result["env_only"] = b.env_only()
    if "transport" in cases:
        log("transport-only")
        result["transport_only"] = b.transport_only()
    if "inference" in cases:
        log("inference")
        result["inference"] = b.inference()
    if "training" in cases:
        log("training")
        result["training"] = b.training(workers)
        result["machine"]["device"] = result["training"]["runs"][0]["device"]
        result["machine"]["torch_version"] = result["training"]["runs"][0]["torch_version"]
    if "sweeps" in cases:
        log("sweeps")
        result["sweeps"] = b.sweeps()
    if "roofline" in cases:
        log("roofline")
        result["roofline"] = b.roofline(result.get("training", {}).get("sps"))
    if "scale" in cases:
        log("scale")
        result["scale"] = b.scale(gpu=args.gpu)
        if args.plot:
            plot_scale(result["scale"], args.plot)
    if "python" in cases:
        log("python")
        result["python"] = b.python()
    if "ranks" in cases:
        log("ranks")
        result["ranks"] = b.ranks(gpu=args.gpu)
    if "stragglers" in cases:
        log("stragglers")
        result["stragglers"] = b.stragglers()
    if "recurrent" in cases:
        log("recurrent")
        result["recurrent"] = b.recurrent(workers)
    if "encoders" in cases:
        log("encoders")
        result["encoders"] = b.encoders(workers)
    if "mujoco" in cases:
        log("mujoco")
        result["mujoco"] = b.mujoco(args.mujoco_tasks.split(","), [int(w) for w in args.mujoco_workers.split(",")])
    if "learning" in cases:
        log("learning")
        result["learning"] = b.learning(args.learning_envs, args.plot_dir)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)

    def fmt(v, spec=",.0f"):
        return "-" if v is None else format(v, spec)

    print(f"\nRollout Farm benchmark ({result['machine']['cores']} cores, {result['machine']['cpu_model']})")
    if "env_only" in result:
        print(f"  env-only          CartPole steps/s per core     {fmt(result['env_only']['steps_per_second_per_core'])}")
    if "transport_only" in result:
        t = result["transport_only"]
        print(f"  transport-only    env steps/s ({t['workers']} workers)    {fmt(t['env_steps_per_second'])}   "
              f"round trip p50 {fmt(t['round_trip_us_p50'], '.0f')} us, p99 {fmt(t['round_trip_us_p99'], '.0f')} us")
    if "inference" in result:
        i = result["inference"]
        print(f"  inference         served rows/s @{i['batch']}          {fmt(i['served_rows_per_second'])}   "
              f"plain forward {fmt(i['forward_rows_per_second'])}  ratio {fmt(i['ratio'], '.2f')}")
    if "recurrent" in result:
        r = result["recurrent"]
        t, v = r["training"], r["serving"]
        print(f"  recurrent         training env steps/s, GRU 64  {fmt(t['sps_gru'])}   no core {fmt(t['sps_none'])}  "
              f"ratio {fmt(t['ratio'], '.2f')}")
        print(f"  recurrent         served rows/s @{v['batch']}, GRU    {fmt(v['rows_per_second_gru'])}   mlp "
              f"{fmt(v['rows_per_second_mlp'])}  ratio {fmt(v['ratio'], '.2f')}")
    if "encoders" in result:
        e = result["encoders"]
        print(f"  encoders          training env steps/s, scripted cnn {fmt(e['sps_scripted'])}   built-in "
              f"{fmt(e['sps_builtin'])}  ratio {fmt(e['ratio'], '.2f')}")
    if "training" in result:
        t = result["training"]
        print(f"  training          env steps/s                   {fmt(t['sps'])}   mean return "
              f"{fmt(t['mean_return_100'], '.1f')}, solved {t['solved_runs']}/{len(t['runs'])}, time to solve "
              f"(incl. start) {fmt(t['time_to_solve_incl_start_s'], '.2f')} s")
        r0 = t["runs"][0]
        print(f"  memory            worker max RSS {fmt(r0['worker_max_rss_mb'], '.1f')} MiB, learner RSS "
              f"{fmt(r0['learner_rss_mb_first'], '.1f')} -> {fmt(r0['learner_rss_mb_last'], '.1f')} MiB")
    if "roofline" in result:
        r = result["roofline"]
        print(f"  roofline          {fmt(r['flops_per_env_step'])} FLOP/step, peak {fmt(r['peak_gflops'], '.1f')} "
              f"GFLOP/s (matmul best {fmt(r['gemm_peak_gflops'], '.1f')} via {r['blas']}"
              f"{', kernel ' + r['blas_kernel'] if r.get('blas_kernel') else ''}, nominal "
              f"{fmt(r['nominal']['gflops'], '.1f')}) -> ceiling {fmt(r['ceiling_sps'])} steps/s; training at "
              f"{fmt(r['fraction_of_ceiling'], '.1%')}")
    if "sweeps" in result:
        envs = sorted({row["envs_per_worker"] for row in result["sweeps"]["table"]})
        print("  sweep (acting, steps/s)   envs/worker: " + "".join(f"{e:>10}" for e in envs))
        for w in sorted({row["workers"] for row in result["sweeps"]["table"]}):
            cells = {row["envs_per_worker"]: row["sps"] for row in result["sweeps"]["table"] if row["workers"] == w}
            print(f"    workers {w:<3}                      " + "".join(f"{fmt(cells.get(e)):>10}" for e in envs))
    if "scale" in result:
        print("  scale             workers  env steps/s  agent steps/s  env-only    ratio  last join  RSS MiB  lost")
        print_scale_rows(result["scale"]["table"], fmt)
    if "ranks" in result:
        print("  ranks             learners  env steps/s  speed-up  update ms  all-reduce MB  ms / update  share")
        for row in result["ranks"]["table"]:
            if "error" in row:
                print(f"    {row['workload']:<18} {row['learners']:>3}  failed")
                continue
            print(f"    {row['workload']:<18} {row['learners']:>3} {fmt(row['env_steps_per_second']):>12} "
                  f"{row.get('speedup_over_one_rank', 1.0):>9.2f} {row['update_seconds_per_update'] * 1e3:>10.1f} "
                  f"{row['allreduce_bytes_per_update'] / 1e6:>14.2f} {row['allreduce_seconds_per_update'] * 1e3:>12.1f} "
                  f"{100 * row['allreduce_share_of_update']:>5.0f} %")
    if "stragglers" in result:
        print("  stragglers        sync_fraction  env steps/s  updates/s  speed-up  rank 1 cut  mean length")
        for row in result["stragglers"]["table"]:
            if "error" in row:
                print(f"    {row['sync_fraction']:>27}  failed")
                continue
            print(f"    {row['sync_fraction']:>27} {fmt(row['env_steps_per_second']):>12} {row['updates_per_second']:>10.2f}"
                  f" {row.get('speedup', 1.0):>9.2f} {100 * row['rank1_cut_share']:>10.0f} % "
                  f"{row['rank1_cut_mean_length']:>11.1f}")
    if "python" in result:
        p = result["python"]
        print(f"  python worker     us per env step, pure / numpy: 4 floats {p['paths']['cue_4_floats_pure']['us_per_env_step']:.1f}"
              f" / {p['paths']['cue_4_floats_numpy']['us_per_env_step']:.1f}, [3,32,32] "
              f"{p['paths']['image_3x32x32_pure']['us_per_env_step']:.1f} / "
              f"{p['paths']['image_3x32x32_numpy']['us_per_env_step']:.1f}")
        print("  python uav        workers  env steps/s  agent steps/s  env-only    ratio  last join  RSS MiB  lost")
        print_scale_rows(p["table"], fmt)
    if "mujoco" in result:
        print("  mujoco            task                       env-only/core  workers  training sps  fraction")
        for row in result["mujoco"]["table"]:
            for i, p in enumerate(row["training"]):
                head = f"{row['env']:<26} {fmt(row['env_only_steps_per_second_per_core']):>13}" if i == 0 else " " * 40
                print(f"    {head} {p['workers']:>8} {fmt(p['env_steps_per_second']):>13} {p['fraction_of_env_only']:>9.2f}")
    if "learning" in result:
        print(result["learning"]["table"], end="")
    print(f"\nwritten: {args.out}")


if __name__ == "__main__":
    main()
