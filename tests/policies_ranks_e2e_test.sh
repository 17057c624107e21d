#!/usr/bin/env bash
# Two policies x two learner ranks on CPU: `scripts/farm run configs/uav_teams.yaml --learners 2 --workers 2`,
# shrunk to end in seconds. Four learners (team_a's ranks 0 and 1 on one rendezvous port, team_b's on another),
# each worker reaching rank i % 2 of both policies. The run ends with status 0; each policy's run directory
# RUN/NAME has rank 0's final checkpoint and summary.json (world_size 2), its rank 1 only logs under
# RUN/NAME/ranks/rank1; no farm-learner or farm-worker of the run is left.
# Usage: policies_ranks_e2e_test.sh BUILD_DIR
build_dir="$(cd "$1" && pwd)"
source "$(dirname "$0")/lib.sh"
export FARM_BUILD_DIR="$build_dir" FARM_SKIP_BUILD=1

run="$tmp/run"
start=$SECONDS
rc=0
timeout 240 "$root/scripts/farm" run "$root/configs/uav_teams.yaml" --learners 2 --workers 2 \
  --set "run_dir=$run" --set total_env_steps=3000 --set env.num_envs=2 --set env.options.grid=16 \
  --set env.options.obstacles=5 --set env.options.max_steps=50 --set ppo.rollout_length=16 \
  --set "ppo.hidden_sizes=[32, 32]" --set ppo.update_epochs=1 --set ppo.num_minibatches=1 \
  --set learner.checkpoint_every=1000 --set learner.progress_interval_s=100 > "$tmp/log" 2>&1 || rc=$?
echo "scripts/farm run returned $rc after $((SECONDS - start)) s"
[ "$rc" -eq 0 ] || { tail -40 "$tmp/log"; fail "2 policies x 2 ranks: status $rc"; }
grep -q "2 policies: team_a team_b (2 learner ranks each)" "$tmp/log" || { head -20 "$tmp/log"; fail "the launcher did not say its plan"; }
for name in team_a team_b; do
  compgen -G "$run/$name/checkpoints/ckpt-*.pt" >/dev/null || { tail -30 "$tmp/log"; fail "$name: no final checkpoint"; }
  [ -f "$run/$name/summary.json" ] || fail "$name: no summary.json"
  python3 - "$run/$name/summary.json" <<'PY' || fail "$name: summary.json is not rank 0's of 2"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["world_size"] == 2 and s["rank"] == 0, (s.get("world_size"), s.get("rank"))
assert len(s["ranks"]) == 2 and s["ranks"][0]["checksum"] == s["ranks"][1]["checksum"], s["ranks"]
print(f"{sys.argv[1]}: {s['updates']} updates over 2 ranks, stop: {s['stop_reason']}")
PY
  [ -d "$run/$name/ranks/rank1" ] || fail "$name: no rank 1 directory"
  ! compgen -G "$run/$name/ranks/rank1/checkpoints/ckpt-*.pt" >/dev/null || fail "$name: rank 1 wrote checkpoints"
done
if pgrep -f "farm-(learner|worker).*run_dir=$run" >/dev/null; then
  pgrep -af "farm-(learner|worker).*run_dir=$run" >&2
  fail "processes of the run are still there"
fi
echo "ok: 2 policies x 2 ranks trained and stopped, nothing left"
