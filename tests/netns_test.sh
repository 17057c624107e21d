#!/usr/bin/env bash
# Multi-host for real on one machine: the learner and two workers live in
# separate network namespaces joined by a veth pair, and talk over TCP.
# Exits 77 (CTest: skipped) without root or iproute2.
# Usage: netns_test.sh BUILD_DIR
build_dir="$1"
source "$(dirname "$0")/lib.sh"
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
  echo "skipped: needs root and iproute2 (ip netns)"; exit 77
fi
cleanup_extra() { netns_pair_remove; }
netns_pair "farm$$" || { echo "skipped: cannot create network namespaces here"; exit 77; }

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
