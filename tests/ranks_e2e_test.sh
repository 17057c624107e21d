#!/usr/bin/env bash
# Data-parallel learner ranks for real: `scripts/farm run --learners 2` (torchrun's environment, Gloo on the
# loopback), one case per argument:
#   target    CartPole with env.normalize_obs, 2 ranks x 1 worker, reaches its target: rank 0 writes the
#             checkpoints and the run's summary (world_size, both ranks' figures, equal parameter checksums), rank 1
#             only its logs under ranks/rank1; the normaliser's statistics hold both ranks' observations; nothing
#             left running.
#   kill      kill -9 of rank 1 mid-run: rank 0 stops in order (final checkpoint, its worker told to stop) within
#             learner.collective_timeout_s, the launcher's status is non-zero and names rank 1, no process is left;
#             then --resume of both ranks finishes the run from rank 0's checkpoint.
#   hang      rank 1 frozen (SIGSTOP) mid-run: rank 0's collective times out after learner.collective_timeout_s (5 s),
#             it stops in order with its final checkpoint, and the launcher stops the frozen rank, returning non-zero.
#   scale     uav_coverage, 2 ranks x 8 workers for 60 s (max_wall_seconds): no worker lost on either rank, both
#             stop together.
#   straggler CartPole, 2 ranks x 1 worker with learner.sync_fraction 0.5, rank 1's worker held to a quarter of the
#             time (SIGSTOP/SIGCONT): rank 0's full rollouts end rank 1's early (at least a quarter of
#             ppo.rollout_length), rank 0's are whole, and the ranks stay identical (checksums, updates).
# Usage: ranks_e2e_test.sh BUILD_DIR CASE
build_dir="$1"
case_name="$2"
source "$(dirname "$0")/lib.sh"
export FARM_BUILD_DIR="$build_dir" FARM_SKIP_BUILD=1

# summary KEY [FILE]: a key of rank 0's summary.json (or FILE's).
summary() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "${2:-$tmp/run/summary.json}" "$1"; }
no_processes_left() {
  if pgrep -f "run_dir=$tmp/run" >/dev/null; then
    pgrep -af "run_dir=$tmp/run" >&2
    fail "processes of the run are still there"
  fi
}

# fault_on_rank1 SIGNAL TIMEOUT_S WITHIN_S LAUNCHER_LINE: a long CartPole run of 2 ranks with
# learner.collective_timeout_s TIMEOUT_S; once it trains, SIGNAL to rank 1; the launcher must return non-zero within
# WITHIN_S saying LAUNCHER_LINE, rank 0 having said its collective failed and written its final checkpoint, and
# nothing of the run may be left.
fault_on_rank1() {
  local signal="$1" timeout_s="$2" within="$3" line="$4" farm rank1 start rc=0
  "$root/scripts/farm" run "$root/configs/cartpole.yaml" --learners 2 --workers 2 --set "run_dir=$tmp/run" \
    --set total_env_steps=100000000 --set stop_at_target=false --set "learner.collective_timeout_s=$timeout_s" \
    --set learner.progress_interval_s=100 --set learner.checkpoint_every=10 > "$tmp/log" 2>&1 &
  farm=$!
  pids+=("$farm")
  wait_until 90 has_rows "$tmp/run/metrics.jsonl" 15 || { tail -30 "$tmp/log"; fail "the run did not start training"; }
  rank1="$(pgrep -f "farm-learner.*run_dir=$tmp/run.*endpoint-1" || true)"
  [ -n "$rank1" ] || fail "no rank 1 learner found"
  kill "$signal" "$rank1"
  start=$SECONDS
  wait_until "$within" eval '! running "$farm"' ||
    { tail -30 "$tmp/log"; fail "the launcher still runs $within s after kill $signal of rank 1"; }
  wait "$farm" || rc=$?
  echo "the launcher returned $rc after $((SECONDS - start)) s"
  [ "$rc" -ne 0 ] || fail "the launcher reported success after kill $signal of rank 1"
  grep -q "$line" "$tmp/log" || { tail -20 "$tmp/log"; fail "the launcher did not say '$line'"; }
  grep -q "rank 0 of 2: .* failed" "$tmp/log" || { tail -20 "$tmp/log"; fail "rank 0 did not say its collective failed"; }
  grep -q "checkpoint written: $tmp/run/checkpoints/" "$tmp/log" || { tail -20 "$tmp/log"; fail "rank 0 wrote no final checkpoint"; }
  no_processes_left
}

case "$case_name" in
  target)
    "$root/scripts/farm" run "$root/configs/cartpole.yaml" --learners 2 --workers 2 --set "run_dir=$tmp/run" \
      --set env.normalize_obs=true --set learner.progress_interval_s=100 > "$tmp/log" 2>&1 ||
      { tail -40 "$tmp/log"; fail "the run failed"; }
    reason="$(summary stop_reason)"
    [[ "$reason" == *target_return* ]] || fail "rank 0 stopped for '$reason', not the target"
    [ "$(summary world_size)" = 2 ] || fail "summary.json: world_size is not 2"
    python3 - "$tmp/run/summary.json" "$tmp/run/ranks/rank1/summary.json" <<'PY' || fail "the summaries disagree"
import json, sys
s0, s1 = (json.load(open(p)) for p in sys.argv[1:])
ranks = s0["ranks"]
assert len(ranks) == 2, ranks
assert ranks[0]["checksum"] == ranks[1]["checksum"] and ranks[0]["checksum"] != 0, ranks
assert all(r["workers"] == 1 and r["env_steps"] > 0 for r in ranks), ranks
assert s0["env_steps_all_ranks"] >= s0["env_steps"] + 1, s0
assert s0["updates"] == s1["updates"] and s0["policy_version"] == s1["policy_version"], (s0["updates"], s1["updates"])
assert s1["rank"] == 1 and s0["rank"] == 0
# The statistics every worker normalises with hold both ranks' observations (workers send theirs about once per
# rollout: a few of the last ones may be missing), not one rank's.
for s in (s0, s1):
    assert s["normalizer_observations"] >= 0.95 * s0["env_steps_all_ranks"], (s["normalizer_observations"], s0)
    assert s["normalizer_observations"] > 1.5 * s["env_steps"], s
print(f"ranks agree: {s0['updates']} updates, checksum {ranks[0]['checksum']:.0f}, "
      f"{s0['env_steps_all_ranks']:.0f} env steps over both, stop: {s0['stop_reason']}")
PY
    compgen -G "$tmp/run/checkpoints/ckpt-*.pt" >/dev/null || fail "rank 0 wrote no checkpoint"
    ! compgen -G "$tmp/run/ranks/rank1/checkpoints/ckpt-*.pt" >/dev/null || fail "rank 1 wrote checkpoints"
    has_rows "$tmp/run/ranks/rank1/metrics.jsonl" 1 || fail "rank 1 wrote no metrics"
    # Rank 0 alone prints the run's summary on stdout: one line of JSON in the launcher's output.
    [ "$(grep -c '^{"acting_precision"' "$tmp/log")" -eq 1 ] || fail "expected one summary line on stdout"
    no_processes_left
    echo "ok: 2 ranks reached the target together"
    ;;
  kill)
    # Rank 1 killed: rank 0 stops in order at once (rank 1's sockets close).
    fault_on_rank1 -KILL 10 25 "learner rank 1 exited with status 137"
    before="$(summary updates)"
    # The whole group again, from rank 0's checkpoint, to a total within reach.
    steps="$(summary env_steps)"
    total=$((2 * steps + 20000))
    "$root/scripts/farm" run --resume "$tmp/run" --learners 2 --workers 2 --set "total_env_steps=$total" \
      --set learner.collective_timeout_s=10 > "$tmp/log2" 2>&1 || { tail -30 "$tmp/log2"; fail "--resume failed"; }
    grep -q "resumed $tmp/run/checkpoints/ckpt-" "$tmp/log2" || fail "the ranks did not resume from rank 0's checkpoint"
    # The checkpoint counts the run's env steps over both ranks, not rank 0's alone; each rank resumes with half.
    resumed_at="$(sed -n 's/.*resuming .*: \([0-9]*\) env steps,.*/\1/p' "$tmp/log2" | sed -n 1p)"
    [ -n "$resumed_at" ] && [ "$resumed_at" -ge $((steps * 3 / 2)) ] ||
      fail "the checkpoint counts '$resumed_at' env steps, not the run's over both ranks (rank 0's own: $steps)"
    after="$(summary updates)"
    reason="$(summary stop_reason)"
    [[ "$reason" == *"total_env_steps ($total) over 2 ranks"* ]] || fail "the resumed run stopped for '$reason'"
    [ "$after" -gt "$before" ] || fail "no update after --resume ($before -> $after)"
    no_processes_left
    echo "ok: rank 0 stopped in order after rank 1 was killed; --resume went from update $before to $after"
    ;;
  hang)
    # Rank 1 frozen: rank 0's collective times out (5 s); the launcher stops the frozen rank 10 s after rank 0 left.
    fault_on_rank1 -STOP 5 60 "learner rank 0 exited with status 1"
    echo "ok: rank 0 stopped in order after rank 1 froze; the launcher stopped rank 1"
    ;;
  scale)
    "$root/scripts/farm" run "$root/configs/uav_coverage.yaml" --learners 2 --workers 16 --set "run_dir=$tmp/run" \
      --set total_env_steps=100000000 --set max_wall_seconds=60 --set learner.progress_interval_s=100 \
      > "$tmp/log" 2>&1 || { tail -40 "$tmp/log"; fail "the run failed"; }
    for s in "$tmp/run/summary.json" "$tmp/run/ranks/rank1/summary.json"; do
      lost="$(summary workers_lost "$s")"
      joined="$(summary workers_joined "$s")"
      [ "$lost" = 0 ] || fail "$s: $lost workers lost"
      [ "$joined" = 8 ] || fail "$s: $joined workers joined, expected 8"
    done
    reason="$(summary stop_reason)"
    [[ "$reason" == *max_wall_seconds* ]] || fail "rank 0 stopped for '$reason'"
    echo "ok: 2 ranks x 8 workers, none lost: $(summary env_steps_all_ranks) env steps, $(summary updates) updates"
    no_processes_left
    ;;
  straggler)
    "$root/scripts/farm" run "$root/configs/cartpole.yaml" --learners 2 --workers 2 --set "run_dir=$tmp/run" \
      --set total_env_steps=100000000 --set stop_at_target=false --set max_wall_seconds=30 \
      --set learner.sync_fraction=0.5 --set learner.progress_interval_s=100 > "$tmp/log" 2>&1 &
    farm=$!
    pids+=("$farm")
    worker1=""
    wait_until 90 eval 'worker1="$(pgrep -f "farm-worker.*run_dir=$tmp/run.*--index 1" || true)"; [ -n "$worker1" ]' ||
      { tail -30 "$tmp/log"; fail "no worker of rank 1 found"; }
    # Rank 1's worker runs 10 ms of every 40 until it exits.
    ( while kill -STOP "$worker1" 2>/dev/null; do sleep 0.03; kill -CONT "$worker1" 2>/dev/null || break; sleep 0.01; done ) &
    pids+=("$!")
    wait "$farm" || { tail -40 "$tmp/log"; fail "the run failed"; }
    python3 - "$tmp/run/summary.json" "$tmp/run/ranks/rank1/summary.json" <<'PY' || fail "rank 1's rollouts were not cut as expected"
import json, sys
s0, s1 = (json.load(open(p)) for p in sys.argv[1:])
r0, r1 = s0["ranks"]
T = 32  # configs/cartpole.yaml's ppo.rollout_length
assert r0["checksum"] == r1["checksum"] and r0["checksum"] != 0, (r0, r1)
assert s0["updates"] == s1["updates"] and s0["updates"] >= 10, (s0["updates"], s1["updates"])
assert s0["sync_fraction"]["ranks_needed"] == 1, s0["sync_fraction"]
assert r1["cut_rollouts"] >= 0.5 * r1["rollouts"] and r1["cut_rollouts"] >= 5, r1
assert r0["cut_rollouts"] <= 0.2 * r0["rollouts"], r0
assert T / 4 <= r1["cut_mean_length"] < T, r1
assert s1["sync_fraction"]["cut_dropped_row_steps"] >= 0, s1["sync_fraction"]
print(f"rank 1 cut {r1['cut_rollouts']:.0f} of {r1['rollouts']:.0f} rollouts (mean length {r1['cut_mean_length']:.1f} "
      f"of {T}), rank 0 {r0['cut_rollouts']:.0f} of {r0['rollouts']:.0f}; {s0['updates']} updates, "
      f"{s0['env_steps_all_ranks']:.0f} env steps, env steps/s {r0['sps']:.0f} and {r1['sps']:.0f}")
PY
    no_processes_left
    echo "ok: the straggler's rollouts were cut"
    ;;
  *) fail "unknown case '$case_name' (target, kill, hang, scale or straggler)" ;;
esac
