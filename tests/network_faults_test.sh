#!/usr/bin/env bash
# A network that misbehaves between the learner and its workers: the learner in one network namespace, two
# workers in another, joined by a veth pair, and four runs of the same config, each from scratch:
#   perfect     the bare link;
#   delay       20 ms +- 5 ms each way (tests/net_delay_proxy.py in the learner's namespace: this kernel has no
#               sch_netem for `tc qdisc ... netem`);
#   loss        1 % of packets dropped each way (iptables' statistic match in both namespaces);
#   blip        the workers' link down for 5 s mid-run, then up again: shorter than
#               transport.heartbeat_timeout_s (10 s), so ridden out on the same connections, no worker lost;
#   partition   the workers' link down for 15 s mid-run, then up again.
# Every run must reach its step budget with both workers there at the end: after the partition the workers,
# dropped as silent (transport.heartbeat_timeout_s, 10 s), rejoin by themselves (they try again until
# transport.worker_give_up_s, 60 s). Prints one table row per run: env steps/s, workers lost and rejoined,
# replies dropped, the end state (docs/OPERATIONS.md, "A network that misbehaves").
# Exits 77 (CTest: skipped) without root, iproute2 or network namespaces.
# Usage: network_faults_test.sh BUILD_DIR [CONFIG [MODE]]   (MODE: sync or async; NET_STEPS and NET_DELAY_STEPS
# set the budgets of the runs without and with the delay; NET_CASES, the runs to make, by name)
build_dir="$(cd "$1" && pwd)"
source "$(dirname "$0")/lib.sh"
config="${2:-$root/configs/cartpole.yaml}"
mode="${3:-sync}"
steps="${NET_STEPS:-30000}"
delay_steps="${NET_DELAY_STEPS:-6000}"
cases="${NET_CASES:-perfect delay loss blip partition}"
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
  echo "skipped: needs root and iproute2 (ip netns)"; exit 77
fi
command -v iptables >/dev/null || fail "iptables not found (apt-get install -y iptables; scripts/farm test installs it)"
py="$(farm_python)"
tag="nf$$"
cleanup_extra() { netns_pair_remove; }
netns_pair "$tag" || { echo "skipped: cannot create network namespaces here"; exit 77; }

common=(--set "mode=$mode" --set stop_at_target=false --set learner.progress_interval_s=100)
# run_case NAME STEPS ENDPOINT [DURING...]: a learner and two workers; DURING (a command) runs while they do.
run_case() {
  local name="$1" budget="$2" endpoint="$3" learner w p rc
  shift 3
  local run="$tmp/$name" workers=()
  ip netns exec "$ns_l" "$build_dir/learner/farm-learner" --config "$config" "${common[@]}" \
    --set "total_env_steps=$budget" --set "transport.bind=tcp://0.0.0.0:5555" --set transport.insecure=true \
    --set "run_dir=$run" --endpoint-file "$tmp/$name.endpoint" > "$tmp/$name-learner.log" 2>&1 &
  learner=$!
  pids+=("$learner")
  wait_until 30 test -s "$tmp/$name.endpoint" || { cat "$tmp/$name-learner.log"; fail "$name: the learner did not start"; }
  for w in 0 1; do
    ip netns exec "$ns_w" "$build_dir/worker/farm-worker" --config "$config" "${common[@]}" \
      --set "total_env_steps=$budget" --learner "$endpoint" --index "$w" --stats-file "$tmp/$name-worker-$w.json" \
      > "$tmp/$name-worker-$w.log" 2>&1 &
    workers+=($!)
    pids+=($!)
  done
  [ $# -eq 0 ] || "$@" "$run"
  rc=0
  wait "$learner" || rc=$?
  [ "$rc" -eq 0 ] || { tail -n 20 "$tmp/$name"-*.log; fail "$name: the learner exited with status $rc"; }
  for p in "${workers[@]}"; do
    wait "$p" || { tail -n 20 "$tmp/$name"-*.log; fail "$name: a worker failed"; }
  done
  "$py" - "$name" "$run/summary.json" "$budget" <<'PY' || { tail -n 20 "$tmp/$name"-*.log; exit 1; }
import json, sys
name, path, budget = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = json.load(open(path))
print(f"| {name} | {s['env_steps']} | {s['sps']:.0f} | {s['workers_lost']} | {s['rejoins']} | "
      f"{s['workers_replaced']} | {s['replies_dropped']} | {s['stop_reason']} |")
assert s["env_steps"] >= budget and s["stop_reason"].startswith("reached total_env_steps"), s
assert s["workers_active"] == 2, s
# A worker the learner lost came back as a new connection of the same process.
assert s["rejoins"] >= s["workers_lost"], s
if name == "blip":
    assert s["workers_lost"] == 0 and s["rejoins"] == 0, ("a 5 s outage is ridden out", s)
PY
}

# link_down SECONDS RUN_DIR: once the run has 3 updates, the workers' link goes down for SECONDS.
link_down() {
  wait_until 60 has_rows "$2/metrics.jsonl" 3 || fail "the run did not reach 3 updates"
  ip -n "$ns_w" link set "${tag}b" down
  echo "  link down for $1 s"
  sleep "$1"
  ip -n "$ns_w" link set "${tag}b" up
  echo "  link up"
}
wanted() { [[ " $cases " == *" $1 "* ]]; }

echo "$(basename "$config") $mode, 2 workers"
echo "| link | env steps | env steps/s | workers lost | rejoins | replaced | replies dropped | end |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
if wanted perfect; then run_case perfect "$steps" "tcp://$addr_l:5555"; fi

if wanted delay; then
  ip netns exec "$ns_l" "$py" "$root/tests/net_delay_proxy.py" 0.0.0.0 5556 127.0.0.1 5555 20 5 1 > "$tmp/proxy.log" 2>&1 &
  pids+=($!)
  wait_until 10 grep -q delaying "$tmp/proxy.log" || { cat "$tmp/proxy.log"; fail "the delay proxy did not start"; }
  run_case delay "$delay_steps" "tcp://$addr_l:5556"
fi

if wanted loss; then
  for ns in "$ns_l" "$ns_w"; do
    ip netns exec "$ns" iptables -A OUTPUT -m statistic --mode random --probability 0.01 -j DROP
  done
  run_case loss "$steps" "tcp://$addr_l:5555"
  for ns in "$ns_l" "$ns_w"; do ip netns exec "$ns" iptables -F OUTPUT; done
fi

if wanted blip; then run_case blip "$steps" "tcp://$addr_l:5555" link_down 5; fi
if wanted partition; then run_case partition "$steps" "tcp://$addr_l:5555" link_down 15; fi
echo "ok"
