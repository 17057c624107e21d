#!/usr/bin/env python3
"""Draws several runs of one config (seeds) into one PNG: each run's 100-episode mean return against env
steps as a thin line, their mean as a thick line and the band between the lowest and the highest run, with
the target as a dashed line when given. Runs are put on a common grid of env steps by linear interpolation
between their metrics rows, up to the shortest run's last row (so the mean never mixes in fewer runs).

    scripts/plot_seeds.py --out OUT.png [--title T] [--target R] RUN_DIR RUN_DIR [...]

Called by `scripts/farm plot RUN_DIR RUN_DIR ... [--out OUT.png]` and by scripts/bench_learning.py.
Needs gnuplot (Debian: gnuplot-nox); no Python packages beyond the standard library.
"""
import argparse
import json
import math
import re
import shutil
import os
import subprocess
import sys
import tempfile


def die(msg):
    print(f"plot_seeds: error: {msg}", file=sys.stderr)
    sys.exit(1)


def curve(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        die(f"'{path}' not found (is '{run_dir}' a run directory?)")
    points = []
    with open(path) as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line being written, or cut by a kill
            x, y = row.get("env_steps"), row.get("mean_return_100")
            if isinstance(x, (int, float)) and isinstance(y, (int, float)) and math.isfinite(y):
                points.append((float(x), float(y)))
    points.sort()
    if len(points) < 2:
        die(f"'{path}' has fewer than two rows with a mean return")
    return points


def interpolate(points, x):
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR")
    ap.add_argument("--out", required=True, metavar="OUT.png")
    ap.add_argument("--title", default=None)
    ap.add_argument("--target", type=float, default=None, help="draw this return as a dashed line")
    ap.add_argument("--points", type=int, default=200, help="grid points (default %(default)s)")
    ap.add_argument("--table", metavar="FILE", help="also write the grid as text: env_steps mean lowest highest")
    args = ap.parse_args()
    if args.points < 2:
        die(f"--points {args.points}: at least 2 are needed")
    curves = [curve(r) for r in args.runs]
    lo = max(c[0][0] for c in curves)
    hi = min(c[-1][0] for c in curves)
    if hi <= lo:
        die("the runs' env-step ranges do not overlap")
    grid = [lo + (hi - lo) * i / (args.points - 1) for i in range(args.points)]
    title = args.title or f"{len(curves)} runs"
    with tempfile.TemporaryDirectory() as tmp:
        band = os.path.join(tmp, "band.dat")
        with open(band, "w") as f:
            for x in grid:
                ys = [interpolate(c, x) for c in curves]
                f.write(f"{x} {sum(ys) / len(ys)} {min(ys)} {max(ys)}\n")
        if args.table:
            shutil.copyfile(band, args.table)
        plots = [f"'{band}' using 1:3:4 with filledcurves fc rgb '#1f77b4' fs transparent solid 0.2 noborder "
                 "title 'lowest to highest run'"]
        for i, (run, c) in enumerate(zip(args.runs, curves)):
            data = os.path.join(tmp, f"run{i}.dat")
            with open(data, "w") as f:
                f.writelines(f"{x} {y}\n" for x, y in c)
            name = re.sub(r"[^A-Za-z0-9.-]", " ", os.path.basename(os.path.normpath(run)))
            plots.append(f"'{data}' using 1:2 with lines lw 1 lc rgb '#7f7f7f' dt 3 title '{name}'")
        plots.append(f"'{band}' using 1:2 with lines lw 3 lc rgb '#1f77b4' title 'mean of {len(curves)} runs'")
        if args.target is not None:
            plots.append(f"{args.target} with lines lw 2 dt 2 lc rgb '#d62728' title 'target {args.target:g}'")
        script = "\n".join([
            "set terminal pngcairo size 900,560 enhanced font 'sans,10'", f"set output ARG1",
            "set title ARG2 noenhanced font 'sans,12'", "set xlabel 'env steps'",
            "set ylabel 'mean return of the last 100 episodes'", "set format x '%.1s%c'", "set grid",
            "set key bottom right", "plot " + ", ".join(plots)])
        gp = os.path.join(tmp, "plot.gp")
        with open(gp, "w") as f:
            f.write(script + "\n")
        # The output path and the title travel as gnuplot arguments, never pasted into the script.
        subprocess.run(["gnuplot", "-c", gp, args.out, title], check=True)
    print(f"plot_seeds: wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
