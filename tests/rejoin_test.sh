#!/usr/bin/env bash
# Workers rejoin a learner that no longer knows them, without exiting:
#  1. the learner is killed (-9) and restarted with --resume well within
#     transport.heartbeat_timeout_s, so the workers' sockets reconnect to the new
#     learner by themselves and their next message comes from an identity it has
#     never seen. It answers Error UNKNOWN_WORKER; every worker (two farm-worker
#     processes in one run, two Python workers in another) says Hello again and
#     the run goes on to its step budget.
#  2. a farm-worker is frozen (SIGSTOP) for longer than the heartbeat timeout; the
#     learner drops it as silent. Thawed (SIGCONT), it is answered UNKNOWN_WORKER,
#     rejoins and ends normally on the learner's Stop.
# Every worker must exit 0 with at least one reconnection.
# Usage: rejoin_test.sh BUILD_DIR
build_dir="$(cd "$1" && pwd)"
source "$(dirname "$0")/lib.sh"
# A fixed port, for the restarted learner to bind again; below the ephemeral range (free_port).
endpoint="tcp://127.0.0.1:$(free_port)"
learner_bin="$build_dir/learner/farm-learner"
worker_bin="$build_dir/worker/farm-worker"
export PYTHONDONTWRITEBYTECODE=1

# wait_rows RUN_DIR N: until the run has written N metrics rows (60 s at most).
wait_rows() {
  wait_until 60 has_rows "$1/metrics.jsonl" "$2" ||
    { echo "FAIL: $1 did not reach $2 metrics rows"; cat "$tmp"/*.log | tail -40; exit 1; }
}
# wait_run LOG_PREFIX: the learner ($learner) must exit 0, and every worker started since the last call
# must exit 0 (on the learner's Stop). A worker that fails while the learner still runs fails the test at
# once: the learner would wait for workers for ever.
wait_run() {
  local p rc left=("${workers[@]}") still
  while [ "${#left[@]}" -gt 0 ]; do
    still=()
    for p in "${left[@]}"; do
      if kill -0 "$p" 2>/dev/null; then still+=("$p"); continue; fi
      rc=0; wait "$p" || rc=$?
      [ "$rc" -eq 0 ] || { echo "FAIL: a worker exited with status $rc"; tail -n 8 "$tmp"/*.log; exit 1; }
    done
    left=("${still[@]+"${still[@]}"}")
    if [ "${#left[@]}" -gt 0 ]; then sleep 0.2; fi
  done
  wait "$learner" || { echo "FAIL: the learner failed"; tail -n 8 "$tmp"/*.log; exit 1; }
}
# kill_learner LOG: kill -9 the running learner ($learner, logging to LOG), which must not have finished its
# run yet.
kill_learner() {
  kill -0 "$learner" 2>/dev/null && ! grep -q "stopping:" "$1" ||
    { echo "FAIL: the run ended before the learner could be killed"; tail -n 8 "$tmp"/*.log; exit 1; }
  kill -9 "$learner"
  wait "$learner" 2>/dev/null || true
}
# check RUN_DIR STEPS STATS_FILE...: the run reached its budget; each worker reconnected at least once.
check() {
  python3 - "$@" <<'PY' || { tail -n 8 "$tmp"/*.log; exit 1; }
import json, os, sys
run, steps, stats = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
s = json.load(open(os.path.join(run, "summary.json")))
print("summary:", json.dumps({k: s.get(k) for k in ("env_steps", "updates", "workers", "workers_lost")}))
assert s["env_steps"] >= steps, s["env_steps"]
for f in stats:
    w = json.load(open(f))
    assert w["reconnects"] >= 1, (f, w)
    print(os.path.basename(f), "reconnects", w["reconnects"], "env steps", w["env_steps"])
PY
}

# start_learner LOG ARGS...: a farm-learner in the background ($learner).
start_learner() {
  local log="$1"
  shift
  "$learner_bin" "$@" > "$tmp/$log" 2>&1 &
  learner=$!
  pids+=("$learner")
}
# start_cpp_workers TAG ARGS...: farm-workers 0 and 1 with the learner's config ($workers).
start_cpp_workers() {
  local tag="$1" i
  shift
  workers=()
  for i in 0 1; do
    "$worker_bin" --config "$root/configs/cartpole.yaml" "$@" --learner "$endpoint" --index "$i" \
      --stats-file "$tmp/$tag-$i.json" > "$tmp/$tag-$i.log" 2>&1 &
    workers+=($!)
    pids+=($!)
  done
}
# restart_learner TAG: kill -9 the learner (log TAG-1.log) and resume the run at once, far inside the
# workers' heartbeat timeout; then every worker must have rejoined on UNKNOWN_WORKER.
restart_learner() {
  # Both workers must have joined the first learner (one that starts late only ever knows the second).
  wait_until 60 grep -q "(2 workers" "$tmp/learner-$1-1.log" ||
    { echo "FAIL: both $1 workers did not join"; tail -n 8 "$tmp"/*.log; exit 1; }
  wait_rows "$run" 6
  kill_learner "$tmp/learner-$1-1.log"
  start_learner "learner-$1-2.log" --resume "$run"
  wait_run "$1"
  local i
  for i in 0 1; do
    grep -q "does not know this worker" "$tmp/$1-$i.log" ||
      { echo "FAIL: $1 worker $i did not rejoin on UNKNOWN_WORKER"; tail -n 20 "$tmp/$1"-*.log "$tmp"/learner-"$1"-*.log; exit 1; }
  done
}

# --- 1a. learner restart, farm-worker ------------------------------------------------------------
run="$tmp/run-cpp"
common=(--set stop_at_target=false --set learner.checkpoint_every=3 --set learner.progress_interval_s=100
        --set transport.heartbeat_interval_s=0.5 --set transport.heartbeat_timeout_s=30
        --set transport.worker_give_up_s=60)
start_learner learner-cpp-1.log --config "$root/configs/cartpole.yaml" "${common[@]}" \
  --set total_env_steps=200000 --set "transport.bind=$endpoint" --set "run_dir=$run"
start_cpp_workers cpp "${common[@]}"
restart_learner cpp
check "$run" 200000 "$tmp/cpp-0.json" "$tmp/cpp-1.json"
echo "ok: farm-workers rejoined a restarted learner"

# --- 1b. learner restart, Python worker ----------------------------------------------------------
py=""
for cand in ${FARM_PYTHON:-} python3 /usr/bin/python3; do
  command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import zmq, google.protobuf' 2>/dev/null && { py="$cand"; break; }
done
[ -n "$py" ] || { echo "FAIL: needs a python3 with zmq and google.protobuf (apt-get install python3-zmq python3-protobuf)"; exit 1; }
[ -f "$build_dir/python/farm_pb2.py" ] || { echo "FAIL: $build_dir/python/farm_pb2.py missing (target farm_proto_py)"; exit 1; }
run="$tmp/run-py"
# The Python worker takes the heartbeat settings from the learner's Welcome.
start_learner learner-py-1.log --config "$root/configs/cartpole.yaml" "${common[@]}" \
  --set total_env_steps=60000 --set "transport.bind=$endpoint" --set "run_dir=$run"
workers=()
for i in 0 1; do
  FARM_PYTHON_PATH="$build_dir/python" PYTHONPATH="$root/worker/python" "$py" -m farm_worker --learner "$endpoint" \
    --env-module "$root/tests/python/cue_env.py:make" --num-envs 8 --groups 2 --seed 3 --index "$i" \
    --give-up-s 60 --stats-file "$tmp/py-$i.json" > "$tmp/py-$i.log" 2>&1 &
  workers+=($!)
  pids+=($!)
done
restart_learner py
check "$run" 60000 "$tmp/py-0.json" "$tmp/py-1.json"
echo "ok: Python workers rejoined a restarted learner"

# --- 2. a frozen farm-worker ---------------------------------------------------------------------
run="$tmp/run-stall"
stall=(--set total_env_steps=300000 --set stop_at_target=false --set learner.progress_interval_s=100
       --set transport.heartbeat_interval_s=0.2 --set transport.heartbeat_timeout_s=1.0
       --set transport.worker_give_up_s=60)
start_learner learner-stall.log --config "$root/configs/cartpole.yaml" "${stall[@]}" \
  --set "transport.bind=$endpoint" --set "run_dir=$run"
start_cpp_workers stall "${stall[@]}"
wait_rows "$run" 3
# Thawed only once the learner has dropped it: its log names the worker's identity, which ends in its pid
# (and -cN after N reconnections; under load the learner may have dropped it before it was frozen).
frozen="${workers[0]}"
drops() { grep -c "dropped worker worker-[^ ]*-$frozen\(-c[0-9]*\)\?:" "$tmp/learner-stall.log" || true; }
# Frozen only once it has joined: a worker stopped before its Hello is never dropped (it never joined), and the
# other worker would finish the run alone.
joined() { grep -q "worker worker-[^ ]*-$frozen joined" "$tmp/learner-stall.log"; }
wait_until 60 joined || { echo "FAIL: worker 0 did not join"; tail -n 8 "$tmp"/*.log; exit 1; }
drops_before="$(drops)"
kill -STOP "$frozen"
dropped() { [ "$(drops)" -gt "$drops_before" ]; }
wait_until 60 dropped || { kill -CONT "$frozen"; echo "FAIL: the learner did not drop the frozen worker"; tail -n 8 "$tmp"/*.log; exit 1; }
running "$learner" || { kill -CONT "$frozen"; echo "FAIL: the run ended while the worker was frozen"; tail -n 8 "$tmp"/*.log; exit 1; }
kill -CONT "$frozen"
wait_run stall
check "$run" 300000 "$tmp/stall-0.json"
echo "ok: a frozen farm-worker rejoined after the learner dropped it"
