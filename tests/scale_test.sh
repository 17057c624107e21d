#!/usr/bin/env bash
# The workload the farm is for, at workstation scale on CI's two cores: uav_coverage (10 agents, map
# observations, a centralised critic on a [3, 32, 32] global state) with 32 workers for 60 s. Training must be
# under way within 15 s, and no healthy worker may be lost or reconnect: workers_lost, rejoins and
# connections_closed are 0, every worker joined once, and the run stops in order (summary.json, final
# checkpoint, exit 0).
# With `python`, the same for the numpy multi-UAV env in Python (examples/python/uav_coverage.yaml, env.python:
# one Python worker process per worker, started by farm-worker).
# Usage: scale_test.sh BUILD_DIR [WORKERS] [SECONDS] [python]
build_dir="$(cd "$1" && pwd)"
workers="${2:-32}"
seconds="${3:-60}"
source "$(dirname "$0")/lib.sh"
config="$root/configs/uav_coverage.yaml"
extra=()
if [ "${4:-}" = python ]; then
  config="$root/examples/python/uav_coverage.yaml"
  extra=(--set "env.python_interpreter=$(farm_python)")
fi
run_dir="$tmp/run"
start=$(date +%s)
rc=0
FARM_BUILD_DIR="$build_dir" FARM_SKIP_BUILD=1 timeout $((seconds + 120)) "$root/scripts/farm" run \
  "$config" --workers "$workers" --set max_wall_seconds="$seconds" "${extra[@]}" \
  --set total_env_steps=1000000000 --set run_dir="$run_dir" --set learner.progress_interval_s=1 \
  > "$tmp/run.log" 2>&1 || rc=$?
elapsed=$(($(date +%s) - start))
[ "$rc" -eq 0 ] || { tail -40 "$tmp/run.log"; fail "scripts/farm run exited with status $rc"; }
echo "run of $workers workers for $seconds s took $elapsed s"
python3 - "$run_dir" "$tmp/run.log" "$workers" <<'PY'
import json, os, re, sys
run, log, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = json.load(open(os.path.join(run, "summary.json")))
keys = ["env_steps", "agent_steps", "sps", "agent_sps", "updates", "workers", "workers_joined", "workers_lost",
        "rejoins", "connections_closed", "protocol_errors", "last_join_seconds", "max_rss_mb", "store_bytes",
        "stop_reason"]
print("summary:", json.dumps({k: s.get(k) for k in keys}))
print("time split:", json.dumps(s["time_seconds"]))
# The status lines: "[   12.3s] steps      4096 | ...": training under way within 15 s.
first = None
for line in open(log):
    m = re.search(r"\[\s*([0-9.]+)s\] steps\s+([0-9]+) \|", line)
    if m and int(m.group(2)) > 0:
        first = float(m.group(1))
        break
assert first is not None and first <= 15.0, f"no env steps within the first 15 s (first at {first} s)"
print(f"first env steps reported at {first:.1f} s")
assert s["stop_reason"].startswith("reached max_wall_seconds"), s["stop_reason"]
assert s["workers_lost"] == 0, s["workers_lost"]
assert s["rejoins"] == 0, s["rejoins"]
assert s["connections_closed"] == 0, s["connections_closed"]
assert s["protocol_errors"] == 0, s["protocol_errors"]
assert s["workers_joined"] == workers and s["workers_active"] == workers, (s["workers_joined"], s["workers_active"])
assert s["updates"] >= 1, s["updates"]
# The split of the inference thread's time adds up to its wall time.
t = s["time_seconds"]
parts = sum(t[k] for k in ("wait_for_data", "held_for_update", "admit", "gather", "forward", "serve", "handoff", "report", "other"))
assert abs(parts - t["total"]) <= 0.01 * t["total"], (parts, t["total"])
ckpts = [f for f in os.listdir(os.path.join(run, "checkpoints")) if f.endswith(".pt")]
assert ckpts, "no final checkpoint"
PY
grep -q "dropped worker\|reconnecting" "$tmp/run.log" && { grep -m 10 "dropped worker\|reconnecting" "$tmp/run.log"; fail "a worker was dropped or reconnected"; }
echo "ok: $(basename "$config") with $workers workers: no worker lost, stopped in order"
