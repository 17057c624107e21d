#!/usr/bin/env bash
# docker-compose for real (issue 21): one learner and two workers as containers on this machine, as a user of
# docker/docker-compose.yml runs them.
#  1. dockerd (Debian's docker.io; started here when none answers) and a `debian:12` base image: the local one,
#     else a pull, else one made with `debootstrap --variant=minbase bookworm` (its root tree cached in
#     $FARM_COMPOSE_CACHE, default /var/cache/farm-compose, so the next run only re-imports it).
#  2. `docker-compose build` (timed), then `up --scale worker=2` on CartPole to its end: the learner and both
#     workers exit 0, summary.json lands in the bind-mounted runs directory, and every file there belongs to
#     the user the containers run as (FARM_UID/FARM_GID; a non-root uid here, so that it shows).
#  3. A long run stopped mid-way with `docker-compose stop` (TERM, the learner's 30 s grace): a final
#     checkpoint named by `latest`, summary.json with the signal as stop reason, every container exited 0.
#  4. Two policies (configs/uav_teams.yaml, FARM_CONFIG): the learner's container runs a learner per policy
#     (scripts/farm learners), the workers reach both through tcp://learner:5555; trained to the end (every
#     container exits 0, each policy's summary and final checkpoint), then a long run stopped with
#     `docker-compose stop` (each policy's final checkpoint, SIGTERM as its stop reason, every container 0).
#  5. `docker-compose down`: no container or network of the project is left.
# Usage: compose_test.sh   (as root, or as a member of the docker group with dockerd running). `scripts/farm
# test --compose` installs docker.io, docker-compose and debootstrap first. Exit status 77: no dockerd can
# run here (said why); anything else that goes wrong fails the test.
source "$(dirname "$0")/lib.sh"

project="farmcompose$$"
compose_file="$root/docker/docker-compose.yml"
cache="${FARM_COMPOSE_CACHE:-/var/cache/farm-compose}"
uid=4321 gid=4321  # not the invoking user's, so that files owned by it can only come from FARM_UID/FARM_GID
runs="$tmp/runs"
mkdir -p "$runs"
chown "$uid:$gid" "$runs" 2>/dev/null || chmod 0777 "$runs"
started_dockerd=""

compose() {
  FARM_UID="$uid" FARM_GID="$gid" FARM_RUNS="$runs" docker-compose -p "$project" -f "$compose_file" "$@"
}
cleanup_extra() {
  compose down --remove-orphans -t 5 > /dev/null 2>&1 || true
  if [ -n "$started_dockerd" ]; then
    kill -TERM "$started_dockerd" 2>/dev/null || true
    wait "$started_dockerd" 2>/dev/null || true
  fi
}
elapsed() { echo $((SECONDS - $1)); }

# --- 1. dockerd and the base image -----------------------------------------------------------------------
command -v docker-compose > /dev/null || fail "docker-compose missing (scripts/farm test --compose installs it)"
if ! docker info > /dev/null 2>&1; then
  command -v dockerd > /dev/null || fail "no dockerd answers and none is installed (apt-get install docker.io)"
  [ "$(id -u)" -eq 0 ] || fail "no dockerd answers, and only root may start one"
  dockerd > "$tmp/dockerd.log" 2>&1 &
  started_dockerd=$!
  docker_up() { docker info > /dev/null 2>&1; }
  if ! wait_until 60 docker_up; then
    echo "SKIP: dockerd cannot run on this machine:"; tail -5 "$tmp/dockerd.log"
    exit 77
  fi
  echo "ok: started dockerd $(docker version --format '{{.Server.Version}}')"
fi
if ! docker image inspect debian:12 > /dev/null 2>&1 && ! timeout 60 docker pull -q debian:12 > /dev/null 2>&1; then
  t0=$SECONDS
  if [ ! -x "$cache/rootfs/bin/sh" ]; then
    command -v debootstrap > /dev/null || fail "no debian:12 image and no debootstrap (apt-get install debootstrap)"
    rm -rf "$cache/rootfs.partial"
    mkdir -p "$cache"
    debootstrap --variant=minbase bookworm "$cache/rootfs.partial" http://deb.debian.org/debian > "$tmp/debootstrap.log" 2>&1 ||
      { tail -20 "$tmp/debootstrap.log"; fail "debootstrap failed"; }
    mv "$cache/rootfs.partial" "$cache/rootfs"
  fi
  tar -C "$cache/rootfs" -c . | docker import - debian:12 > /dev/null
  echo "ok: base image debian:12 from debootstrap in $(elapsed $t0) s ($cache/rootfs)"
fi

# --- 2. build, and a run to its end ------------------------------------------------------------------------
t0=$SECONDS
compose build > "$tmp/build.log" 2>&1 || { tail -40 "$tmp/build.log"; fail "docker-compose build failed"; }
echo "ok: docker-compose build in $(elapsed $t0) s"

# container_exit SERVICE: the exit codes of the service's containers, one per line (after they stopped).
container_exit() {
  local id
  for id in $(compose ps -q "$1"); do docker inspect -f '{{.State.ExitCode}}' "$id"; done
}
# all_exited SERVICE: none of the service's containers is running.
all_exited() {
  local id
  for id in $(compose ps -q "$1"); do
    [ "$(docker inspect -f '{{.State.Running}}' "$id")" = false ] || return 1
  done
}
# run_dir: the one run directory under $runs (the learner names it runs/<env>-<time>).
run_dir() { find "$runs" -mindepth 1 -maxdepth 1 -type d -print -quit; }
check_owner() {
  local other
  other=$(find "$runs" -mindepth 1 \( ! -uid "$uid" -o ! -gid "$gid" \) -printf '%u:%g %p\n' | sed -n 1,5p)
  [ -z "$other" ] || fail "run files not owned by $uid:$gid: $other"
}

t0=$SECONDS
FARM_SET="--set total_env_steps=200000 --set stop_at_target=false" compose up -d --scale worker=2 \
  > "$tmp/up.log" 2>&1 || { cat "$tmp/up.log"; fail "docker-compose up failed"; }
wait_until 300 all_exited learner || { compose logs --tail 30; fail "the learner did not finish within 300 s"; }
wait_until 60 all_exited worker || { compose logs --tail 30 worker; fail "the workers did not stop after the learner"; }
codes="$(container_exit learner) $(container_exit worker)"
[ "$(echo $codes)" = "0 0 0" ] || { compose logs --tail 30; fail "exit codes (learner, workers): $codes"; }
run="$(run_dir)"
[ -f "$run/summary.json" ] || { ls -lR "$runs"; fail "no summary.json in the bind-mounted runs directory"; }
python3 - "$run/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["env_steps"] >= 200000 and s["workers_joined"] == 2, s
print(f"ok: up --scale worker=2: {s['env_steps']} env steps, mean return {s['mean_return_100']}, "
      f"{s['workers_joined']} workers, {s['wall_seconds']:.1f} s")
PY
check_owner
compose logs learner 2> /dev/null | grep "worker .* joined" > /dev/null || fail "the learner's log does not say who joined"
echo "ok: every file under runs/ belongs to $uid:$gid; run and containers done in $(elapsed $t0) s"
compose down -t 5 > /dev/null 2>&1
rm -rf "${run:?}"

# --- 3. docker-compose stop mid-run ------------------------------------------------------------------------
FARM_SET="--set total_env_steps=1000000000 --set stop_at_target=false" compose up -d --scale worker=2 \
  > "$tmp/up2.log" 2>&1 || { cat "$tmp/up2.log"; fail "docker-compose up (long run) failed"; }
wait_until 120 eval 'r=$(run_dir); [ -n "$r" ] && has_rows "$r/metrics.jsonl" 5' ||
  { compose logs --tail 30; fail "the long run wrote no metrics"; }
t0_ms=$(($(date +%s%N) / 1000000))
compose stop > "$tmp/stop.log" 2>&1 || { cat "$tmp/stop.log"; fail "docker-compose stop failed"; }
echo "ok: docker-compose stop took $(( $(date +%s%N) / 1000000 - t0_ms )) ms"
codes="$(container_exit learner) $(container_exit worker)"
[ "$(echo $codes)" = "0 0 0" ] || { compose logs --tail 30; fail "after stop, exit codes (learner, workers): $codes"; }
run="$(run_dir)"
[ -f "$run/summary.json" ] || { compose logs --tail 30 learner; fail "no summary.json after docker-compose stop"; }
latest="$(cat "$run/checkpoints/latest")"
[ -f "$run/checkpoints/$latest" ] && [ -f "$run/checkpoints/$latest.crc32c" ] ||
  fail "latest names $latest, which is not there with its checksum"
python3 - "$run/summary.json" "$latest" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert "signal" in s["stop_reason"] or "SIGTERM" in s["stop_reason"], s["stop_reason"]
assert s["env_steps"] < 1000000000 and s["updates"] > 0, s
assert sys.argv[2] == f"ckpt-{s['updates']:08d}.pt", (sys.argv[2], s["updates"])
print(f"ok: stopped mid-run ({s['stop_reason']}) at {s['env_steps']} env steps; final checkpoint {sys.argv[2]}")
PY
check_owner

# --- 4. two policies (configs/uav_teams.yaml): a learner per policy in the learner's container -------------
# check_policies RUN end|stopped: each policy's summary and its latest checkpoint (the final one) in RUN; "end": the
# run reached its budget with both workers and lost none, "stopped": it was stopped by SIGTERM.
check_policies() {
  python3 - "$1" "$2" <<'PY' || { compose logs --tail 30 learner; return 1; }
import json, os, sys
run, how = sys.argv[1], sys.argv[2]
for name in ("team_a", "team_b"):
    s = json.load(open(os.path.join(run, name, "summary.json")))
    if how == "end":
        assert s["num_agents"] == 5 and s["workers_joined"] == 2 and s["workers_lost"] == 0, s
        assert s["env_steps"] >= 19000, s
    else:
        assert "SIGTERM" in s["stop_reason"], s["stop_reason"]
    latest = open(os.path.join(run, name, "checkpoints", "latest")).read().strip()
    assert latest == f"ckpt-{s['updates']:08d}.pt", (latest, s["updates"])
    print(f"ok: two policies, {how}, {name}: {s['env_steps']} env steps, {s['workers_joined']} workers, "
          f"{s['stop_reason']}, final checkpoint {latest}")
PY
}

# To the end: the first learner to reach the budget stops the workers, the other is stopped with a final
# checkpoint, and every container exits 0. Then a long run stopped mid-way: both learners checkpoint.
compose down -t 5 > /dev/null 2>&1
rm -rf "${run:?}"
teams_set="--set total_env_steps=20000 --set env.num_envs=4 --set learner.checkpoint_every=5"
t0=$SECONDS
FARM_CONFIG=configs/uav_teams.yaml FARM_SET="$teams_set" compose up -d --scale worker=2 > "$tmp/up3.log" 2>&1 ||
  { cat "$tmp/up3.log"; fail "docker-compose up (two policies) failed"; }
wait_until 300 all_exited learner || { compose logs --tail 30; fail "the two policies' learners did not finish within 300 s"; }
wait_until 60 all_exited worker || { compose logs --tail 30 worker; fail "the workers did not stop after the learners"; }
codes="$(container_exit learner) $(container_exit worker)"
[ "$(echo $codes)" = "0 0 0" ] || { compose logs --tail 30; fail "two policies: exit codes (learner, workers): $codes"; }
run="$(run_dir)"
check_policies "$run" end || exit 1
check_owner
echo "ok: two policies' learners in one container, trained to the end in $(elapsed $t0) s"
compose down -t 5 > /dev/null 2>&1
rm -rf "${run:?}"
FARM_CONFIG=configs/uav_teams.yaml FARM_SET="--set total_env_steps=1000000000 --set env.num_envs=4" \
  compose up -d --scale worker=2 > "$tmp/up4.log" 2>&1 || { cat "$tmp/up4.log"; fail "docker-compose up (two policies, long) failed"; }
wait_until 120 eval 'r=$(run_dir); [ -n "$r" ] && has_rows "$r/team_a/metrics.jsonl" 3 && has_rows "$r/team_b/metrics.jsonl" 3' ||
  { compose logs --tail 30; fail "the two policies' long run wrote no metrics"; }
compose stop > "$tmp/stop2.log" 2>&1 || { cat "$tmp/stop2.log"; fail "docker-compose stop (two policies) failed"; }
codes="$(container_exit learner) $(container_exit worker)"
[ "$(echo $codes)" = "0 0 0" ] || { compose logs --tail 30; fail "two policies, after stop: exit codes (learner, workers): $codes"; }
run="$(run_dir)"
check_policies "$run" stopped || exit 1
check_owner

# --- 5. down -----------------------------------------------------------------------------------------------
compose down -t 5 > /dev/null 2>&1 || fail "docker-compose down failed"
left="$(docker ps -a -q --filter "label=com.docker.compose.project=$project")"
[ -z "$left" ] || fail "containers left after down: $left"
[ -z "$(docker network ls -q --filter "label=com.docker.compose.project=$project")" ] || fail "a network was left after down"
echo "ok: docker-compose down left no container or network"
