#!/usr/bin/env bash
# A full disk under a running learner (issue: faults of the host). The disk is simulated with a file size limit
# on the learner alone (ulimit -f: writes past it fail with EFBIG, as they would with ENOSPC; no root needed):
#   1. a run writes a good checkpoint with room to spare, and stops;
#   2. resumed with no room for a checkpoint, it trains on, logs each failed checkpoint with the file and the
#      reason, and after learner.max_failed_checkpoints (3) in a row stops in order: summary.json with
#      checkpoints_failed, the reason in stop_reason, exit status 1, its worker told to stop, no temp file left,
#      the good checkpoint still `latest`;
#   3. with room again, --resume continues from that good checkpoint.
# Usage: disk_full_test.sh BUILD_DIR
build_dir="$(cd "$1" && pwd)"
source "$(dirname "$0")/lib.sh"
run="$tmp/run"
common=(--config "$root/configs/cartpole.yaml" --set stop_at_target=false --set learner.progress_interval_s=100
        --set learner.checkpoint_every=2 --set transport.worker_give_up_s=30)
worker() {  # worker ENDPOINT_FILE LOG
  wait_until 60 test -s "$1" || fail "the learner did not listen within 60 s"
  "$build_dir/worker/farm-worker" --config "$root/configs/cartpole.yaml" --learner "$(cat "$1")" > "$2" 2>&1
}

# 1. Room to spare.
"$build_dir/learner/farm-learner" "${common[@]}" --set total_env_steps=4000 --set "run_dir=$run" \
  --endpoint-file "$tmp/e1" > "$tmp/learner1.log" 2>&1 &
pids+=($!)
worker "$tmp/e1" "$tmp/worker1.log" || fail "worker 1 failed: $(tail -3 "$tmp/worker1.log")"
wait "${pids[0]}" || { tail -20 "$tmp/learner1.log"; fail "the first run failed"; }
good="$(cat "$run/checkpoints/latest")"
size=$(stat -c %s "$run/checkpoints/$good")
echo "a good checkpoint: $good ($size bytes)"

# 2. Resumed with files limited to half a checkpoint.
limit_kib=$((size / 2048))
rc=0
(ulimit -f "$limit_kib"; exec "$build_dir/learner/farm-learner" --resume "$run" --set total_env_steps=100000000 \
   --set learner.max_failed_checkpoints=3 --endpoint-file "$tmp/e2") > "$tmp/learner2.log" 2>&1 &
learner=$!
pids+=("$learner")
worker "$tmp/e2" "$tmp/worker2.log" || fail "worker 2 did not end on the learner's Stop: $(tail -3 "$tmp/worker2.log")"
wait "$learner" || rc=$?
[ "$rc" -eq 1 ] || { tail -20 "$tmp/learner2.log"; fail "expected exit status 1 from the learner out of space, got $rc"; }
grep -q "checkpoint ckpt-[0-9]*\.pt not written: .*ckpt-[0-9]*\.pt.*File too large" "$tmp/learner2.log" ||
  { tail -20 "$tmp/learner2.log"; fail "no log line naming the checkpoint that could not be written and why"; }
grep -q "stopping: 3 checkpoints in a row could not be written (learner.max_failed_checkpoints)" "$tmp/learner2.log" ||
  { tail -20 "$tmp/learner2.log"; fail "the learner did not stop after 3 failed checkpoints in a row"; }
python3 - "$run" "$good" <<'PY'
import json, os, sys
run, good = sys.argv[1], sys.argv[2]
s = json.load(open(os.path.join(run, "summary.json")))
print("summary:", json.dumps({k: s[k] for k in ("updates", "env_steps", "checkpoints_failed", "write_errors", "stop_reason")}))
assert s["checkpoints_failed"] == 4, s["checkpoints_failed"]  # three periodic ones and the final one
assert s["stop_reason"].startswith("3 checkpoints in a row could not be written"), s["stop_reason"]
assert "File too large" in s["stop_reason"], s["stop_reason"]
assert open(os.path.join(run, "checkpoints", "latest")).read().strip() == good
left = [f for f in os.listdir(os.path.join(run, "checkpoints")) if f.endswith(".tmp")] + \
       [f for f in os.listdir(run) if f.endswith(".tmp")]
assert not left, left
print("ok: stopped in order after 3 failed checkpoints; latest is still", good)
PY

# 3. Room again: --resume takes the good checkpoint.
"$build_dir/learner/farm-learner" --resume "$run" --set total_env_steps=6000 --endpoint-file "$tmp/e3" \
  > "$tmp/learner3.log" 2>&1 &
learner=$!
pids+=("$learner")
worker "$tmp/e3" "$tmp/worker3.log" || fail "worker 3 failed"
wait "$learner" || { tail -20 "$tmp/learner3.log"; fail "the resumed run failed"; }
grep -q "resumed .*$good" "$tmp/learner3.log" || { grep resumed "$tmp/learner3.log"; fail "not resumed from $good"; }
echo "ok: resumed from $good once there was room"
