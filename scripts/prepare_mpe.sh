#!/usr/bin/env bash
# Prepares PettingZoo's MPE envs, unmodified, for the Python worker, outside the source tree:
#   scripts/prepare_mpe.sh DIR [PETTINGZOO_GIT] [GYMNASIUM_GIT]
# clones PettingZoo 1.24.3 and Gymnasium 0.29.1 (their public sources on GitHub by default; a local mirror works
# too) into DIR, installs the Debian packages they need (python3-numpy, python3-pygame, python3-cloudpickle; as
# root, else it prints the apt-get line), writes a stand-in for farama_notifications (Gymnasium imports it only to
# print notices; Debian has no package for it), checks the envs with $FARM_PYTHON (default /usr/bin/python3, whose
# packages the Debian ones are) and prints the PYTHONPATH to train with, e.g.
#   export PYTHONPATH=$(scripts/prepare_mpe.sh /opt/mpe | tail -n 1)
#   scripts/farm train examples/python/mpe_spread.yaml
# Nothing here is a build or test dependency of the farm.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 DIR [PETTINGZOO_GIT] [GYMNASIUM_GIT]" >&2; exit 2; }
dir="$1"
pettingzoo_git="${2:-https://github.com/Farama-Foundation/PettingZoo.git}"
gymnasium_git="${3:-https://github.com/Farama-Foundation/Gymnasium.git}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"

packages=(python3-numpy python3-pygame python3-cloudpickle python3-typing-extensions)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" > /dev/null || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then
    apt-get install -y -q "${missing[@]}" >&2
  else
    echo "missing Debian packages; run as root: apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi

clone() {  # clone URL TAG NAME PACKAGE: the package's folder at TAG in $dir/NAME (kept when already there at TAG)
  local url="$1" tag="$2" name="$3" package="$4"
  if [ -f "$dir/$name/.farm-tag" ] && [ "$(cat "$dir/$name/.farm-tag")" = "$tag" ]; then
    return 0
  fi
  rm -rf "${dir:?}/$name"
  echo "cloning $name $tag ($package/) from $url" >&2
  git clone -q --no-checkout "$url" "$dir/$name" >&2
  git -C "$dir/$name" checkout -q "$tag" -- "$package" >&2  # the package alone: no docs, media or tests
  echo "$tag" > "$dir/$name/.farm-tag"
}
clone "$pettingzoo_git" 1.24.3 PettingZoo pettingzoo
clone "$gymnasium_git" v0.29.1 Gymnasium gymnasium

mkdir -p "$dir/stubs/farama_notifications"
echo '"""Stand-in for farama_notifications: Gymnasium imports it only to print notices."""' \
  > "$dir/stubs/farama_notifications/__init__.py"

path="$dir/PettingZoo:$dir/Gymnasium:$dir/stubs"
# The check: each MPE env the examples use builds and resets.
PYTHONPATH="$path" SDL_AUDIODRIVER=dummy "${FARM_PYTHON:-/usr/bin/python3}" - >&2 <<'PY'
import pettingzoo, gymnasium
from pettingzoo.mpe import simple_adversary_v3, simple_speaker_listener_v4, simple_spread_v3, simple_tag_v3
for m in (simple_spread_v3, simple_speaker_listener_v4, simple_adversary_v3, simple_tag_v3):
    env = m.parallel_env(continuous_actions=False)
    env.reset(seed=1)
    spaces = {a: (env.observation_space(a).shape, env.action_space(a).n) for a in env.possible_agents}
    print(f"{m.__name__.split('.')[-1]}: {spaces}, state {env.state().shape}")
print(f"PettingZoo {pettingzoo.__version__}, Gymnasium {gymnasium.__version__}")
PY
echo "$path"
