#!/usr/bin/env bash
# A robot of the user's own, end to end: examples/mujoco (an MJCF four-legged robot and a config that describes
# its standing task under env.mujoco) copied into a project folder outside the checkout, trained there by
# `scripts/farm run` with the model found beside the config, evaluated by farm-eval from the run directory alone,
# and resumed from it. Random torques buckle the robot's knees within a second (a return of about 18); the
# 100-episode mean must climb well above that, farm-eval's episodes must outlast a random robot's, and --resume
# must go on to more steps with the model's path recorded in the run directory; `scripts/farm eval --video`
# renders an episode to a GIF, with its table of body heights (the torso kept within its bounds) and their plot.
# Usage: mujoco_robot_train_test.sh BUILD_DIR
build_dir="$1"
source "$(dirname "$0")/lib.sh"
project="$tmp/my_robot"
mkdir -p "$project"
cp "$root/examples/mujoco/quadruped.xml" "$root/examples/mujoco/quadruped.yaml" "$project/"
run_dir="$project/runs/stand"
cd "$project"

FARM_BUILD_DIR="$build_dir" "$root/scripts/farm" run quadruped.yaml --workers 2 \
  --set total_env_steps=150000 --set run_dir="$run_dir" --set learner.progress_interval_s=5

# The run directory alone: farm-eval finds the model through the config recorded there, from another folder.
cd "$tmp"
"$build_dir/tools/farm-eval" "$run_dir" --episodes 5 > "$tmp/eval.json"
# Seeing it: a small video of the first episode, its table of heights and velocities, and that table's plot.
FARM_BUILD_DIR="$build_dir" "$root/scripts/farm" eval "$run_dir" --episodes 1 --video "$tmp/stand.gif" --video-size 160
cd "$project"

FARM_BUILD_DIR="$build_dir" "$root/scripts/farm" run --resume "$run_dir" --workers 2 --set total_env_steps=180000

python3 - "$run_dir" "$tmp/eval.json" "$project" "$tmp" <<'PY'
import csv, json, os, sys, yaml
run, eval_out, project, tmp = sys.argv[1:5]
s = json.load(open(os.path.join(run, "summary.json")))
print("summary:", json.dumps({k: s.get(k) for k in ("env", "sps", "updates", "mean_return_100", "env_steps",
                                                     "protocol_errors")}))
model = yaml.safe_load(open(os.path.join(run, "config.yaml")))["env"]["mujoco"]["model"]
assert os.path.isabs(model) and os.path.samefile(model, os.path.join(project, "quadruped.xml")), model
rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
means = [(r["env_steps"], r["mean_return_100"]) for r in rows if r.get("mean_return_100") is not None]
assert means, "no episode finished"
first_steps, first = means[0]
at_150k = [m for steps, m in means if steps <= 150000][-1]
print(f"100-episode mean: {first:.1f} at {first_steps} env steps, {at_150k:.1f} at 150k, {means[-1][1]:.1f} at {means[-1][0]}")
assert first < 40, f"a random robot falls within about a second (a return near 18), not {first}"
assert at_150k > 150, f"150k env steps of PPO keep the robot up far longer than a random one (18), not {at_150k}"
assert s["env"] == "Quadruped-v0" and s["env_steps"] >= 180000 and s["protocol_errors"] == 0, s
e = [json.loads(l) for l in open(eval_out) if l.startswith("{")][-1]
print("farm-eval:", json.dumps(e))
assert e["env"] == "Quadruped-v0" and e["episodes"] == 5, e
assert e["mean_length"] > 300, f"the trained robot stands far longer than a random one (21 steps; 1000 when measured): {e}"
# The video's table: a state per step from the reset on, the torso kept within its bounds while the episode ran.
rows = list(csv.DictReader(open(os.path.join(tmp, "stand.csv"))))
heights = [float(r["torso_z"]) for r in rows]
print(f"video table: {len(rows)} states, torso height {min(heights[1:]):.3f}..{max(heights[1:]):.3f} m")
assert len(rows) > 300 and rows[0]["step"] == "0", len(rows)
assert all(0.3 <= h <= 1.0 for h in heights[1:-1]), (min(heights), max(heights))
with open(os.path.join(tmp, "stand.gif"), "rb") as f:
    assert f.read(6) == b"GIF89a"
assert os.path.getsize(os.path.join(tmp, "stand.png")) > 10000
PY
