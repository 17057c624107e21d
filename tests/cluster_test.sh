#!/usr/bin/env bash
# scripts/farm cluster with a stand-in for ssh that runs the remote command
# on this machine: the learner starts here, each "host" starts its workers,
# and the run ends with every process gone. Overrides with spaces, quotes and
# shell characters reach every farm-worker as one argument each, unchanged by
# the remote shell (a stand-in build directory records the workers' arguments), and a CONFIG given relative
# to the directory the cluster was started from reaches them as a path they can open.
# Usage: cluster_test.sh BUILD_DIR
build_dir="$(cd "$1" && pwd)"
source "$(dirname "$0")/lib.sh"
# The real farm-learner; a farm-worker that writes its arguments (NUL-separated) and runs the real one.
mkdir -p "$tmp/build/learner" "$tmp/build/worker"
ln -s "$build_dir/learner/farm-learner" "$tmp/build/learner/farm-learner"
cat > "$tmp/build/worker/farm-worker" <<SH
#!/usr/bin/env bash
printf '%s\0' "\$@" > "$tmp/worker-args.\$\$"
exec "$build_dir/worker/farm-worker" "\$@"
SH
chmod +x "$tmp/build/worker/farm-worker"
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
# Split by the remote shell, either override would break the worker's config ("env.options={" is no YAML).
spaced='env.options={ }'
odd="name=cluster run 'q' \$HOME;x"
# Started from another directory with a CONFIG relative to it: the hosts, which run from the checkout's root,
# must still find it.
mkdir "$tmp/cwd"
cp "$root/configs/cartpole.yaml" "$tmp/cwd/my-config.yaml"
(cd "$tmp/cwd" && FARM_SSH="$tmp/fake-ssh" FARM_LEARNER_HOST=127.0.0.1 FARM_BUILD_DIR="$tmp/build" FARM_SKIP_BUILD=1 \
  "$root/scripts/farm" cluster "$tmp/hosts" my-config.yaml --port "$(free_port)" \
  --set total_env_steps=20000 --set stop_at_target=false --set "run_dir=$tmp/run" \
  --set learner.progress_interval_s=100 --set "$spaced" --set "$odd")
python3 - "$tmp/run/summary.json" "$tmp/hosts-seen" "$tmp" "$spaced" "$odd" <<'PY'
import glob, json, os, sys
s = json.load(open(sys.argv[1]))
hosts = sorted(open(sys.argv[2]).read().split())
assert hosts == ["alpha", "beta"], hosts
assert s["workers"] == 3, s["workers"]  # 1 on alpha + 2 on beta
assert s["env_steps"] >= 20000
args = [open(f, "rb").read().decode().split("\0")[:-1] for f in glob.glob(os.path.join(sys.argv[3], "worker-args.*"))]
# Each host's scripts/farm worker asks farm-worker --check-python once (the Python interpreter, for a config with
# env.python), with the same overrides.
checks = [a for a in args if "--check-python" in a]
assert len(checks) == 2, checks
workers = [a for a in args if "--check-python" not in a]
assert len(workers) == 3, workers
for a in args:
    sets = [a[i + 1] for i in range(len(a) - 1) if a[i] == "--set"]
    for want in sys.argv[4:]:
        assert want in sets, (want, a)
print("ok: cluster of", hosts, "with", s["workers"], "workers; overrides intact:", sys.argv[4:])
PY
# Every process of the run goes, the workers on the learner's Stop: within 10 s (a worker that missed its Stop
# would reconnect for transport.heartbeat_timeout_s + worker_give_up_s, over a minute).
orphans() { pgrep -f "farm-worker.*$tmp" || pgrep -f "farm-learner.*$tmp"; }
no_orphans() { ! orphans > /dev/null; }
wait_until 10 no_orphans || fail "orphan processes left behind: $(orphans | tr '\n' ' ')"
