#!/usr/bin/env bash
# scripts/farm plot: one run (plot_run.sh) and several runs of one config (plot_seeds.py: the runs put on
# one grid of env steps, their mean and the band from the lowest to the highest), with its errors.
# Usage: plot_test.sh BUILD_DIR
build_dir="$1"
source "$(dirname "$0")/lib.sh"
export FARM_BUILD_DIR="$build_dir" FARM_SKIP_BUILD=1

# Three fake runs: returns 10*k + i*steps/1000 at steps 0, 1000, ..., with different lengths and row steps.
python3 - "$tmp" <<'PY'
import json, os, sys
tmp = sys.argv[1]
for k, (last, step) in enumerate([(10000, 1000), (8000, 500), (12000, 2000)]):
    os.makedirs(os.path.join(tmp, f"s{k}"))
    with open(os.path.join(tmp, f"s{k}", "metrics.jsonl"), "w") as f:
        for x in range(0, last + 1, step):
            f.write(json.dumps({"env_steps": x, "wall_seconds": x / 1000, "sps": 1000.0,
                                "mean_return_100": 10.0 * k + (k + 1) * x / 1000}) + "\n")
        f.write('{"env_steps": 99')  # a line cut by a kill: skipped
PY
png_ok() { [ -s "$1" ] && [ "$(head -c 4 "$1" | od -An -c | tr -d ' ')" = "211PNG" ]; }

"$root/scripts/farm" plot "$tmp/s0" "$tmp/one.png"
png_ok "$tmp/one.png" || fail "one run: no PNG"

"$root/scripts/farm" plot "$tmp/s0" "$tmp/s1" "$tmp/s2" --target 25 --title "three seeds" --table "$tmp/grid.txt"
png_ok "$tmp/seeds.png" || fail "several runs: no PNG at the default place (beside the first run)"
python3 - "$tmp/grid.txt" <<'PY'
import sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1])]
assert len(rows) == 200, len(rows)
# The common range is that of the shortest run: 0 .. 8000 steps.
assert rows[0][0] == 0 and rows[-1][0] == 8000, (rows[0], rows[-1])
for x, mean, lo, hi in rows:
    ys = [10 * k + (k + 1) * x / 1000 for k in range(3)]
    assert abs(mean - sum(ys) / 3) < 1e-9 and abs(lo - min(ys)) < 1e-9 and abs(hi - max(ys)) < 1e-9, (x, mean, lo, hi)
print("ok: the grid's mean, lowest and highest are the runs' own at", len(rows), "points")
PY
"$root/scripts/farm" plot "$tmp/s0" "$tmp/s2" --out "$tmp/two.png"
png_ok "$tmp/two.png" || fail "--out: no PNG"

# Errors name what is wrong.
mkdir "$tmp/empty"
out="$("$root/scripts/farm" plot "$tmp/s0" "$tmp/empty" --out "$tmp/x.png" 2>&1)" && fail "a run without metrics was plotted"
grep -q "empty/metrics.jsonl' not found" <<<"$out" || fail "unexpected message: $out"
out="$("$root/scripts/farm" plot "$tmp/s0" --target 3 2>&1)" && fail "--target with one run was accepted"
grep -q "are for several runs" <<<"$out" || fail "unexpected message: $out"
out="$("$root/scripts/farm" plot "$tmp/s0" "$tmp/s1" --bogus 2>&1)" && fail "an unknown option was accepted"
grep -q "unknown option '--bogus'" <<<"$out" || fail "unexpected message: $out"
echo "ok"
