#!/usr/bin/env bash
# Plots one MuJoCo episode from the table farm-eval --video writes beside the video (OUT.csv): each body's
# height, each body's forward (x) velocity and the return so far, against simulated time. Where no video can be
# rendered this is what shows how the robot moved (did it stand, fall, run).
#
#   scripts/plot_episode.sh EPISODE.csv [OUT.png]      (default OUT: EPISODE.png)
#
# Needs gnuplot (Debian: gnuplot-nox).
set -euo pipefail

die() { printf 'plot_episode: error: %s\n' "$*" >&2; exit 1; }

if [ $# -lt 1 ] || [ $# -gt 2 ]; then die "usage: scripts/plot_episode.sh EPISODE.csv [OUT.png]"; fi
csv="$1"
out="${2:-${csv%.csv}.png}"
[ -f "$csv" ] || die "'$csv' not found (farm-eval RUN_DIR --video OUT.gif writes OUT.csv)"
command -v gnuplot >/dev/null || die "gnuplot not found (apt-get install gnuplot-nox)"
header="$(head -n 1 "$csv")"
case "$header" in
  step,time,reward,return,*_z,*_vx,*_vz) ;;
  *) die "'$csv' is not an episode table (expected a header step,time,reward,return,<body>_z,<body>_vx,<body>_vz...)" ;;
esac
columns="$(awk -F, 'NR == 1 { print NF }' "$csv")"
rows="$(($(wc -l <"$csv") - 1))"
[ "$rows" -gt 0 ] || die "'$csv' holds no state"
bodies=$(((columns - 4) / 3))

# Paths travel as gnuplot arguments, never pasted into the script.
script="$(mktemp)"
trap 'rm -f "$script"' EXIT
cat >"$script" <<'EOF'
set terminal pngcairo size 1000,1000 enhanced font 'sans,10'
set output ARG2
set datafile separator ','
set grid
set key outside right top noenhanced
bodies = int(ARG3)
set multiplot layout 3,1 title ARG4 noenhanced font 'sans,12'
set title 'height of each body (its frame), m'
set xlabel 'simulated seconds'
plot for [b=0:bodies-1] ARG1 using 2:(column(5 + 3 * b)) with lines lw 1.5 title columnhead(5 + 3 * b)
set title 'forward (x) velocity of each body, m/s'
plot for [b=0:bodies-1] ARG1 using 2:(column(6 + 3 * b)) with lines lw 1.5 title columnhead(6 + 3 * b)
set title 'return so far'
plot ARG1 using 2:4 with lines lw 2 lc rgb '#1f77b4' title 'return'
unset multiplot
EOF
gnuplot -c "$script" "$csv" "$out" "$bodies" "$(basename "$csv" .csv): $((rows - 1)) steps"
printf 'plot_episode: wrote %s\n' "$out" >&2
