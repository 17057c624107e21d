#!/usr/bin/env bash
# A new user's first hour (issue 32), measured in Docker containers on this machine:
#
#   scripts/first_hour_check.sh [--out FILE.json]      (as root: it may start dockerd)
#
#  1. dockerd and a `debian:12` base image, as tests/compose_test.sh gets them (the same few lines, duplicated
#     rather than shared, so that the compose test stays as it is): dockerd started when none answers (and stopped
#     at the end), the local debian:12 image, else `docker pull`, else `debootstrap --variant=minbase bookworm`
#     with the compose test's cache ($FARM_COMPOSE_CACHE, default /var/cache/farm-compose), so that nothing is
#     fetched twice.
#  2. A bare machine: `git archive HEAD` (the committed tree, as a fresh clone) in a container of the bare base
#     image, nothing added to it (a preflight lists what of the launcher's own needs the image lacks), 2 CPUs
#     (--cpuset-cpus 0,1 when this host has more, so that nproc, and with it the launcher's jobs and workers, is
#     2). `scripts/farm train` from its launch to the learner's first status line ("[   2.0s] steps ..."), every
#     output line timestamped: apt-get (update, download, install: until "farm: configuring"), the configure
#     (until "farm: building"), the build (until "farm: built in N s"), the learner's start (to its first status
#     line). The container is then stopped and committed: the packages installed.
#  3. Packages present: a fresh `git archive HEAD` in a container of that committed image (a new directory: no
#     build tree, no ccache), `scripts/farm train` to its end (configs/cartpole.yaml stops at target_return 475):
#     total wall time, configure, build, the learner's start, training to "target reached", and solved_at_steps,
#     solved_at_seconds and env_steps from runs/*/summary.json.
# Before each of the two measurements it waits until this host's 1-minute load average is below
# FIRST_HOUR_LOAD_MAX (1.5), polling every 20 s, for at most FIRST_HOUR_LOAD_WAIT_S (1500) s, then measures anyway
# and says so; the load average is recorded at the start and end of each measurement and at every phase boundary.
# Prints one table on stdout (and the figures as JSON with --out). Removes the containers and the committed image
# it made; keeps the base image and the debootstrap cache.
#
# Cost: the first run downloads ~1 GB of Debian packages in the container (apt-get; nothing is cached between runs
# by design: it is what a new user pays), builds twice (~5 min each on 2 cores) and trains CartPole once (~1-2
# min): 20 to 30 minutes on 2 idle cores, plus the load waits; ~6 GB of disk in /var/lib/docker while it runs.
# Exits non-zero when a measurement fails (the failing log's tail is shown).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out_json=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ $# -ge 2 ] || { echo "--out needs a file" >&2; exit 2; }; out_json="$2"; shift 2 ;;
    --out=*) out_json="${1#--out=}"; shift ;;
    -h|--help) awk 'NR > 1 && /^set -euo pipefail/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument '$1' (expected --out FILE)" >&2; exit 2 ;;
  esac
done
[ -z "$out_json" ] || [[ "$out_json" = /* ]] || out_json="$PWD/$out_json"

cache="${FARM_COMPOSE_CACHE:-/var/cache/farm-compose}"
load_max="${FIRST_HOUR_LOAD_MAX:-1.5}"
load_wait_s="${FIRST_HOUR_LOAD_WAIT_S:-1500}"
bare_limit_s="${FIRST_HOUR_BARE_LIMIT_S:-3600}"   # give up on the bare machine's first status line after this
train_limit_s="${FIRST_HOUR_TRAIN_LIMIT_S:-2400}" # and on the packages-present run's end after this
tag="firsthour$$"
pkg_image="farm-first-hour:$tag"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/farm-first-hour.XXXXXX")"
started_dockerd=""
containers=()

say() { printf 'first_hour: %s\n' "$*" >&2; }
fail() { printf 'first_hour: FAIL: %s\n' "$*" >&2; exit 1; }
cleanup() {
  local c
  for c in "${containers[@]+"${containers[@]}"}"; do docker rm -f "$c" > /dev/null 2>&1 || true; done
  docker image rm -f "$pkg_image" > /dev/null 2>&1 || true
  if [ -n "$started_dockerd" ]; then
    kill -TERM "$started_dockerd" 2>/dev/null || true
    wait "$started_dockerd" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
load1() { cut -d' ' -f1 /proc/loadavg; }
# since T0: seconds (one decimal) from T0 (an $EPOCHREALTIME) to now, without a fork per output line.
since() {
  local now="$EPOCHREALTIME" us
  us=$(( 10#${now/./} - 10#${1/./} ))
  printf '%d.%d' $((us / 1000000)) $((us / 100000 % 10))
}
wait_until() {  # wait_until SECONDS COMMAND...
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do [ "$SECONDS" -lt "$deadline" ] || return 1; sleep 0.5; done
}

# wait_for_load NAME: until the 1-minute load average is below $load_max (every 20 s, at most $load_wait_s s).
# Appends "NAME waited_s gave_up" to $tmp/waits.
wait_for_load() {
  local t0=$SECONDS gave_up=0
  while awk -v l="$(load1)" -v m="$load_max" 'BEGIN { exit !(l >= m) }'; do
    if [ $((SECONDS - t0)) -ge "$load_wait_s" ]; then
      say "load average still $(load1) after $((SECONDS - t0)) s: measuring $1 anyway"
      gave_up=1
      break
    fi
    say "load average $(load1) >= $load_max: waiting before $1 ($((SECONDS - t0)) s so far)"
    sleep 20
  done
  printf '%s %s %s\n' "$1" "$((SECONDS - t0))" "$gave_up" >> "$tmp/waits"
}

# stream NAME T0 [stop]: reads the container's merged output on stdin; writes "SECONDS_SINCE_T0 LINE" to
# $tmp/NAME.log and the phase boundaries as "KEY<TAB>SECONDS<TAB>LOAD1<TAB>LINE" to $tmp/NAME.marks (the first
# of each key; apt's "Fetched" lines all). With "stop" it returns at the first status line.
stream() {
  local name="$1" t0="$2" stop="${3:-}" line now el key
  local -A seen=()
  while IFS= read -r line; do
    line="${line%$'\r'}"
    el="$(since "$t0")"
    printf '%7s %s\n' "$el" "$line" >> "$tmp/$name.log"
    key=""
    case "$line" in
      "farm: installing missing packages"*) key=apt_start ;;
      "Need to get "*) key=apt_need ;;
      "Fetched "*) key=apt_fetched ;;
      "farm: configuring"*) key=configure_start ;;
      "farm: building"*) key=build_start ;;
      "farm: built in "*) key=build_end ;;
      "farm: learner on"*) key=learner_listening ;;
      "farm: error"*|"E: "*) key=error ;;
      *"target "*" reached: mean return"*) key=solved ;;
    esac
    [[ "$line" =~ ^\[\ *[0-9.]+s\]\ steps\  ]] && key=first_status
    if [ -n "$key" ] && { [ -z "${seen[$key]:-}" ] || [ "$key" = apt_fetched ]; }; then
      seen[$key]=1
      printf '%s\t%s\t%s\t%s\n' "$key" "$el" "$(load1)" "$line" >> "$tmp/$name.marks"
      [ "$key" != first_status ] || say "$name: first status line at $el s"
      case "$key" in configure_start|build_start|build_end|learner_listening|solved) say "$name: $el s: $line" ;; esac
      [ "$key" = first_status ] && [ -n "$stop" ] && return 0
    fi
  done
  return 0
}

# --- 1. dockerd and the base image (as tests/compose_test.sh section 1) ---------------------------------------
command -v docker > /dev/null || fail "no docker client (apt-get install docker.io)"
if ! docker info > /dev/null 2>&1; then
  command -v dockerd > /dev/null || fail "no dockerd answers and none is installed (apt-get install docker.io)"
  [ "$(id -u)" -eq 0 ] || fail "no dockerd answers, and only root may start one"
  dockerd > "$tmp/dockerd.log" 2>&1 &
  started_dockerd=$!
  docker_up() { docker info > /dev/null 2>&1; }
  wait_until 60 docker_up || { tail -5 "$tmp/dockerd.log"; fail "dockerd cannot run on this machine"; }
  say "started dockerd $(docker version --format '{{.Server.Version}}')"
fi
base_from="local image"
if ! docker image inspect debian:12 > /dev/null 2>&1; then
  base_from="docker pull"
  if ! timeout 60 docker pull -q debian:12 > /dev/null 2>&1; then
    base_from="debootstrap --variant=minbase bookworm ($cache/rootfs)"
    if [ ! -x "$cache/rootfs/bin/sh" ]; then
      command -v debootstrap > /dev/null || fail "no debian:12 image and no debootstrap (apt-get install debootstrap)"
      rm -rf "$cache/rootfs.partial"
      mkdir -p "$cache"
      debootstrap --variant=minbase bookworm "$cache/rootfs.partial" http://deb.debian.org/debian > "$tmp/debootstrap.log" 2>&1 ||
        { tail -20 "$tmp/debootstrap.log"; fail "debootstrap failed"; }
      mv "$cache/rootfs.partial" "$cache/rootfs"
    fi
    tar -C "$cache/rootfs" -c . | docker import - debian:12 > /dev/null
  fi
fi
base_id="$(docker image inspect -f '{{.Id}}' debian:12)"
say "base image debian:12 ($base_from) $base_id"
commit="$(git -C "$ROOT" rev-parse HEAD)"  # both trees are this commit, even if HEAD moves meanwhile
cpus="$(nproc)"
cpu_opts=()
[ "$cpus" -le 2 ] || cpu_opts=(--cpuset-cpus "0,1")

# Preflight: what the launcher runs before it installs anything (bash, apt-get, dpkg-query, coreutils, awk, sed,
# grep, setpriv, mktemp), and what a new user might lack (git, ca-certificates; the sources are plain http).
docker run --rm "${cpu_opts[@]}" debian:12 sh -c '
  for c in bash apt-get dpkg-query nproc awk sed grep setpriv mktemp tar git; do
    command -v $c > /dev/null && echo "have $c" || echo "missing $c"
  done
  [ -d /etc/ssl/certs ] && [ -n "$(ls /etc/ssl/certs 2>/dev/null)" ] && echo "have ca-certificates" || echo "missing ca-certificates"
  echo "nproc $(nproc)"
  echo "sources $(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -E "^(deb|URIs|Suites)" | tr "\n" " ")"
  echo "packages $(dpkg-query -W -f="\${Status}\n" | grep -c "install ok installed")"' > "$tmp/preflight" 2>&1 ||
  { cat "$tmp/preflight"; fail "the base image does not run"; }
say "preflight: $(grep -c '^have' "$tmp/preflight") found; $(grep '^missing' "$tmp/preflight" | tr '\n' ' ')"

# --- 2. a bare machine: scripts/farm train to the first status line --------------------------------------------
bare="farm-first-hour-bare-$tag"
docker create --name "$bare" "${cpu_opts[@]}" -w /farm debian:12 \
  bash -c 'exec scripts/farm train 2>&1' > /dev/null
containers+=("$bare")
git -C "$ROOT" archive --prefix=farm/ "$commit" | docker cp - "$bare:/"
wait_for_load bare
echo "start	0	$(load1)	docker start" > "$tmp/bare.marks"
say "bare machine: scripts/farm train in debian:12 (commit ${commit:0:12}), load $(load1)"
t0="$EPOCHREALTIME"
# Once the status line is seen the container is stopped (TERM to the launcher), which also ends `docker start -a`.
{ timeout "$bare_limit_s" docker start -a "$bare" 2>&1 || true; } |
  { stream bare "$t0" stop || true; docker stop -t 10 "$bare" > /dev/null 2>&1 || true; }
printf 'end\t%s\t%s\t%s\n' "$(since "$t0")" "$(load1)" \
  "measurement over" >> "$tmp/bare.marks"
docker stop -t 10 "$bare" > /dev/null 2>&1 || true
bare_ok=1
grep -q '^first_status' "$tmp/bare.marks" || bare_ok=0
if [ "$bare_ok" -eq 0 ]; then
  say "the bare machine's run gave no status line; its last lines:"
  tail -30 "$tmp/bare.log" >&2 || true
fi

# --- 3. packages present: a fresh clone's scripts/farm train to CartPole solved ---------------------------------
if grep -q '^build_start' "$tmp/bare.marks"; then  # apt-get got everything installed
  docker commit "$bare" "$pkg_image" > /dev/null
  docker rm -f "$bare" > /dev/null
  pkgs="farm-first-hour-pkgs-$tag"
  docker create --name "$pkgs" "${cpu_opts[@]}" -w /fresh "$pkg_image" \
    bash -c 'exec scripts/farm train 2>&1' > /dev/null
  containers+=("$pkgs")
  git -C "$ROOT" archive --prefix=fresh/ "$commit" | docker cp - "$pkgs:/"
  wait_for_load packages
  echo "start	0	$(load1)	docker start" > "$tmp/pkgs.marks"
  say "packages present: scripts/farm train from a fresh tree, load $(load1)"
  t0="$EPOCHREALTIME"
  { timeout "$train_limit_s" docker start -a "$pkgs" 2>&1 || true; } | stream pkgs "$t0"
  printf 'end\t%s\t%s\t%s\n' "$(since "$t0")" "$(load1)" \
    "container exited" >> "$tmp/pkgs.marks"
  docker stop -t 40 "$pkgs" > /dev/null 2>&1 || true
  pkgs_rc="$(docker inspect -f '{{.State.ExitCode}}' "$pkgs")"
  mkdir -p "$tmp/runs"
  docker cp "$pkgs:/fresh/runs" - 2>/dev/null | tar -x -C "$tmp/runs" 2>/dev/null || true
  summary="$(find "$tmp/runs" -name summary.json -print -quit)"
  if [ "$pkgs_rc" != 0 ] || [ -z "$summary" ]; then
    say "the packages-present run exited $pkgs_rc (summary.json: ${summary:-none}); its last lines:"
    tail -30 "$tmp/pkgs.log" >&2 || true
  fi
else
  pkgs_rc="not run (the bare machine's package install did not finish)"
  summary=""
fi

# With --out, the timestamped logs and phase marks beside the JSON (FILE.bare.log, FILE.bare.marks, FILE.pkgs.*).
if [ -n "$out_json" ]; then
  for f in bare.log bare.marks pkgs.log pkgs.marks; do [ ! -f "$tmp/$f" ] || cp "$tmp/$f" "${out_json%.json}.$f"; done
fi

# --- the table -------------------------------------------------------------------------------------------------
/usr/bin/env python3 - "$tmp" "${summary:-}" "$pkgs_rc" "$commit" "$base_from" "$cpus" "$out_json" "$load_max" <<'PY'
import json, os, re, sys
tmp, summary_path, pkgs_rc, commit, base_from, cpus, out_json, load_max = sys.argv[1:9]

def marks(name):
    m, fetched = {}, []
    path = os.path.join(tmp, name + ".marks")
    if os.path.exists(path):
        for row in open(path, encoding="utf-8", errors="replace"):
            k, t, l, text = (row.rstrip("\n").split("\t", 3) + ["", "", ""])[:4]
            if k == "apt_fetched":
                fetched.append(text)
            m.setdefault(k, (float(t), float(l), text))
    return m, fetched

waits = {}
if os.path.exists(os.path.join(tmp, "waits")):
    for row in open(os.path.join(tmp, "waits")):
        n, s, g = row.split()
        waits[n] = {"waited_s": int(s), "gave_up": g == "1"}

rows, out = [], {"commit": commit, "base_image": base_from, "host_cores": int(cpus), "load_max": float(load_max),
                 "load_waits": waits}

def phase(m, label, a, b, key):
    if a in m and b in m:
        s = m[b][0] - m[a][0]
        rows.append((label, f"{s:.1f}", f"{m[a][1]:.2f}", f"{m[b][1]:.2f}"))
        out.setdefault(key[0], {})[key[1]] = {"seconds": round(s, 1), "load_start": m[a][1], "load_end": m[b][1]}
    else:
        rows.append((label, "-", f"{m[a][1]:.2f}" if a in m else "-", "-"))

b, fetched = marks("bare")
out["preflight"] = open(os.path.join(tmp, "preflight")).read().split("\n")
if b:
    apt_from = "apt_start" if "apt_start" in b else "start"
    phase(b, "bare: launch -> apt-get start", "start", apt_from, ("bare", "launch"))
    phase(b, "bare: apt-get update + install", apt_from, "configure_start", ("bare", "apt_get"))
    phase(b, "bare: configure (cmake)", "configure_start", "build_start", ("bare", "configure"))
    phase(b, "bare: build farm-learner farm-worker", "build_start", "build_end", ("bare", "build"))
    phase(b, "bare: learner start -> first status line", "build_end", "first_status", ("bare", "start_to_status"))
    phase(b, "bare: TOTAL launch -> first status line", "start", "first_status", ("bare", "total_to_status"))
    for k in ("apt_need", "build_end", "error"):
        if k in b:
            out.setdefault("bare", {})[k + "_line"] = b[k][2]
    out.setdefault("bare", {})["apt_fetched_lines"] = fetched
p, _ = marks("pkgs")
if p:
    phase(p, "pkgs: launch + package check + configure", "start", "build_start", ("packages_present", "configure"))
    phase(p, "pkgs: build farm-learner farm-worker", "build_start", "build_end", ("packages_present", "build"))
    phase(p, "pkgs: learner start -> first status line", "build_end", "first_status", ("packages_present", "start_to_status"))
    phase(p, "pkgs: first status line -> target reached", "first_status", "solved", ("packages_present", "status_to_solved"))
    phase(p, "pkgs: TOTAL launch -> target reached", "start", "solved", ("packages_present", "total_to_solved"))
    phase(p, "pkgs: TOTAL launch -> run ended", "start", "end", ("packages_present", "total_wall"))
    for k in ("build_end", "solved", "error"):
        if k in p:
            out.setdefault("packages_present", {})[k + "_line"] = p[k][2]
out.setdefault("packages_present", {})["exit_code"] = pkgs_rc
if summary_path:
    s = json.load(open(summary_path))
    keep = ("solved_at_steps", "solved_at_seconds", "env_steps", "wall_seconds", "stop_reason", "mean_return_100",
            "workers_joined")
    out["packages_present"]["summary"] = {k: s.get(k) for k in keep}

w = max(len(r[0]) for r in rows) if rows else 10
print(f"A new user's first hour (commit {commit[:12]}, debian:12 from {base_from}, {cpus} host cores)")
print(f"{'phase':<{w}}  {'seconds':>8}  {'load1 start':>11}  {'load1 end':>9}")
for r in rows:
    print(f"{r[0]:<{w}}  {r[1]:>8}  {r[2]:>11}  {r[3]:>9}")
for n, v in waits.items():
    print(f"load wait before {n}: {v['waited_s']} s" + (" (gave up: measured above the limit)" if v["gave_up"] else ""))
bb = out.get("bare", {})
if "apt_need_line" in bb:
    print("apt-get:", bb["apt_need_line"], "|", (bb.get("apt_fetched_lines") or ["-"])[-1])
ps = out["packages_present"].get("summary")
if ps:
    print(f"pkgs summary.json: solved_at_steps {ps['solved_at_steps']}, solved_at_seconds {ps['solved_at_seconds']}, "
          f"env_steps {ps['env_steps']}, wall_seconds {ps['wall_seconds']}, mean_return_100 {ps['mean_return_100']}, "
          f"stop_reason '{ps['stop_reason']}'")
print("pkgs exit code:", pkgs_rc)
missing = [l for l in out["preflight"] if l.startswith("missing")]
print("bare image lacks:", ", ".join(l.split()[1] for l in missing) or "nothing the launcher checks for")
tb, tp = bb.get("total_to_status", {}).get("seconds"), out["packages_present"].get("total_wall", {}).get("seconds")
print(f"issue 32 targets: bare -> first status line <= 480 s: {tb} s; packages present, fresh tree -> solved "
      f"(run ended) <= 240 s: {tp} s")
if out_json:
    with open(out_json, "w") as f:
        json.dump(out, f, indent=2)
PY
[ "$bare_ok" -eq 1 ] && [ "$pkgs_rc" = 0 ] && [ -n "$summary" ] || exit 1
