#!/usr/bin/env bash
# The learner restarted and frozen under workers that keep running, with the default bind
# (tcp://127.0.0.1:*, a port the system chooses):
#  1. kill -9 and `farm-learner --resume RUN_DIR` three times mid-run: each resumed learner listens on the port
#     the first one had (run_dir/learner.endpoint), so the same two workers find it again by themselves and the
#     run goes on.
#  2. the last learner is frozen (SIGSTOP, as a paused VM) for 8 s, over twice its heartbeat timeout: when it
#     wakes it does not count its workers as lost (it was the one that stopped answering); the workers, which
#     took it for gone and are connecting again, are counted as replaced by their new connections. Then a TERM
#     stops the run in order.
# Usage: learner_restart_test.sh BUILD_DIR
build_dir="$(cd "$1" && pwd)"
source "$(dirname "$0")/lib.sh"
learner_bin="$build_dir/learner/farm-learner"
run="$tmp/run"
common=(--set total_env_steps=5000000 --set stop_at_target=false --set learner.checkpoint_every=3
        --set learner.progress_interval_s=100 --set transport.heartbeat_interval_s=0.2
        --set transport.heartbeat_timeout_s=3 --set transport.worker_give_up_s=60)

"$learner_bin" --config "$root/configs/cartpole.yaml" "${common[@]}" --set "run_dir=$run" \
  --endpoint-file "$tmp/endpoint" > "$tmp/learner0.log" 2>&1 &
learner=$!
pids+=("$learner")
wait_until 30 test -s "$tmp/endpoint" || { cat "$tmp/learner0.log"; fail "the learner did not start listening"; }
endpoint="$(cat "$tmp/endpoint")"
case "$endpoint" in tcp://127.0.0.1:[0-9]*) ;; *) fail "unexpected endpoint '$endpoint'" ;; esac
workers=()
for i in 0 1; do
  "$build_dir/worker/farm-worker" --config "$root/configs/cartpole.yaml" "${common[@]}" --learner "$endpoint" \
    --index "$i" --stats-file "$tmp/worker-$i.json" > "$tmp/worker-$i.log" 2>&1 &
  workers+=($!)
  pids+=($!)
done

rows() { [ -f "$run/metrics.jsonl" ] && wc -l < "$run/metrics.jsonl" || echo 0; }
# grows_by N: the run writes N more metrics rows than it had when called (60 s at most).
grows_by() {
  local target=$(($(rows) + $1))
  wait_until 60 has_rows "$run/metrics.jsonl" "$target" || { tail -n 8 "$tmp"/*.log; fail "the run stalled at $(rows) rows"; }
}
reconnecting() { grep -c "; reconnecting" "$tmp/worker-$1.log" || true; }

grows_by 6
for cycle in 1 2 3; do
  running "$learner" && ! grep -q "stopping:" "$tmp/learner$((cycle - 1)).log" ||
    { tail -n 8 "$tmp"/*.log; fail "the run ended before restart $cycle"; }
  before0="$(reconnecting 0)" before1="$(reconnecting 1)"
  kill -9 "$learner"
  wait "$learner" 2>/dev/null || true
  # The workers notice the silence and start connecting again, to the endpoint they were given.
  wait_until 30 bash -c "[ \$(grep -c '; reconnecting' '$tmp/worker-0.log') -gt $before0 ] &&
                         [ \$(grep -c '; reconnecting' '$tmp/worker-1.log') -gt $before1 ]" ||
    { tail -n 8 "$tmp"/worker-*.log; fail "restart $cycle: the workers did not notice the killed learner"; }
  "$learner_bin" --resume "$run" > "$tmp/learner$cycle.log" 2>&1 &
  learner=$!
  pids+=("$learner")
  wait_until 30 grep -q "listening on" "$tmp/learner$cycle.log" || { cat "$tmp/learner$cycle.log"; fail "restart $cycle did not listen"; }
  grep -q "resume: listening on $endpoint again" "$tmp/learner$cycle.log" ||
    { cat "$tmp/learner$cycle.log"; fail "restart $cycle did not listen on $endpoint again"; }
  [ "$(cat "$run/learner.endpoint")" = "$endpoint" ] || fail "restart $cycle: learner.endpoint is $(cat "$run/learner.endpoint")"
  grows_by 4
  echo "restart $cycle: the workers came back to $endpoint; $(rows) metrics rows"
done

# Frozen for 8 s with a heartbeat timeout of 3 s.
kill -STOP "$learner"
sleep 8
kill -CONT "$learner"
grows_by 3
kill -TERM "$learner"
for p in "${workers[@]}"; do
  wait "$p" || { tail -n 20 "$tmp"/worker-*.log; fail "a worker failed"; }
done
wait "$learner" || { tail -n 20 "$tmp/learner3.log"; fail "the last learner failed"; }
grep -q "the learner did not run for" "$tmp/learner3.log" || { cat "$tmp/learner3.log"; fail "the freeze was not noticed"; }
python3 - "$run" "$tmp" <<'PY'
import json, os, sys
run, tmp = sys.argv[1], sys.argv[2]
s = json.load(open(os.path.join(run, "summary.json")))
print("summary:", json.dumps({k: s.get(k) for k in ("env_steps", "updates", "workers", "workers_active",
                                                     "workers_lost", "workers_replaced", "rejoins", "stop_reason")}))
assert s["env_steps"] > 0 and s["updates"] >= 10, s
# The freeze was the learner's: none of its workers is lost; both connected again and replaced their old
# connections (abandoned connection attempts, queued while it was frozen, may be replaced too).
assert s["workers_lost"] == 0, s
assert s["workers_replaced"] >= 2, s
assert s["workers_active"] == 2, s
for i in (0, 1):
    w = json.load(open(os.path.join(tmp, f"worker-{i}.json")))
    assert w["reconnects"] >= 4, w  # three restarts and the freeze
print("ok")
PY
