#!/usr/bin/env bash
# farm-eval and farm-export on a real (tiny) CartPole run: trains 3000 env
# steps, evaluates 5 episodes, exports TorchScript and checks in Python that
# torch.jit.load's module gives the C++ policy's actions exactly.
# Usage: export_test.sh BUILD_DIR [CONFIG [KEY=VALUE ...]] (default configs/cartpole.yaml; the overrides
# go to the training run, e.g. ppo.core=gru: the module then takes and returns the core's state, and the check
# steps one env's observations through it, a new episode midway). Needs python3-torch (Debian package).
build_dir="$1"
config="${2:-configs/cartpole.yaml}"
shift $(( $# > 1 ? 2 : 1 ))
source "$(dirname "$0")/lib.sh"
extra=()
for kv in "$@"; do extra+=(--set "$kv"); done

find_torch_python
for bin in tools/farm-eval tools/farm-export learner/farm-learner worker/farm-worker; do
  [ -x "$build_dir/$bin" ] || fail "$build_dir/$bin is not built"
done

FARM_BUILD_DIR="$build_dir" "$root/scripts/farm" run "$root/$config" --workers 1 \
  --set total_env_steps=3000 --set stop_at_target=false --set run_dir="$tmp/run" \
  --set learner.checkpoint_every=0 --set learner.progress_interval_s=5 "${extra[@]}"
[ -f "$tmp/run/policy_spec.json" ] || fail "the learner wrote no $tmp/run/policy_spec.json"
[ -f "$tmp/run/checkpoints/latest" ] || fail "the learner wrote no checkpoint"

"$build_dir/tools/farm-eval" "$tmp/run" --episodes 5 >"$tmp/eval.json" || fail "farm-eval exited with status $?"
"$torch_python" - "$tmp/eval.json" <<'PY'
import json, math, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, f"farm-eval should print one JSON line, got {lines!r}"
r = json.loads(lines[0])
print("eval:", json.dumps(r))
assert r["episodes"] == 5, r
for key in ("mean_return", "std_return", "min", "max", "mean_length"):
    assert isinstance(r[key], (int, float)) and math.isfinite(r[key]), (key, r[key])
assert r["min"] <= r["mean_return"] <= r["max"], r
assert r["mean_length"] >= 1 and r["env_steps_trained"] >= 3000, r
assert r["checkpoint"].endswith(".pt"), r
PY

"$build_dir/tools/farm-export" "$tmp/run" "$tmp/policy.pt" --check-file "$tmp/check.json" \
  || fail "farm-export exited with status $?"
[ -f "$tmp/policy.pt" ] || fail "farm-export wrote no $tmp/policy.pt"

"$torch_python" - "$tmp/policy.pt" "$tmp/check.json" <<'PY'
import collections, json, sys
import torch
module = torch.jit.load(sys.argv[1])
check = json.load(open(sys.argv[2]))
x = torch.tensor(check["inputs"], dtype=torch.float32).reshape(-1, *check["obs_shape"])
with torch.no_grad():
    if "episode_start" in check:  # a recurrent policy: one env's steps, the state carried, a new episode midway
        state, steps = module.initial_state(1), []
        for i in range(x.shape[0]):
            if i == check["episode_start"]:
                state = module.initial_state(1)
            a, state = module(x[i:i + 1], state)
            steps.append(a)
        actions = torch.cat(steps)
    else:
        actions = module(x)
assert actions.shape[0] == x.shape[0], (actions.shape, x.shape)
if check["action_kind"] in ("discrete", "multi_discrete"):  # int64 [B] or [B, K]: exactly Act's modes
    assert actions.dtype == torch.int64, actions.dtype
    assert actions.tolist() == check["actions"], (actions.tolist(), check["actions"])
    print(check["action_kind"], "actions match exactly:", dict(collections.Counter(map(str, actions.tolist()))))
else:
    expected = torch.tensor(check["actions"], dtype=torch.float32)
    assert actions.dtype == torch.float32, actions.dtype
    diff = (actions.reshape(expected.shape) - expected).abs().max().item()
    assert diff <= 1e-6, diff
    print("box actions match, max difference", diff)
print("ok:", len(check["inputs"]), "samples")
PY
