#!/usr/bin/env bash
# Multi-host for real on one machine: the learner and two workers live in
# separate network namespaces joined by a veth pair, and talk over TCP.
# Exits 77 (CTest: skipped) without root or iproute2.
# Usage: netns_test.sh BUILD_DIR
set -euo pipefail
build_dir="$1"
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
  echo "skipped: needs root and iproute2 (ip netns)"; exit 77
fi
tag="farm$$"
ns_l="${tag}-l" ns_w="${tag}-w"
net="10.$((100 + $$ % 100)).$((($$ / 100) % 250)).0"
addr_l="${net%.0}.1" addr_w="${net%.0}.2"
tmp="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del "$ns_l" 2>/dev/null || true
  ip netns del "$ns_w" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
if ! ip netns add "$ns_l" 2>/dev/null; then echo "skipped: cannot create network namespaces here"; exit 77; fi
ip netns add "$ns_w"
ip link add "${tag}a" type veth peer name "${tag}b"
ip link set "${tag}a" netns "$ns_l"
ip link set "${tag}b" netns "$ns_w"
ip -n "$ns_l" addr add "$addr_l/24" dev "${tag}a"
ip -n "$ns_w" addr add "$addr_w/24" dev "${tag}b"
for ns in "$ns_l" "$ns_w"; do ip -n "$ns" link set lo up; done
ip -n "$ns_l" link set "${tag}a" up
ip -n "$ns_w" link set "${tag}b" up

config="$root/configs/cartpole.yaml"
common=(--set total_env_steps=20000 --set stop_at_target=false --set learner.progress_interval_s=100)
# A non-loopback bind needs transport.curve or an explicit transport.insecure: plain TCP here (tests/curve_test.sh
# covers CURVE).
ip netns exec "$ns_l" "$build_dir/learner/farm-learner" --config "$config" "${common[@]}" \
  --set "transport.bind=tcp://$addr_l:5555" --set transport.insecure=true --set "run_dir=$tmp/run" \
  --endpoint-file "$tmp/endpoint" &
learner=$!
pids+=("$learner")
for _ in $(seq 300); do [ -s "$tmp/endpoint" ] && break; sleep 0.1; done
[ -s "$tmp/endpoint" ] || { echo "learner did not start"; exit 1; }
# The worker namespace cannot see the learner's loopback: only the veth address works.
for i in 0 1; do
  ip netns exec "$ns_w" "$build_dir/worker/farm-worker" --config "$config" "${common[@]}" \
    --learner "tcp://$addr_l:5555" --index "$i" &
  pids+=($!)
done
wait "$learner"
python3 - "$tmp/run/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print("summary:", json.dumps(s))
assert s["workers"] == 2, s["workers"]
assert s["env_steps"] >= 20000, s["env_steps"]
assert s["protocol_errors"] == 0
print("ok: two workers in another namespace trained over TCP")
PY
