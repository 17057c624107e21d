#!/usr/bin/env bash
# kill -9 the learner in the middle of training and restart it with --resume:
# the workers reconnect on their own, the counters, the 100-episode window and
# the wall clock continue from the latest checkpoint, and the run goes on to
# its step budget. Then `scripts/farm run --resume RUN_DIR` continues the
# finished run further (with an override), and refuses directories it cannot
# resume; farm-learner --resume falls back to the checkpoint's stored config.
# Usage: resume_test.sh BUILD_DIR
build_dir="$1"
source "$(dirname "$0")/lib.sh"
port="$(free_port)"  # the restarted learner binds it again
run="$tmp/run"
common=(--set total_env_steps=100000 --set stop_at_target=false --set learner.checkpoint_every=5
        --set learner.progress_interval_s=100 --set transport.heartbeat_interval_s=0.2
        --set transport.heartbeat_timeout_s=1.0 --set transport.worker_give_up_s=60)
"$build_dir/learner/farm-learner" --config "$root/configs/cartpole.yaml" "${common[@]}" \
  --set "transport.bind=tcp://127.0.0.1:$port" --set "run_dir=$run" > "$tmp/learner1.log" 2>&1 &
learner=$!
pids+=("$learner")
for i in 0 1; do
  "$build_dir/worker/farm-worker" --config "$root/configs/cartpole.yaml" "${common[@]}" \
    --learner "tcp://127.0.0.1:$port" --index "$i" --stats-file "$tmp/worker-$i.json" > "$tmp/worker-$i.log" 2>&1 &
  pids+=($!)
done
# Let it write a few checkpoints, then kill it without warning, in the middle of the run. The budget leaves the
# resumed run several seconds: a worker whose reconnection attempts all fall after the run's end gives up after
# worker_give_up_s with an error (it cannot tell a finished run from a lost learner), which a budget of 40,000
# steps (2-3 s after the resume) let happen on a loaded CI machine.
wait_until 60 has_rows "$run/metrics.jsonl" 12 ||
  { tail -n 8 "$tmp"/*.log; fail "the run did not reach 12 updates within 60 s"; }
running "$learner" && ! grep -q "stopping:" "$tmp/learner1.log" ||
  { tail -n 8 "$tmp"/*.log; fail "the run ended before the learner could be killed"; }
kill -9 "$learner"
wait "$learner" 2>/dev/null || true
before="$(cat "$run/checkpoints/latest")"
echo "killed the learner; latest checkpoint $before"
# The workers notice the silence (transport.heartbeat_timeout_s) and start reconnecting.
reconnecting() { grep -q "; reconnecting" "$tmp/worker-0.log" && grep -q "; reconnecting" "$tmp/worker-1.log"; }
wait_until 30 reconnecting || { tail -n 8 "$tmp"/worker-*.log; fail "the workers did not notice the silent learner"; }
"$build_dir/learner/farm-learner" --resume "$run" > "$tmp/learner2.log" 2>&1 &
learner=$!
pids+=("$learner")
wait "$learner"
for p in "${pids[@]:1}"; do
  wait "$p" || { echo "a worker failed"; tail -n 20 "$tmp"/worker-*.log; grep -v '^{' "$tmp/learner2.log" | tail -n 30; exit 1; }
done
python3 - "$run" "$before" "$tmp" <<'PY'
import json, os, re, sys
run, before, tmp = sys.argv[1], sys.argv[2].strip(), sys.argv[3]
s = json.load(open(os.path.join(run, "summary.json")))
print("summary:", json.dumps(s))
# The checkpoint the restart resumed from: usually the one `latest` named at the kill, but a kill between a
# checkpoint's rename and the update of `latest` leaves a newer complete checkpoint, which --resume takes (it
# picks the newest valid file, not the pointer).
log = open(os.path.join(tmp, "learner2.log")).read()
m = re.search(r"resumed \S*ckpt-(\d+)\.pt: (\d+) env steps, (\d+) updates, policy version \d+, (\d+) episodes "
              r"\(window of (\d+), mean return ([-\d.]+)\)", log)
assert m, log[-2000:]
resumed_updates = int(m.group(1))
assert int(m.group(3)) == resumed_updates, (m.group(0), resumed_updates)
assert resumed_updates >= int(before.split("-")[1].split(".")[0]), (resumed_updates, before)
episodes, window = int(m.group(4)), int(m.group(5))
assert s["env_steps"] >= 100000, s["env_steps"]
assert s["updates"] > resumed_updates, (s["updates"], resumed_updates)
assert s["workers_active"] == 2, s  # abandoned handshakes may show as lost workers
rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
updates = [r["update"] for r in rows]
# The rows after the restart continue the update count from the checkpoint. The killed learner may have
# written rows past its last checkpoint (repeated after the restart), or none, or not even the checkpoint's own
# row (a checkpoint is written before its row), so the restart is the last row of update resumed_updates + 1.
restart = max(i for i, r in enumerate(rows) if r["update"] == resumed_updates + 1)
assert rows[restart - 1]["update"] >= resumed_updates - 1, (rows[restart - 1]["update"], resumed_updates)
assert updates[restart:] == list(range(resumed_updates + 1, s["updates"] + 1)), updates[restart:]
assert rows[restart]["env_steps"] > rows[0]["env_steps"]
# The episode window and counters continue: the restored count is at least the count the run had when it
# handed off update `resumed_updates` (the row of the update before), and the window is not empty.
before_row = next(r for r in rows[:restart] if r["update"] == resumed_updates - 1)
assert episodes >= before_row["episodes"] > 0, (episodes, before_row["episodes"])
assert 0 < window <= 100 and window == min(100, episodes), (window, episodes)
assert rows[restart]["episodes"] >= episodes, (rows[restart]["episodes"], episodes)
assert rows[restart]["mean_return_100"] is not None
assert rows[restart]["wall_seconds"] > before_row["wall_seconds"], "wall_seconds continues after --resume"
assert "written by an older version" not in log, "a new checkpoint holds the whole run state"
for i in (0, 1):
    w = json.load(open(os.path.join(tmp, f"worker-{i}.json")))
    assert w["reconnects"] >= 1, w
print("ok: resumed from update", resumed_updates, "to", s["updates"], "with", s["env_steps"], "env steps;",
      episodes, "episodes restored, a window of", window)
PY

# scripts/farm run --resume RUN_DIR: the finished run goes on to a larger budget (an override), from its final
# checkpoint, with the run's own config.yaml.
updates_before="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["updates"])' "$run/summary.json")"
FARM_BUILD_DIR="$build_dir" FARM_SKIP_BUILD=1 "$root/scripts/farm" run --resume "$run" --workers 1 \
  --set total_env_steps=108000 > "$tmp/farm3.log" 2>&1 || { echo "scripts/farm run --resume failed"; tail -30 "$tmp/farm3.log"; exit 1; }
python3 - "$run" "$updates_before" "$tmp/farm3.log" <<'PY'
import json, os, sys
run, updates_before, log = sys.argv[1], int(sys.argv[2]), open(sys.argv[3]).read()
s = json.load(open(os.path.join(run, "summary.json")))
assert s["env_steps"] >= 108000, s["env_steps"]
assert s["updates"] > updates_before, (s["updates"], updates_before)
assert "total_env_steps: 100000 -> 108000" in log, "the learner reports the changed key: " + log[-2000:]
rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
assert rows[-1]["update"] == s["updates"]
print("ok: scripts/farm run --resume went on from update", updates_before, "to", s["updates"])
PY

# Directories that cannot be resumed: said so, nothing started.
mkdir -p "$tmp/empty"
if FARM_BUILD_DIR="$build_dir" FARM_SKIP_BUILD=1 "$root/scripts/farm" run --resume "$tmp/empty" > "$tmp/farm4.log" 2>&1; then
  echo "scripts/farm run --resume of an empty directory succeeded"; exit 1
fi
grep -q "has no config.yaml" "$tmp/farm4.log" || { cat "$tmp/farm4.log"; exit 1; }
cp "$run/config.yaml" "$tmp/empty/config.yaml"
if FARM_BUILD_DIR="$build_dir" FARM_SKIP_BUILD=1 "$root/scripts/farm" run --resume "$tmp/empty" > "$tmp/farm4.log" 2>&1; then
  echo "scripts/farm run --resume without checkpoints succeeded"; exit 1
fi
grep -q "has no checkpoint" "$tmp/farm4.log" || { cat "$tmp/farm4.log"; exit 1; }
# Checkpoints whose checksums all fail: the learner refuses to start, naming the directory.
mkdir -p "$tmp/empty/checkpoints"
head -c 100 "$run/checkpoints/$(cat "$run/checkpoints/latest")" > "$tmp/empty/checkpoints/ckpt-00000001.pt"
if "$build_dir/learner/farm-learner" --resume "$tmp/empty" > "$tmp/learner5.log" 2>&1; then
  echo "farm-learner --resume with no valid checkpoint started"; exit 1
fi
grep -q "nothing to resume" "$tmp/learner5.log" || { cat "$tmp/learner5.log"; exit 1; }

# farm-learner --resume without config.yaml: the config stored in the checkpoint (a copy of the run, stopped
# by SIGTERM before any worker joins).
cp -r "$run" "$tmp/copy"
rm "$tmp/copy/config.yaml" "$tmp/copy/summary.json"
# A larger budget: the copied run has reached its own, and a learner resumed there stops at once by itself (under
# load, before the SIGTERM below).
"$build_dir/learner/farm-learner" --resume "$tmp/copy" --endpoint-file "$tmp/copy.endpoint" \
  --set total_env_steps=1000000 > "$tmp/learner6.log" 2>&1 &
learner=$!
pids+=("$learner")
for _ in $(seq 300); do [ -s "$tmp/copy.endpoint" ] && break; sleep 0.1; done
[ -s "$tmp/copy.endpoint" ] || { echo "farm-learner --resume without config.yaml did not start"; cat "$tmp/learner6.log"; exit 1; }
kill -TERM "$learner"
wait "$learner" || { echo "farm-learner did not stop cleanly"; cat "$tmp/learner6.log"; exit 1; }
grep -q "no config.yaml; using the config stored in" "$tmp/learner6.log" || { cat "$tmp/learner6.log"; exit 1; }
# Stopped before any worker joined, it still reports the run's figures from the checkpoint, not zeros.
python3 - "$run/summary.json" "$tmp/copy/summary.json" <<'PY' || { cat "$tmp/learner6.log"; exit 1; }
import json, sys
run, copy = (json.load(open(p)) for p in sys.argv[1:3])
for key in ("env_steps", "updates", "episodes", "mean_return_100"):
    assert copy[key] == run[key], (key, copy[key], run[key])
# The checkpoint's wall time is taken when it is written, a little before the run's last summary (CI saw
# 2.967 s against 2.971 s): the copy's must be that time, not zero, so within half a second of the run's.
assert copy["wall_seconds"] >= run["wall_seconds"] - 0.5, (copy["wall_seconds"], run["wall_seconds"])
assert copy["stop_reason"] == "terminated (SIGTERM)", copy["stop_reason"]
PY
echo "ok: unresumable directories refused; the checkpoint's config used when config.yaml is missing"
