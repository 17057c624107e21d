#!/usr/bin/env bash
# kill -9 the learner under `scripts/farm run`: no Stop reaches the workers, so
# the launcher must stop them itself (a 2 s grace, then TERM) instead of
# waiting the ~70 s they would spend reconnecting with the default
# transport.heartbeat_timeout_s and transport.worker_give_up_s. Checks that the
# launcher returns within 10 s, with a non-zero status, and leaves no worker.
# Usage: launcher_learner_killed_test.sh BUILD_DIR
build_dir="$1"
source "$(dirname "$0")/lib.sh"
workers=()  # the launcher's, not ours: killed on exit if the launcher left them
cleanup_extra() { local w; for w in "${workers[@]+"${workers[@]}"}"; do kill -KILL "$w" 2>/dev/null || true; done; }
# Default heartbeat settings: without the launcher's TERM the workers would outlive it by ~70 s.
FARM_BUILD_DIR="$build_dir" FARM_SKIP_BUILD=1 "$root/scripts/farm" run "$root/configs/cartpole.yaml" --workers 2 \
  --set total_env_steps=100000000 --set stop_at_target=false --set "run_dir=$tmp/run" \
  --set learner.progress_interval_s=100 > "$tmp/log" 2>&1 &
farm=$!
pids+=("$farm")
wait_until 60 has_rows "$tmp/run/metrics.jsonl" 2 || { cat "$tmp/log"; fail "the run did not start training"; }
learner="$(pgrep -P "$farm" -x farm-learner || true)"
mapfile -t workers < <(pgrep -P "$farm" -x farm-worker || true)
[ -n "$learner" ] && [ "${#workers[@]}" -eq 2 ] ||
  { echo "expected the launcher's learner and 2 workers, found '$learner' and ${workers[*]:-none}"; cat "$tmp/log"; exit 1; }
kill -9 "$learner"
start=$SECONDS
echo "killed the learner (pid $learner); workers ${workers[*]}"
for _ in $(seq 100); do kill -0 "$farm" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$farm" 2>/dev/null; then
  echo "the launcher was still running 10 s after the learner was killed"; tail -20 "$tmp/log"; exit 1
fi
rc=0
wait "$farm" || rc=$?
elapsed=$((SECONDS - start))
echo "the launcher returned status $rc after ${elapsed} s"
[ "$rc" -ne 0 ] || { echo "the launcher reported success for a killed learner"; exit 1; }
grep -q "stopping 2 workers" "$tmp/log" || { echo "the launcher did not say it stopped the workers"; tail -20 "$tmp/log"; exit 1; }
left=()
for w in "${workers[@]}"; do kill -0 "$w" 2>/dev/null && left+=("$w"); done
if [ "${#left[@]}" -gt 0 ] || pgrep -f "farm-worker.*run_dir=$tmp/run" >/dev/null; then
  echo "farm-worker processes of the run remain: ${left[*]:-} $(pgrep -f "farm-worker.*run_dir=$tmp/run" | tr '\n' ' ')"
  exit 1
fi
workers=()
echo "ok: the launcher stopped both workers and returned in ${elapsed} s"
