#!/usr/bin/env bash
# Plots a run from its metrics.jsonl: mean return of the last 100 episodes
# against env steps, and steps per second against wall-clock seconds.
#
#   scripts/plot_run.sh RUN_DIR [OUT.png]      (default OUT: RUN_DIR/plot.png)
#
# Needs python3 and gnuplot (Debian: gnuplot-nox).
set -euo pipefail

die() { printf 'plot_run: error: %s\n' "$*" >&2; exit 1; }

if [ $# -lt 1 ] || [ $# -gt 2 ]; then die "usage: scripts/plot_run.sh RUN_DIR [OUT.png]"; fi
run_dir="${1%/}"
out="${2:-$run_dir/plot.png}"
metrics="$run_dir/metrics.jsonl"
[ -f "$metrics" ] || die "'$metrics' not found (is '$run_dir' a run directory?)"
command -v python3 >/dev/null || die "python3 not found (apt-get install python3)"
command -v gnuplot >/dev/null || die "gnuplot not found (apt-get install gnuplot-nox)"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# JSON lines -> whitespace columns: env_steps wall_seconds sps mean_return_100,
# "?" for null or absent (gnuplot's missing-value marker). Prints how many rows
# have a return and how many have sps, so panels without data get a note
# instead of a gnuplot error.
counts="$(python3 - "$metrics" "$tmp/data" <<'EOF'
import json, math, sys

src, dst = sys.argv[1], sys.argv[2]
keys = ("env_steps", "wall_seconds", "sps", "mean_return_100")
rows, with_return, with_sps = 0, 0, 0

def cell(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return "?"
    return repr(float(v))

with open(src) as f, open(dst, "w") as out:
    out.write("# " + " ".join(keys) + "\n")
    for n, line in enumerate(f, 1):
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            # The learner may be writing the last line right now.
            print(f"plot_run: skipping line {n} of {src}: {e}", file=sys.stderr)
            continue
        if not isinstance(obj, dict):
            continue
        cells = [cell(obj.get(k)) for k in keys]
        out.write(" ".join(cells) + "\n")
        rows += 1
        with_return += cells[0] != "?" and cells[3] != "?"
        with_sps += cells[1] != "?" and cells[2] != "?"
print(rows, with_return, with_sps)
EOF
)"
read -r rows with_return with_sps <<<"$counts"
[ "$rows" -gt 0 ] || die "'$metrics' holds no metrics yet"

title="$(basename "$(cd "$run_dir" && pwd)")"
# Paths and the title travel as gnuplot arguments (ARG1..ARG5), never pasted
# into the script, so quotes in them cannot break it.
cat >"$tmp/plot.gp" <<'EOF'
data = ARG1
set terminal pngcairo size 1000,800 enhanced font 'sans,10'
set output ARG2
set datafile missing '?'
set grid
set key off
set multiplot layout 2,1 title ARG3 noenhanced font 'sans,12'
set title 'mean return (last 100 episodes)'
set xlabel 'env steps'
set ylabel 'return'
set format x '%.1s%c'
if (ARG4 eq '1') {
  plot data using 1:4 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#1f77b4'
} else {
  set label 1 'no finished episodes yet' at graph 0.5, graph 0.5 center
  unset xtics; unset ytics
  plot [0:1][0:1] NaN
  unset label 1; set xtics; set ytics
}
set title 'throughput'
set xlabel 'wall seconds'
set ylabel 'env steps / s'
set format x '%g'
if (ARG5 eq '1') {
  plot data using 2:3 with linespoints pt 7 ps 0.4 lw 2 lc rgb '#d62728'
} else {
  set label 1 'no sps recorded' at graph 0.5, graph 0.5 center
  unset xtics; unset ytics
  plot [0:1][0:1] NaN
  unset label 1
}
unset multiplot
EOF
has_return=0; [ "$with_return" -gt 0 ] && has_return=1
has_sps=0; [ "$with_sps" -gt 0 ] && has_sps=1
gnuplot -c "$tmp/plot.gp" "$tmp/data" "$out" "$title" "$has_return" "$has_sps"
printf 'plot_run: wrote %s\n' "$out" >&2
