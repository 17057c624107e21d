#!/usr/bin/env bash
# scripts/farm cluster with a stand-in for ssh that runs the remote command
# on this machine: the learner starts here, each "host" starts its workers,
# and the run ends with every process gone. Overrides with spaces, quotes and
# shell characters reach every farm-worker as one argument each, unchanged by
# the remote shell (a stand-in build directory records the workers' arguments), and a CONFIG given relative
# to the directory the cluster was started from reaches them as a path they can open. Then a config with two
# policies (uav_coverage, UAVs 0-1 and 2-3): one learner per policy on ports P and P+1, every host's workers
# reaching both (--learner scouts=tcp://HOST:P,rest=tcp://HOST:P+1), each policy trained in RUN/NAME with every
# worker kept, and the run ending with every process gone. Last, `scripts/farm learners` (docker-compose's learner
# service) with the same config: a learner per policy on P and P+1, reached by workers given tcp://HOST:P alone; a
# run to its end exits 0 with both policies trained, and a long one stopped with SIGTERM exits 0 with each policy's
# final checkpoint and SIGTERM as its stop reason.
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

# Several policies: a learner per policy on P and P+1, every worker given both endpoints.
rm -f "$tmp"/worker-args.* "$tmp/hosts-seen"
cat > "$tmp/cwd/teams.yaml" <<EOF
name: cluster-teams
total_env_steps: 12000
stop_at_target: false
env:
  name: uav_coverage
  num_envs: 4
  options: {agents: 4, grid: 10, obstacles: 4, window: 5, max_steps: 40}
learner: {min_workers: 3, progress_interval_s: 100}
ppo: {rollout_length: 20, hidden_sizes: [32]}
policies:
  - {name: scouts, agents: ["[0-1]"]}
  - {name: rest, agents: ["*"], set: ["ppo.hidden_sizes=[16]"]}
EOF
port="$(free_port 2)"
rc=0
(cd "$tmp/cwd" && FARM_SSH="$tmp/fake-ssh" FARM_LEARNER_HOST=127.0.0.1 FARM_BUILD_DIR="$tmp/build" FARM_SKIP_BUILD=1 \
  timeout 180 "$root/scripts/farm" cluster "$tmp/hosts" teams.yaml --port "$port" --set "run_dir=$tmp/teams") \
  > "$tmp/teams.log" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { tail -n 30 "$tmp/teams.log" >&2; fail "scripts/farm cluster with two policies: status $rc"; }
python3 - "$tmp" "$port" <<'PY'
import glob, json, os, sys
tmp, port = sys.argv[1], int(sys.argv[2])
hosts = sorted(open(os.path.join(tmp, "hosts-seen")).read().split())
assert hosts == ["alpha", "beta"], hosts
for name, hidden in (("scouts", [32]), ("rest", [16])):
    s = json.load(open(os.path.join(tmp, "teams", name, "summary.json")))
    spec = json.load(open(os.path.join(tmp, "teams", name, "policy_spec.json")))
    assert s["num_agents"] == 2 and s["agent_steps"] == 2 * s["env_steps"], s
    assert s["env_steps"] >= 11000, s
    assert s["workers"] == 3 and s["workers_lost"] == 0 and s["protocol_errors"] == 0, s
    assert spec.get("hidden_sizes") == hidden, spec
    print(f"{name}: env steps {s['env_steps']}, workers {s['workers']}, hidden {spec.get('hidden_sizes')}")
args = [open(f, "rb").read().decode().split("\0")[:-1] for f in glob.glob(os.path.join(tmp, "worker-args.*"))]
workers = [a for a in args if "--check-python" not in a]
assert len(workers) == 3, workers
want = f"scouts=tcp://127.0.0.1:{port},rest=tcp://127.0.0.1:{port + 1}"
for a in workers:
    assert a[a.index("--learner") + 1] == want, a
print("ok: two policies' learners on ports", port, "and", port + 1, "reached by every host's workers")
PY
wait_until 10 no_orphans || fail "orphan processes left behind: $(orphans | tr '\n' ' ')"

# scripts/farm learners: the learner side alone, one learner per policy on P and P+1; workers given tcp://HOST:P.
# learners_run NAME BUDGET: starts it and two workers; sets $learners_pid.
learners_run() {
  port="$(free_port 2)"
  FARM_BUILD_DIR="$build_dir" "$root/scripts/farm" learners "$tmp/cwd/teams.yaml" --port "$port" \
    --set "run_dir=$tmp/$1" --set "total_env_steps=$2" --set learner.min_workers=2 > "$tmp/$1.log" 2>&1 &
  learners_pid=$!
  pids+=("$learners_pid")
  for i in 0 1; do
    "$build_dir/worker/farm-worker" --config "$tmp/cwd/teams.yaml" --learner "tcp://127.0.0.1:$port" --index "$i" \
      --set "run_dir=$tmp/$1" --set "total_env_steps=$2" > "$tmp/$1-worker-$i.log" 2>&1 &
    pids+=($!)
  done
}
learners_run solo 12000
rc=0
timeout 120 tail --pid="$learners_pid" -f /dev/null || fail "scripts/farm learners did not end within 120 s"
wait "$learners_pid" || rc=$?
[ "$rc" -eq 0 ] || { tail -n 20 "$tmp/solo.log" >&2; fail "scripts/farm learners with two policies: status $rc"; }
learners_run stopped 100000000
both_rows() { has_rows "$tmp/stopped/scouts/metrics.jsonl" 3 && has_rows "$tmp/stopped/rest/metrics.jsonl" 3; }
wait_until 60 both_rows || { tail -n 20 "$tmp/stopped.log" >&2; fail "scripts/farm learners: no updates within 60 s"; }
kill -TERM "$learners_pid"
rc=0
wait "$learners_pid" || rc=$?
[ "$rc" -eq 0 ] || { tail -n 20 "$tmp/stopped.log" >&2; fail "scripts/farm learners after SIGTERM: status $rc"; }
python3 - "$tmp" <<'PY'
import json, os, sys
tmp = sys.argv[1]
for run, why in (("solo", "total_env_steps"), ("stopped", "SIGTERM")):
    for name in ("scouts", "rest"):
        s = json.load(open(os.path.join(tmp, run, name, "summary.json")))
        latest = open(os.path.join(tmp, run, name, "checkpoints", "latest")).read().strip()
        assert s["num_agents"] == 2 and s["workers"] == 2 and s["workers_lost"] == 0, s
        assert latest == "ckpt-%08d.pt" % s["updates"], (latest, s["updates"])
        if run == "stopped":
            assert why in s["stop_reason"], s["stop_reason"]
        else:
            assert s["env_steps"] >= 11000, s
        print(f"{run}/{name}: {s['env_steps']} env steps, stop: {s['stop_reason']}, final checkpoint {latest}")
print("ok: scripts/farm learners, a learner per policy reached through one base port; ends and SIGTERM exit 0")
PY
wait_until 10 no_orphans || fail "orphan processes left behind: $(orphans | tr '\n' ' ')"
