#!/usr/bin/env bash
# scripts/farm cluster with a stand-in for ssh that runs the remote command
# on this machine: the learner starts here, each "host" starts its workers,
# and the run ends with every process gone.
# Usage: cluster_test.sh BUILD_DIR
set -euo pipefail
build_dir="$1"
root="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/fake-ssh" <<'SH'
#!/usr/bin/env bash
# fake-ssh [-tt] HOST COMMAND: records the host, runs the command here.
[ "$1" = "-tt" ] && shift
echo "$1" >> "$(dirname "$0")/hosts-seen"
shift
exec bash -c "$*"
SH
chmod +x "$tmp/fake-ssh"
printf 'alpha 1\n# a comment\nbeta 2\n' > "$tmp/hosts"
FARM_SSH="$tmp/fake-ssh" FARM_LEARNER_HOST=127.0.0.1 FARM_BUILD_DIR="$build_dir" FARM_SKIP_BUILD=1 \
  "$root/scripts/farm" cluster "$tmp/hosts" "$root/configs/cartpole.yaml" --port $((20000 + $$ % 20000)) \
  --set total_env_steps=20000 --set stop_at_target=false --set "run_dir=$tmp/run" \
  --set learner.progress_interval_s=100
python3 - "$tmp/run/summary.json" "$tmp/hosts-seen" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
hosts = sorted(open(sys.argv[2]).read().split())
assert hosts == ["alpha", "beta"], hosts
assert s["workers"] == 3, s["workers"]  # 1 on alpha + 2 on beta
assert s["env_steps"] >= 20000
print("ok: cluster of", hosts, "with", s["workers"], "workers")
PY
sleep 1
if pgrep -f "farm-worker.*$tmp" >/dev/null || pgrep -f "farm-learner.*$tmp" >/dev/null; then
  echo "orphan processes left behind"; exit 1
fi
