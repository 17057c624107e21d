#!/usr/bin/env bash
# scripts/slurm/farm.sbatch under a real Slurm (Debian's slurm-wlm and munge): a one-machine cluster of this
# test's own (munged, slurmctld and slurmd on free ports, their state under $tmp, stopped and removed at the
# end), then, submitted as docs/OPERATIONS.md shows it (sbatch from a submit directory with configs/ and
# scripts/, FARM_BUILD_DIR for the binaries):
#  1. CartPole trains to its target; the job ends COMPLETED; runs/<name>-*/ holds summary.json and the
#     checkpoints, and farm-<jobid>.out the job's output;
#  2. scancel of a long job mid-run: the job ends CANCELLED, the learner wrote a final checkpoint of its last
#     update and a summary whose stop_reason names SIGTERM;
#  3. one worker task killed (kill -9) inside the job: the learner drops it and trains on with the other to
#     the run's step budget, and the job ends COMPLETED;
#  4. FARM_LEARNERS_PER_NODE=2: two learner ranks started by the node's launcher, the workers spread over them, train
#     CartPole to its target with rank 0 writing the run;
#  5. a config with two policies (uav_coverage, UAVs 0-1 and 2-3): one learner per
#     policy on FARM_PORT and FARM_PORT + 1, every worker reaching both; each policy trains in RUN/NAME to the run's
#     step budget with every worker, and the job ends COMPLETED;
#  6. workers that all fail (every worker exits at start) while the learner waits: the launcher stops the learner
#     (a summary naming SIGTERM) and the job ends FAILED, not at its time limit;
#  7. the time limit's TERM to the batch script (scancel --batch --signal=TERM): the launcher step's tasks are
#     asked to stop through Slurm, and the learner writes a final checkpoint and a summary naming SIGTERM.
#  8. FARM_LEARNERS_PER_NODE=2 with a config of two policies: two ranks per policy, each policy's run written by
#     its rank 0, and the job ends COMPLETED.
# Exit status 77 (said so) only when the daemons cannot run here (not root, or they exit at start).
# Usage: slurm_test.sh BUILD_DIR
build_dir="$(cd "$1" && pwd)"
source "$(dirname "$0")/lib.sh"
skip() { echo "SKIP: $*"; exit 77; }
for bin in munged slurmctld slurmd sbatch scontrol scancel squeue sinfo; do
  command -v "$bin" >/dev/null || fail "$bin not found (apt-get install -y slurm-wlm munge; scripts/farm test --slurm does)"
done
[ "$(id -u)" -eq 0 ] || skip "slurmd must run as root to start jobs as their user; this test runs as $(id -un)"
for bin in farm-learner farm-worker; do
  [ -x "$build_dir/${bin#farm-}/$bin" ] || fail "$build_dir/${bin#farm-}/$bin not built"
done

cluster="$tmp/slurm"
mkdir -p "$cluster/munge" "$cluster/state" "$cluster/spool" "$cluster/log"
chmod 700 "$cluster/munge"
head -c 1024 /dev/urandom > "$cluster/munge/munge.key"
chmod 400 "$cluster/munge/munge.key"
socket="$cluster/munge/socket"
munged --foreground --force --key-file="$cluster/munge/munge.key" --socket="$socket" \
  --pid-file="$cluster/munge/munged.pid" --seed-file="$cluster/munge/seed" --log-file="$cluster/log/munged.log" \
  > "$cluster/log/munged.out" 2>&1 &
pids+=($!)
wait_until 10 test -S "$socket" || { cat "$cluster/log/munged.log" 2>/dev/null; skip "munged did not start"; }

# The node is "localhost" (slurmd -N): the workers reach the learner at tcp://<first node>:PORT, and this machine's
# own host name may not resolve.
node=localhost
export SLURM_CONF="$cluster/slurm.conf"
cat > "$SLURM_CONF" <<EOF
ClusterName=farmtest
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$socket
CredType=cred/munge
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
StateSaveLocation=$cluster/state
SlurmdSpoolDir=$cluster/spool
SlurmctldPidFile=$cluster/slurmctld.pid
SlurmdPidFile=$cluster/slurmd.pid
SlurmctldLogFile=$cluster/log/slurmctld.log
SlurmdLogFile=$cluster/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
KillWait=30
MinJobAge=600
NodeName=$node NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=farm Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
slurmctld -D -f "$SLURM_CONF" > "$cluster/log/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -N "$node" -f "$SLURM_CONF" > "$cluster/log/slurmd.out" 2>&1 &
pids+=($!)
idle() { [ "$(sinfo -h -N -o %T 2>/dev/null)" = idle ]; }
if ! wait_until 30 idle; then
  tail -n 20 "$cluster"/log/*
  skip "the Slurm daemons did not bring the node up (sinfo: $(sinfo -h -N -o %T 2>&1))"
fi
# Jobs still running at the end are cancelled before the daemons are stopped (lib.sh's cleanup).
cleanup_extra() {
  scancel --full --quiet "${jobs[@]}" 2>/dev/null || true
  wait_until 40 bash -c '[ -z "$(squeue -h -o %i 2>/dev/null)" ]' || true
}
jobs=()
echo "slurm: $(sinfo -h -N -o '%N %T %c CPUs') (slurm-wlm $(sinfo -V | cut -d' ' -f2))"

# The submit directory as a user's checkout would be: configs/ and scripts/ (linked), runs/ written there.
submit="$tmp/submit"
mkdir -p "$submit"
ln -s "$root/configs" "$submit/configs"
ln -s "$root/scripts" "$submit/scripts"
export FARM_BUILD_DIR="$build_dir"
cd "$submit"

# submit NAME ARGS...: sbatch as the docs show it, on one node (FARM_PORT and the next one free: a learner per
# policy takes FARM_PORT + i); sets $job to the job's id.
submit() {
  local name="$1"
  shift
  job="$(FARM_PORT="$(free_port 2)" sbatch --parsable --nodes=1 --job-name="$name" scripts/slurm/farm.sbatch "$@")"
  jobs+=("$job")
}
state() { scontrol show job "$1" -o 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
ended() { case "$(state "$1")" in PENDING | RUNNING | CONFIGURING | COMPLETING | SUSPENDED | "") return 1 ;; esac; }
# wait_state ID STATE SECONDS
wait_state() {
  wait_until "$3" ended "$1" || { tail -n 30 "farm-$1.out"; fail "job $1 still $(state "$1") after $3 s"; }
  [ "$(state "$1")" = "$2" ] || { cat "farm-$1.out"; fail "job $1 ended $(state "$1"), expected $2"; }
}
# run_of NAME: the job's run directory (runs/NAME-<time>).
run_of() { find runs -maxdepth 1 -name "$1-*" -type d -print -quit 2>/dev/null; }
rows() { local r; r="$(run_of "$1")"; [ -n "$r" ] && [ -f "$r/metrics.jsonl" ] && wc -l < "$r/metrics.jsonl" || echo 0; }
# wait_rows NAME N: until job $job's run NAME has N metrics rows (120 s at most); fails at once if the job ends.
wait_rows() {
  local deadline=$((SECONDS + 120))
  until [ "$(rows "$1")" -ge "$2" ]; do
    ! ended "$job" || { cat "farm-$job.out"; fail "job $job ended $(state "$job") before $2 updates"; }
    [ "$SECONDS" -lt "$deadline" ] || { tail -n 30 "farm-$job.out"; fail "job $job did not reach $2 updates"; }
    sleep 0.2
  done
}

# stopped_by_term RUN: job $job's learner stopped on a SIGTERM and wrote a final checkpoint of its last update.
stopped_by_term() {
  python3 - "$1" <<'PY' || { tail -n 30 "farm-$job.out"; exit 1; }
import json, os, sys
run = sys.argv[1]
s = json.load(open(os.path.join(run, "summary.json")))
print("  summary:", json.dumps({k: s.get(k) for k in ("env_steps", "updates", "stop_reason")}))
assert "SIGTERM" in s["stop_reason"], s["stop_reason"]
latest = open(os.path.join(run, "checkpoints", "latest")).read().strip()
assert latest == "ckpt-%08d.pt" % s["updates"], ("the final checkpoint is of the last update", latest, s["updates"])
PY
}

# 1. Trains to the end.
t0=$SECONDS
submit farm-target configs/cartpole.yaml --set name=target
wait_state "$job" COMPLETED 240
run="$(run_of target)"
[ -n "$run" ] || fail "job $job left no runs/target-* in the submit directory"
[ -f "farm-$job.out" ] || fail "no farm-$job.out in the submit directory"
grep -q "starting $(nproc) workers on each of 1 nodes" "farm-$job.out" || { cat "farm-$job.out"; fail "the script did not start the workers as it says"; }
python3 - "$run" <<'PY' || { tail -n 30 "farm-$job.out"; exit 1; }
import json, os, sys
run = sys.argv[1]
s = json.load(open(os.path.join(run, "summary.json")))
print("  summary:", json.dumps({k: s.get(k) for k in ("env_steps", "mean_return_100", "workers", "stop_reason")}))
assert s["stop_reason"].startswith("reached target_return"), s["stop_reason"]
# solved_at_steps decides; episodes that end in the solving batch may lower the final window a little (e2e_train).
assert s["solved_at_steps"] is not None and s["mean_return_100"] >= 475 * 0.98, s
latest = open(os.path.join(run, "checkpoints", "latest")).read().strip()
assert os.path.exists(os.path.join(run, "checkpoints", latest)), latest
assert latest == "ckpt-%08d.pt" % s["updates"], (latest, s["updates"])
PY
echo "ok: job $job trained CartPole to its target and ended COMPLETED ($((SECONDS - t0)) s)"

# 2. scancel mid-run.
t0=$SECONDS
submit farm-cancel configs/cartpole.yaml --set name=cancel --set total_env_steps=100000000 --set stop_at_target=false
wait_rows cancel 5
scancel "$job"
wait_state "$job" CANCELLED 60
run="$(run_of cancel)"
stopped_by_term "$run"
echo "ok: scancel of job $job left a final checkpoint and a summary ($((SECONDS - t0)) s)"

# 3. A worker task killed inside the job.
t0=$SECONDS
submit farm-kill configs/cartpole.yaml --set name=kill --set total_env_steps=300000 --set stop_at_target=false \
  --set transport.heartbeat_timeout_s=3
wait_rows kill 3
victim="$(pgrep -f -- "farm-worker --config configs/cartpole.yaml .*name=kill.* --learner .* --index 1\$" || true)"
[ -n "$victim" ] || { ps -ef | grep farm- >&2; fail "no worker task with --index 1 in job $job"; }
kill -9 $victim
wait_state "$job" COMPLETED 240
run="$(run_of kill)"
python3 - "$run" <<'PY' || { tail -n 30 "farm-$job.out"; exit 1; }
import json, os, sys
s = json.load(open(os.path.join(sys.argv[1], "summary.json")))
print("  summary:", json.dumps({k: s.get(k) for k in ("env_steps", "workers", "workers_lost", "stop_reason")}))
assert s["env_steps"] >= 300000 and s["stop_reason"].startswith("reached total_env_steps"), s
assert s["workers_lost"] == 1, s
PY
echo "ok: job $job survived a killed worker task and ended COMPLETED ($((SECONDS - t0)) s)"

# 4. Two learner ranks in one job (FARM_LEARNERS_PER_NODE=2: a learner step of 2 tasks, ranks from Slurm's
#    variables), the workers spread over them: trains CartPole to its target, rank 0 writing the run.
t0=$SECONDS
job="$(FARM_PORT="$(free_port)" FARM_RANK_PORT="$(free_port)" FARM_LEARNERS_PER_NODE=2 sbatch --parsable --nodes=1 \
  --job-name=farm-ranks scripts/slurm/farm.sbatch configs/cartpole.yaml --set name=ranks)"
jobs+=("$job")
wait_state "$job" COMPLETED 300
run="$(run_of ranks)"
[ -n "$run" ] || fail "job $job left no runs/ranks-* in the submit directory"
grep -q "2 learner ranks (2 on each of 1 nodes)" "farm-$job.out" || { cat "farm-$job.out"; fail "the script did not start 2 ranks"; }
python3 - "$run" <<'PY' || { tail -n 30 "farm-$job.out"; exit 1; }
import json, os, sys
run = sys.argv[1]
s = json.load(open(os.path.join(run, "summary.json")))
print("  summary:", json.dumps({k: s.get(k) for k in ("env_steps", "env_steps_all_ranks", "world_size", "stop_reason")}))
assert s["world_size"] == 2 and s["rank"] == 0, s
assert "target_return" in s["stop_reason"], s["stop_reason"]
assert s["ranks"][0]["checksum"] == s["ranks"][1]["checksum"], s["ranks"]
assert all(r["workers"] >= 1 for r in s["ranks"]), s["ranks"]
s1 = json.load(open(os.path.join(run, "ranks", "rank1", "summary.json")))
assert s1["rank"] == 1 and s1["updates"] == s["updates"], (s1["updates"], s["updates"])
PY
echo "ok: job $job trained CartPole with 2 learner ranks and ended COMPLETED ($((SECONDS - t0)) s)"

# 5. Two policies: one learner per policy as one step of two tasks, every worker reaching both.
t0=$SECONDS
cat > teams.yaml <<EOF
name: teams
total_env_steps: 20000
stop_at_target: false
env:
  name: uav_coverage
  num_envs: 4
  options: {agents: 4, grid: 10, obstacles: 4, window: 5, max_steps: 40}
learner: {progress_interval_s: 100}
ppo: {rollout_length: 20, hidden_sizes: [32]}
policies:
  - {name: scouts, agents: ["[0-1]"]}
  - {name: rest, agents: ["*"], set: ["ppo.hidden_sizes=[16]"]}
EOF
submit farm-teams teams.yaml
wait_state "$job" COMPLETED 240
run="$(run_of teams)"
[ -n "$run" ] || fail "job $job left no runs/teams-* in the submit directory"
grep -q "2 policies: scouts rest" "farm-$job.out" || { cat "farm-$job.out"; fail "the script did not start a learner per policy"; }
python3 - "$run" "$(nproc)" <<'PY' || { tail -n 30 "farm-$job.out"; exit 1; }
import json, os, sys
run, cores = sys.argv[1], int(sys.argv[2])
steps = []
for name, hidden in (("scouts", [32]), ("rest", [16])):
    s = json.load(open(os.path.join(run, name, "summary.json")))
    spec = json.load(open(os.path.join(run, name, "policy_spec.json")))
    print(f"  {name}:", json.dumps({k: s.get(k) for k in ("env_steps", "agent_steps", "workers", "stop_reason")}))
    assert s["num_agents"] == 2 and s["agent_steps"] == 2 * s["env_steps"], s
    assert s["workers"] == cores and s["workers_lost"] == 0 and s["protocol_errors"] == 0, s
    assert spec.get("hidden_sizes") == hidden, spec
    latest = open(os.path.join(run, name, "checkpoints", "latest")).read().strip()
    assert latest == "ckpt-%08d.pt" % s["updates"], ("a final checkpoint of the last update", latest, s["updates"])
    steps.append(s["env_steps"])
# The first to reach the budget stopped the workers; the other was stopped (SIGTERM) within an update of it.
assert max(steps) >= 20000 and min(steps) >= 20000 - 2 * 20 * 4 * cores, steps
PY
echo "ok: job $job trained two policies, a learner each, and ended COMPLETED ($((SECONDS - t0)) s)"

# 6. The workers fail (every worker exits at start, as with an env the compute nodes cannot load: a stand-in
#    farm-worker that exits 3) while the learner waits for workers: the job does not hold its allocation to the
#    time limit. The launcher stops the learner (a summary naming SIGTERM), and the job ends FAILED.
t0=$SECONDS
broken="$tmp/broken_build"
mkdir -p "$broken/learner" "$broken/worker"
ln -s "$build_dir/learner/farm-learner" "$broken/learner/farm-learner"
printf '#!/bin/sh\necho "stand-in farm-worker: cannot load the env" >&2\nexit 3\n' > "$broken/worker/farm-worker"
chmod +x "$broken/worker/farm-worker"
FARM_BUILD_DIR="$broken" submit farm-broken configs/cartpole.yaml --set name=broken
wait_state "$job" FAILED 150
grep -E "worker \(pid [0-9]+\) exited with status 3" "farm-$job.out" > /dev/null &&
  grep -F "every worker has exited; stopping the learners" "farm-$job.out" > /dev/null ||
  { cat "farm-$job.out"; fail "job $job's output does not say the worker step failed and the learner was stopped"; }
run="$(run_of broken)"
python3 - "$run" <<'PY' || { tail -n 30 "farm-$job.out"; exit 1; }
import json, os, sys
s = json.load(open(os.path.join(sys.argv[1], "summary.json")))
print("  summary:", json.dumps({k: s.get(k) for k in ("env_steps", "workers_joined", "stop_reason")}))
assert "SIGTERM" in s["stop_reason"] and s["env_steps"] == 0 and s["workers_joined"] == 0, s
PY
echo "ok: job $job, whose workers failed, stopped its learner and ended FAILED ($((SECONDS - t0)) s)"

# 7. The time limit's signal (--signal=B:TERM@120 goes to the batch script only; scancel --batch --signal=TERM sends
#    the same): the script asks the learner step's tasks to stop through Slurm, and the learner writes a final
#    checkpoint of its last update and a summary naming SIGTERM (a TERM to srun itself would SIGKILL them).
t0=$SECONDS
submit farm-limit configs/cartpole.yaml --set name=limit --set total_env_steps=100000000 --set stop_at_target=false
wait_rows limit 5
scancel --batch --signal=TERM "$job"
wait_until 90 ended "$job" || { tail -n 30 "farm-$job.out"; fail "job $job still $(state "$job") 90 s after its script's TERM"; }
grep -F "forcing job termination" "farm-$job.out" > /dev/null && { cat "farm-$job.out"; fail "srun killed the learner step"; }
run="$(run_of limit)"
stopped_by_term "$run"
echo "ok: job $job, its script sent TERM as at the time limit, ended $(state "$job") with a final checkpoint ($((SECONDS - t0)) s)"

# 8. Two policies x two learner ranks (FARM_LEARNERS_PER_NODE=2 with configs/uav_teams.yaml, shrunk): the node's
#    launcher starts four learners (each policy's ranks on a rendezvous port of its own, FARM_RANK_PORT + i), each
#    worker reaching rank i % 2 of both; the job ends COMPLETED, each policy's RUN/NAME holding rank 0's summary
#    (world_size 2) and final checkpoint.
t0=$SECONDS
job="$(FARM_PORT="$(free_port 2)" FARM_RANK_PORT="$(free_port 2)" FARM_LEARNERS_PER_NODE=2 sbatch --parsable \
  --nodes=1 --job-name=farm-pxr scripts/slurm/farm.sbatch configs/uav_teams.yaml --set name=pxr \
  --set total_env_steps=3000 --set env.num_envs=2 --set env.options.grid=16 --set env.options.obstacles=5 \
  --set env.options.max_steps=50 --set ppo.rollout_length=16 --set "ppo.hidden_sizes=[32, 32]" \
  --set ppo.update_epochs=1 --set ppo.num_minibatches=1 --set learner.progress_interval_s=100)"
jobs+=("$job")
wait_state "$job" COMPLETED 300
run="$(run_of pxr)"
[ -n "$run" ] || fail "job $job left no runs/pxr-* in the submit directory"
grep -q "2 learner ranks (2 on each of 1 nodes)" "farm-$job.out" && grep -q "2 policies: team_a team_b" "farm-$job.out" ||
  { cat "farm-$job.out"; fail "the script did not start 2 ranks of 2 policies"; }
python3 - "$run" <<'PY' || { tail -n 30 "farm-$job.out"; exit 1; }
import json, os, sys
run = sys.argv[1]
for name in ("team_a", "team_b"):
    s = json.load(open(os.path.join(run, name, "summary.json")))
    print(f"  {name}:", json.dumps({k: s.get(k) for k in ("env_steps", "world_size", "rank", "stop_reason")}))
    assert s["world_size"] == 2 and s["rank"] == 0, s
    assert s["ranks"][0]["checksum"] == s["ranks"][1]["checksum"], s["ranks"]
    latest = open(os.path.join(run, name, "checkpoints", "latest")).read().strip()
    assert latest == "ckpt-%08d.pt" % s["updates"], (latest, s["updates"])
    assert os.path.isdir(os.path.join(run, name, "ranks", "rank1")), "no rank 1 directory"
PY
echo "ok: job $job trained 2 policies x 2 learner ranks and ended COMPLETED ($((SECONDS - t0)) s)"
