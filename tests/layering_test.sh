#!/usr/bin/env bash
# The dependency direction of docs/ARCHITECTURE.md, checked on every #include of the source tree:
#   proto <- common <- {worker, learner} <- tools, bench, tests
#   inside the learner: model <- run <- train <- serve <- learner/ (the Learner, its run builder and statistics)
#   inside learner/train: the update paths and losses never include the trainer's header (ppo.h)
# A file includes only its own layer and those before it. Fails naming each include that goes backwards.
# Usage: layering_test.sh
source "$(dirname "$0")/lib.sh"
cd "$root"

# The rank of a path's layer; a file may include a path whose rank is at most its own.
rank() {
  case "$1" in
    proto/*) echo 0 ;;
    common/*) echo 1 ;;
    worker/*|examples/*) echo 2 ;;
    learner/model/*) echo 3 ;;
    learner/run/*) echo 4 ;;
    learner/train/*) echo 5 ;;
    learner/serve/*) echo 6 ;;
    learner/*) echo 7 ;;
    *) echo 9 ;;  # tools, bench, tests: anything
  esac
}

bad=0
checked=0
while IFS= read -r file; do
  from="$(rank "$file")"
  while IFS= read -r inc; do
    [ -n "$inc" ] || continue
    checked=$((checked + 1))
    to="$(rank "$inc")"
    # Workers do not link LibTorch: worker/ never includes learner/, and the learner never includes worker/.
    if [[ "$file" == worker/* && "$inc" == learner/* ]] || [[ "$file" == learner/* && "$inc" == worker/* ]] ||
       [ "$to" -gt "$from" ]; then
      echo "backward include: $file includes \"$inc\"" >&2
      bad=$((bad + 1))
    fi
  done < <(sed -n 's/^#include "\(\(proto\|common\|worker\|learner\|examples\)\/[^"]*\)".*/\1/p' "$file")
done < <(git ls-files 'proto/*' 'common/*' 'worker/*' 'learner/*' 'examples/*' | grep -E '\.(h|cpp)$')
# Inside learner/train, the update paths and the losses stand on the ground floor (rollout.h, ppo_loss.h): none
# includes the trainer's header (ppo.h), which includes them.
while IFS= read -r file; do
  if grep -q '^#include "learner/train/ppo.h"' "$file"; then
    echo "backward include: $file includes \"learner/train/ppo.h\" (the trainer's header; use rollout.h, ppo_loss.h)" >&2
    bad=$((bad + 1))
  fi
done < <(git ls-files 'learner/train/rollout.h' 'learner/train/ppo_loss.*' 'learner/train/ppo_fused*' \
           'learner/train/ppo_graph*' 'learner/train/ppo_chunks*' 'learner/train/vtrace*' \
           'learner/train/gradient_reducer*' 'learner/train/value_norm*')
[ "$checked" -gt 100 ] || fail "only $checked includes checked: did the source layout change?"
[ "$bad" -eq 0 ] || fail "$bad includes go against the dependency direction (docs/ARCHITECTURE.md)"
echo "layering: $checked includes checked, none backwards"
