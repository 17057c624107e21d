#!/usr/bin/env bash
# farm-bench serve with env-shaped clients, for the configs `scripts/farm bench` serves: every client is
# welcomed (a refused one fails the bench with the learner's reason) and rows are served. It caught a bench
# whose clients' Hello left out the config's observation normalisation (configs/cartpole_novel.yaml): the
# learner refused them all and the recurrent case printed 0 rows/s.
# Usage: bench_serve_test.sh BUILD_DIR
build_dir="$1"
source "$(dirname "$0")/lib.sh"
bench="$build_dir/bench/farm-bench"
[ -x "$bench" ] || fail "no $bench: build the farm-bench target"

serve() {  # serve NAME CONFIG ENVS [--set ...]: one second of serving, its JSON line in $tmp/NAME.json
  local name="$1" config="$2" envs="$3"
  shift 3
  "$bench" --seconds 1 serve --config "$root/$config" --batch 1024 --envs "$envs" "$@" \
    > "$tmp/$name.json" 2> "$tmp/$name.err" || { cat "$tmp/$name.err" >&2; fail "$name: farm-bench serve failed"; }
  python3 - "$tmp/$name.json" "$name" <<'PY'
import json, sys
line = open(sys.argv[1]).read().strip().splitlines()[-1]
r = json.loads(line)
assert r["rows_per_second"] > 0, f"{sys.argv[2]}: no rows served: {line}"
assert r["agent_rows"] > 0, f"{sys.argv[2]}: the learner admitted no rows: {line}"
print(f"ok: {sys.argv[2]}: {r['rows_per_second']:.0f} rows/s")
PY
}

# Observations normalised, a GRU (the recurrent case's GRU side), and its MLP side.
serve novel_gru configs/cartpole_novel.yaml 256
serve novel_mlp configs/cartpole_novel.yaml 256 --set ppo.core=none
# Rewards normalised too.
serve novel_reward configs/cartpole_novel.yaml 256 --set env.normalize_reward=true
# Multi-agent with a global state (the map workload's shape).
serve uav configs/uav_coverage.yaml 16
echo "ok"
