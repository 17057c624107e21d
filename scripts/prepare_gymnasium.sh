#!/usr/bin/env bash
# Prepares Gymnasium's MuJoCo model files, unmodified, outside the source tree, for the check that the farm's own
# models (worker/envs/mujoco/models) are physically Gymnasium's:
#   scripts/prepare_gymnasium.sh DIR [GYMNASIUM_GIT]
# clones Gymnasium v1.0.0's gymnasium/envs/mujoco/assets, the files its v4 tasks load (its public source on GitHub
# by default; a local mirror works too), into DIR and prints the assets folder. 0.29.1's swimmer.xml differs only in
# turning collisions off with collision="predefined" instead of contype 0. E.g.
#   cmake -B build -DFARM_GYMNASIUM_ASSETS=$(scripts/prepare_gymnasium.sh /opt/gymnasium | tail -n 1)
#   ctest --test-dir build -R mujoco_gymnasium_models
# Nothing here is a build or test dependency of the farm: without FARM_GYMNASIUM_ASSETS that test is not
# registered.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 DIR [GYMNASIUM_GIT]" >&2; exit 2; }
dir="$1"
url="${2:-https://github.com/Farama-Foundation/Gymnasium.git}"
tag=v1.0.0
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
if [ ! -f "$dir/Gymnasium/.farm-tag" ] || [ "$(cat "$dir/Gymnasium/.farm-tag")" != "$tag" ]; then
  rm -rf "${dir:?}/Gymnasium"
  echo "cloning Gymnasium $tag (gymnasium/envs/mujoco/assets) from $url" >&2
  git clone -q --no-checkout "$url" "$dir/Gymnasium" >&2
  git -C "$dir/Gymnasium" checkout -q "$tag" -- gymnasium/envs/mujoco/assets >&2
  echo "$tag" > "$dir/Gymnasium/.farm-tag"
fi
echo "$dir/Gymnasium/gymnasium/envs/mujoco/assets"
