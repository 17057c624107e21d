#!/usr/bin/env bash
# Memory pressure (issue 19): the run's expected memory against learner.memory_budget_mb or the process's own
# limit, checked at every Hello (learner/run/memory_budget.h).
#  1. A budget the run cannot fit: the first Hello is refused with the figures, the learner stops in order
#     (exit status 1, no checkpoint, no summary), the worker exits saying why.
#  2. A budget that fits one worker's rows but not two: the second worker is refused, naming it and the budget,
#     and the run trains to the end with the first.
#  3. The process's own limit (ulimit -v, learner.memory_budget_mb 0): a store that cannot fit under it is
#     refused at the first Hello with the figure and the limit's source.
#  4. The same with the check off (learner.memory_budget_mb -1): an allocation fails mid-run; the learner says
#     it ran out of memory (not a divergence, not an abort), tells the worker to stop and exits with status 1.
#  5. A resume that cannot fit: refused at the first Hello before anything is written (config.yaml,
#     policy_spec.json, checkpoints as they were).
# Usage: memory_budget_test.sh BUILD_DIR
build_dir="$(cd "$1" && pwd)"
source "$(dirname "$0")/lib.sh"
learner_bin="$build_dir/learner/farm-learner"
worker_bin="$build_dir/worker/farm-worker"
config="$root/configs/cartpole.yaml"

# learner LOG [--set k=v ...]: a learner in the background on a fresh port ($endpoint); its pid in $learner.
learner() {
  local log="$1"
  shift
  endpoint="tcp://127.0.0.1:$(free_port)"
  "$learner_bin" --config "$config" --set "transport.bind=$endpoint" --set learner.progress_interval_s=100 \
    --set stop_at_target=false "$@" > "$log" 2>&1 &
  learner=$!
  pids+=("$learner")
}
worker() {  # worker LOG [--set k=v ...]: one farm-worker against $endpoint, in the background; pid in $worker
  local log="$1"
  shift
  timeout 120 "$worker_bin" --config "$config" --learner "$endpoint" --set stop_at_target=false "$@" > "$log" 2>&1 &
  worker=$!
  pids+=("$worker")
}

# --- 1. the run cannot fit -------------------------------------------------------------------------
learner "$tmp/l1.log" --set run_dir="$tmp/run1" --set learner.memory_budget_mb=1 --set env.num_envs=256 \
  --set ppo.rollout_length=256
worker "$tmp/w1.log" --set env.num_envs=256
rc=0; wait "$learner" || rc=$?
wrc=0; wait "$worker" || wrc=$?
[ "$rc" -eq 1 ] || { cat "$tmp/l1.log"; fail "the learner exited $rc, expected 1"; }
[ "$wrc" -ne 0 ] || { cat "$tmp/w1.log"; fail "the refused worker exited 0"; }
grep -q "the run needs about .* MiB (store .*, update .*) but the memory budget is 1.0 MiB (learner.memory_budget_mb)" \
  "$tmp/l1.log" || { cat "$tmp/l1.log"; fail "the learner did not say what the run needs and the budget"; }
grep -q "memory budget is 1.0 MiB" "$tmp/w1.log" || { cat "$tmp/w1.log"; fail "the worker did not say why"; }
[ ! -e "$tmp/run1/summary.json" ] || fail "a run that never started wrote a summary"
[ -z "$(ls "$tmp/run1/checkpoints" 2>/dev/null)" ] || fail "a run that never started wrote a checkpoint"
echo "ok: $(grep -m 1 -o 'the run needs about.*' "$tmp/l1.log")"

# --- 2. one worker fits, two do not ------------------------------------------------------------------
# The first worker's estimate is in the log; a budget of 1.5 times it fits one worker's rows, not two.
learner "$tmp/l2.log" --set run_dir="$tmp/run2" --set learner.memory_budget_mb=-1 --set env.num_envs=1024 \
  --set ppo.rollout_length=128 --set total_env_steps=1
worker "$tmp/probe.log" --set env.num_envs=1024
wait "$learner" || true
wait "$worker" || true
one=$(grep -o 'expected memory with the first worker: [0-9.]* MiB' "$tmp/l2.log" | grep -o '[0-9.]* MiB' | cut -d' ' -f1)
[ -n "$one" ] || { cat "$tmp/l2.log"; fail "no estimate in the log"; }
budget=$(python3 -c "import math; print(math.ceil($one * 1.5))")
learner "$tmp/l3.log" --set run_dir="$tmp/run3" --set learner.memory_budget_mb="$budget" --set env.num_envs=1024 \
  --set ppo.rollout_length=128 --set total_env_steps=400000 --set learner.min_workers=1
first_learner=$learner
worker "$tmp/w3a.log" --set env.num_envs=1024 --set transport.worker_give_up_s=5
first=$worker
wait_until 30 grep -q "joined" "$tmp/l3.log" || { cat "$tmp/l3.log"; fail "the first worker did not join"; }
worker "$tmp/w3b.log" --set env.num_envs=1024 --set transport.worker_give_up_s=5
second=$worker
wrc=0; wait "$second" || wrc=$?
[ "$wrc" -ne 0 ] || { cat "$tmp/w3b.log"; fail "the second worker was not refused"; }
grep -q "the run with worker .* needs about .* but the memory budget is $budget.0 MiB" "$tmp/l3.log" ||
  { cat "$tmp/l3.log"; fail "the refusal does not name the worker, the need and the budget"; }
rc=0; wait "$first_learner" || rc=$?
wait "$first" || true
[ "$rc" -eq 0 ] || { tail -20 "$tmp/l3.log"; fail "the run with one worker exited $rc"; }
python3 - "$tmp/run3/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["env_steps"] >= 400000 and s["workers_joined"] == 1, (s["env_steps"], s["workers_joined"])
print("ok: trained to", s["env_steps"], "env steps with", s["workers_joined"], "worker; the second refused")
PY

# --- 3. the process's own limit: ulimit -v --------------------------------------------------------
# The learner's address space once started (LibTorch mapped), plus 600 MiB; the config's store needs far more.
learner "$tmp/l4.log" --set run_dir="$tmp/run4"
wait_until 30 grep -q "listening" "$tmp/l4.log" || { cat "$tmp/l4.log"; fail "the probe learner did not start"; }
vm_kib=$(awk '/^VmSize:/ {print $2}' "/proc/$learner/status")
kill -TERM "$learner"; wait "$learner" || true
limit_kib=$((vm_kib + 600 * 1024))
endpoint="tcp://127.0.0.1:$(free_port)"
( ulimit -v "$limit_kib"
  exec "$learner_bin" --config "$config" --set "transport.bind=$endpoint" --set run_dir="$tmp/run5" \
    --set env.num_envs=8192 --set ppo.rollout_length=1024 --set learner.progress_interval_s=100 ) > "$tmp/l5.log" 2>&1 &
learner=$!
pids+=("$learner")
worker "$tmp/w5.log" --set env.num_envs=8192
rc=0; wait "$learner" || rc=$?
wait "$worker" || true
[ "$rc" -eq 1 ] || { cat "$tmp/l5.log"; fail "the learner under ulimit -v exited $rc, expected 1"; }
grep -q "memory budget is .* MiB (RLIMIT_AS (ulimit -v) of" "$tmp/l5.log" ||
  { cat "$tmp/l5.log"; fail "the refusal does not name the limit"; }
echo "ok: $(grep -m 1 -o 'the run needs about.*' "$tmp/l5.log")"

# --- 4. the check off: an allocation fails mid-run ------------------------------------------------
endpoint="tcp://127.0.0.1:$(free_port)"
( ulimit -v "$limit_kib"
  exec "$learner_bin" --config "$config" --set "transport.bind=$endpoint" --set run_dir="$tmp/run6" \
    --set env.num_envs=8192 --set ppo.rollout_length=1024 --set learner.memory_budget_mb=-1 \
    --set total_env_steps=30000000 --set stop_at_target=false --set learner.progress_interval_s=100 ) > "$tmp/l6.log" 2>&1 &
learner=$!
pids+=("$learner")
worker "$tmp/w6.log" --set env.num_envs=8192
rc=0; wait "$learner" || rc=$?
wrc=0; wait "$worker" || wrc=$?
[ "$rc" -eq 1 ] || { cat "$tmp/l6.log"; fail "the learner that ran out of memory exited $rc, expected 1"; }
grep -Eq "can't allocate memory|out of memory" "$tmp/l6.log" || { cat "$tmp/l6.log"; fail "no word of memory"; }
! grep -q "non-finite" "$tmp/l6.log" || { cat "$tmp/l6.log"; fail "an allocation failure was reported as a divergence"; }
[ "$wrc" -eq 0 ] || { cat "$tmp/w6.log"; fail "the worker was not told to stop ($wrc)"; }
grep -q "learner says stop" "$tmp/w6.log" || { cat "$tmp/w6.log"; fail "the worker did not hear Stop"; }
echo "ok: $(grep -m 1 -Eo "stopping: .*" "$tmp/l6.log")"

# --- 5. a resume that no longer fits ------------------------------------------------------------------
# The run of case 2 resumed with a budget it cannot fit: refused at the first Hello before anything is written,
# so its config.yaml, policy_spec.json and checkpoints are as they were.
before=$(cd "$tmp/run3" && md5sum config.yaml policy_spec.json checkpoints/latest)
endpoint="tcp://127.0.0.1:$(free_port)"
"$learner_bin" --resume "$tmp/run3" --set "transport.bind=$endpoint" --set learner.memory_budget_mb=1 \
  --set total_env_steps=800000 --set learner.progress_interval_s=100 > "$tmp/l7.log" 2>&1 &
learner=$!
pids+=("$learner")
worker "$tmp/w7.log" --set env.num_envs=1024
rc=0; wait "$learner" || rc=$?
wait "$worker" || true
[ "$rc" -eq 1 ] || { cat "$tmp/l7.log"; fail "the resume that cannot fit exited $rc, expected 1"; }
grep -q "the run needs about .* but the memory budget is 1.0 MiB" "$tmp/l7.log" ||
  { cat "$tmp/l7.log"; fail "the resume's refusal does not give the figures"; }
after=$(cd "$tmp/run3" && md5sum config.yaml policy_spec.json checkpoints/latest)
[ "$before" = "$after" ] || { echo "$before"; echo "$after"; fail "a resume refused for memory changed the run directory"; }
echo "ok: a resume that cannot fit is refused and leaves the run directory as it was"
