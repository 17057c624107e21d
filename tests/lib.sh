# Sourced by the shell tests (`source "$(dirname "$0")/lib.sh"`): strict mode, $root (the source tree), a fresh
# $tmp of the test's own (so that tests run in parallel never share files), removed on exit after every
# process in $pids has been stopped, and helpers that wait on conditions instead of sleeping.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/farm-$(basename "$0" .sh).XXXXXX")"
pids=()

# A test with more to undo (network namespaces, say) redefines cleanup_extra; it runs first.
cleanup_extra() { :; }
# TERM (and CONT, for a frozen one) to every process in $pids, KILL to those still there after 5 s: a
# launcher or a `timeout` wrapper gets the chance to stop its own children.
farm_cleanup() {
  local p alive
  cleanup_extra || true
  for p in "${pids[@]+"${pids[@]}"}"; do
    kill -TERM "$p" 2>/dev/null || true
    kill -CONT "$p" 2>/dev/null || true
  done
  for _ in $(seq 50); do
    alive=0
    for p in "${pids[@]+"${pids[@]}"}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" -eq 1 ] || break
    sleep 0.1
  done
  for p in "${pids[@]+"${pids[@]}"}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap farm_cleanup EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# wait_until SECONDS COMMAND...: runs COMMAND every 0.1 s until it succeeds (status 0) or SECONDS have passed
# (status 1).
wait_until() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.1
  done
}
# has_rows FILE N: FILE exists and has at least N lines (metrics.jsonl: one per update).
has_rows() { [ -f "$1" ] && [ "$(wc -l < "$1")" -ge "$2" ]; }
# running PID: the process has not exited.
running() { kill -0 "$1" 2>/dev/null; }

# free_port: a TCP port on 127.0.0.1 that nothing is bound to, drawn from 20000-32767. For a learner that must
# be restarted on the same port: below Linux's ephemeral range (32768 and up), so that no client socket,
# workers' reconnecting ones included, can be given it in the meantime. Drawn at random (not seeded: two tests
# started at once must not draw the same port) and checked by binding it. free_port N: the first of N consecutive
# free ports.
free_port() {
  python3 - "${1:-1}" <<'PY'
import random, socket, sys
n = int(sys.argv[1])  # free_port N: the first of N consecutive free ports (a learner per policy on P, P+1, ...)
rng = random.SystemRandom()
def free(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()
for _ in range(500):
    port = rng.randrange(20000, 32768 - n + 1)
    if all(free(port + i) for i in range(n)):
        print(port)
        break
else:
    raise SystemExit(f"free_port: no {n} free consecutive ports in 20000-32767")
PY
}
# farm_python: a python3 that can import zmq and google.protobuf (the Python worker's needs): $FARM_PYTHON,
# python3 or /usr/bin/python3 (a pyenv or venv python3 first on PATH may lack Debian's packages).
farm_python() {
  local py
  for py in ${FARM_PYTHON:-} python3 /usr/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    if "$py" -c 'import zmq, google.protobuf' 2>/dev/null; then echo "$py"; return 0; fi
  done
  fail "no python3 here can import zmq and google.protobuf (apt-get install -y python3-zmq python3-protobuf)"
}
# netns_pair TAG: two network namespaces, $ns_l (TAG-l, the learner's) and $ns_w (TAG-w, the workers'), joined by a
# veth pair (TAGa in $ns_l at $addr_l, TAGb in $ns_w at $addr_w), loopbacks up. Status 1, with nothing made, when
# namespaces cannot be created here. netns_pair_remove undoes it (call it from cleanup_extra).
netns_pair() {
  local tag="$1" net
  ns_l="${tag}-l" ns_w="${tag}-w"
  net="10.$((100 + $$ % 100)).$((($$ / 100) % 250))"
  addr_l="$net.1" addr_w="$net.2"
  ip netns add "$ns_l" 2>/dev/null || return 1
  ip netns add "$ns_w"
  ip link add "${tag}a" type veth peer name "${tag}b"
  ip link set "${tag}a" netns "$ns_l"
  ip link set "${tag}b" netns "$ns_w"
  ip -n "$ns_l" addr add "$addr_l/24" dev "${tag}a"
  ip -n "$ns_w" addr add "$addr_w/24" dev "${tag}b"
  ip -n "$ns_l" link set lo up
  ip -n "$ns_w" link set lo up
  ip -n "$ns_l" link set "${tag}a" up
  ip -n "$ns_w" link set "${tag}b" up
}
netns_pair_remove() {
  ip netns del "${ns_l:-}" 2>/dev/null || true
  ip netns del "${ns_w:-}" 2>/dev/null || true
}

# find_torch_python: sets $torch_python to a python3 that can import torch: the one on PATH, else Debian's (a
# pyenv or venv python3 on PATH does not see Debian's dist-packages); fails the test when there is none.
find_torch_python() {
  torch_python=""
  local py
  for py in python3 /usr/bin/python3; do
    if command -v "$py" >/dev/null && "$py" -c "import torch" 2>/dev/null; then torch_python="$py"; return 0; fi
  done
  fail "no python3 can 'import torch'; install the Debian package: apt-get install python3-torch"
}
