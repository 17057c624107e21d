#!/usr/bin/env bash
# Encoders written in PyTorch end to end: examples/models/encoders.py scripts an MLP encoder for CartPole's [4]
# observation (Linear 4 -> 64, tanh) for the actor and one for the critic; the farm trains CartPole through them
# (ppo.hidden_sizes [64] after them: the built-in [64, 64] policy's layers) to a 100-episode mean >= 475
# (tests/e2e_train.sh), then tests/export_test.sh trains a short run with the same scripts and checks farm-eval,
# and that farm-export's module (the script a submodule of it) gives the C++ policy's actions in Python.
# Usage: scripted_encoder_e2e.sh BUILD_DIR. Needs python3-torch (Debian package).
build_dir="$1"
source "$(dirname "$0")/lib.sh"

find_torch_python

export PYTHONDONTWRITEBYTECODE=1
"$torch_python" "$root/examples/models/encoders.py" mlp --shape 4 --features 64 --seed 1 --out "$tmp/actor.pt"
"$torch_python" "$root/examples/models/encoders.py" mlp --shape 4 --features 64 --seed 2 --out "$tmp/critic.pt"
scripts=(ppo.actor_encoder_script="$tmp/actor.pt" ppo.critic_encoder_script="$tmp/critic.pt" "ppo.hidden_sizes=[64]")

"$root/tests/e2e_train.sh" "$build_dir" sync 7 "${scripts[@]}" || fail "CartPole through the scripted encoders"
"$root/tests/export_test.sh" "$build_dir" configs/cartpole.yaml "${scripts[@]}" \
  || fail "eval and export through the scripted encoders"
echo "PASS: CartPole trained, evaluated and exported through TorchScript encoders"
