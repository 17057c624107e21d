#!/usr/bin/env bash
# examples/models/encoders.py's FarmCnn and FarmImpala are the built-in cnn and impala encoders (their docstrings
# say a run with the script is the built-in run): a one-update uav_coverage run with each built-in encoder is
# exported, and tests/python/encoders_match.py loads the export's encoder parameters into the example's module,
# in order and shape for shape, and checks its actions against the C++ policy's on 256 observations, and that the
# example's farm_init starts each tensor where the built-in encoder does (its norm).
# Usage: encoders_example_test.sh BUILD_DIR. Needs python3-torch (Debian package).
build_dir="$1"
source "$(dirname "$0")/lib.sh"

find_torch_python
export PYTHONDONTWRITEBYTECODE=1

# KIND STAGES...: one update of 1 worker x 2 envs (rollout 8), exported, matched. encoders_match.py applies the
# trunk as Linear layers with tanh between them: the activation and layer_norm are set to that here, whatever the
# config says.
match() {
  local kind="$1"; shift
  local run="$tmp/$kind" sets=(--set ppo.encoder="$kind" --set ppo.activation=tanh --set ppo.layer_norm=false)
  [ $# -eq 0 ] || sets+=(--set "ppo.impala_channels=[$(IFS=,; echo "$*")]")
  FARM_BUILD_DIR="$build_dir" "$root/scripts/farm" run "$root/configs/uav_coverage.yaml" --workers 1 \
    --set env.num_envs=2 --set ppo.rollout_length=8 --set ppo.num_minibatches=1 --set total_env_steps=16 \
    --set stop_at_target=false --set run_dir="$run" --set learner.checkpoint_every=0 "${sets[@]}" \
    > "$tmp/$kind.log" 2>&1 || { tail -20 "$tmp/$kind.log"; fail "the $kind run exited with status $?"; }
  "$build_dir/tools/farm-export" "$run" "$tmp/$kind.pt" --check-file "$tmp/$kind.json" --samples 256 --seed 3 \
    || fail "farm-export of the $kind run exited with status $?"
  "$torch_python" "$root/tests/python/encoders_match.py" "$kind" "$tmp/$kind.pt" "$tmp/$kind.json" "$@" \
    || fail "encoders.py's $kind is not the built-in $kind encoder"
}
match impala 16 32
match cnn
echo "PASS: encoders.py's FarmImpala and FarmCnn are the built-in impala and cnn encoders"
