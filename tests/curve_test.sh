#!/usr/bin/env bash
# CURVE over real processes. Keys come from `scripts/farm keygen`; the learner runs with
# transport.curve on, bound to 127.0.0.1 (CURVE works on loopback too), and lists one worker key.
# A worker with an unlisted key, one without CURVE and one with the wrong learner key are turned
# away at once, each with a message that says why (none gets a Welcome; the learner logs and counts
# the refused key), and the listed worker trains to the end of a short run. Then the bind rule:
# tcp://0.0.0.0 without transport.curve or transport.insecure is refused with a message naming
# both, and leaves no run directory; with transport.insecure=true the learner starts.
# Usage: curve_test.sh BUILD_DIR
build_dir="$(cd "$1" && pwd)"
source "$(dirname "$0")/lib.sh"
learner_bin="$build_dir/learner/farm-learner"
worker_bin="$build_dir/worker/farm-worker"
config="$root/configs/cartpole.yaml"
farm() { FARM_BUILD_DIR="$build_dir" FARM_SKIP_BUILD=1 "$root/scripts/farm" "$@"; }
# wait_endpoint PID FILE: until the learner PID has written FILE.
wait_endpoint() {
  for _ in $(seq 600); do
    [ -s "$2" ] && return 0
    kill -0 "$1" 2>/dev/null || fail "the learner exited before listening"
    sleep 0.1
  done
  fail "the learner did not listen within 60 s"
}
# expect_refused NAME PATTERN WORKER-ARGS...: the worker must exit 1 within 10 s, saying PATTERN.
expect_refused() {
  local name="$1" pattern="$2" rc=0 t0
  shift 2
  t0=$(date +%s%N)
  timeout 20 "$worker_bin" --config "$config" --learner "$endpoint" "$@" > "$tmp/$name.log" 2>&1 || rc=$?
  local ms=$((($(date +%s%N) - t0) / 1000000))
  [ "$rc" -eq 1 ] || { cat "$tmp/$name.log"; fail "$name: expected exit status 1, got $rc"; }
  grep -qF -- "$pattern" "$tmp/$name.log" || { cat "$tmp/$name.log"; fail "$name: no '$pattern' in its output"; }
  [ "$ms" -lt 10000 ] || fail "$name: took $ms ms to give up (expected well under worker_give_up_s = 20 s)"
  echo "ok: $name turned away in $ms ms: $(grep -m 1 -F -- "$pattern" "$tmp/$name.log")"
}

# 1. Keys.
keys="$tmp/keys"
for name in learner worker-a stranger; do farm keygen "$keys" "$name" > /dev/null; done
[ "$(stat -c %a "$keys/learner.key")" = 600 ] || fail "a secret key file must have mode 600"
if farm keygen "$keys" worker-a 2> "$tmp/again.err"; then fail "keygen overwrote an existing key pair"; fi
grep -q "already exists" "$tmp/again.err" || fail "keygen: no 'already exists' message"
cat "$keys/worker-a.pub" > "$keys/authorized_keys"  # one "KEY NAME" line per admitted worker
stranger_pub="$(cut -d' ' -f1 "$keys/stranger.pub")"

# 2. A CURVE learner; shared settings as one config file would hold them (keys named by role).
common=(--set seed=3 --set total_env_steps=4096 --set stop_at_target=false --set learner.progress_interval_s=100
        --set transport.worker_give_up_s=20 --set transport.curve=true
        --set "transport.curve_learner_public_key_file=$keys/learner.pub")
"$learner_bin" --config "$config" "${common[@]}" --set "transport.curve_learner_secret_key_file=$keys/learner.key" \
  --set "transport.curve_authorized_keys=$keys/authorized_keys" --set "run_dir=$tmp/run" \
  --endpoint-file "$tmp/endpoint" > "$tmp/learner.log" 2>&1 &
learner=$!
pids+=("$learner")
wait_endpoint "$learner" "$tmp/endpoint"
endpoint="$(cat "$tmp/endpoint")"
case "$endpoint" in tcp://127.0.0.1:*) ;; *) fail "expected a loopback endpoint, got $endpoint" ;; esac

# 3. Strangers are turned away, each knowing why.
expect_refused stranger "refused this worker's CURVE public key $stranger_pub" "${common[@]}" \
  --set "transport.curve_worker_secret_key_file=$keys/stranger.key" --index 7
expect_refused plain "requires CURVE" "${common[@]}" --set transport.curve=false --index 8
expect_refused wrong-learner-key "is transport.curve_learner_public_key_file the learner's public key" \
  "${common[@]}" --set "transport.curve_worker_secret_key_file=$keys/worker-a.key" \
  --set "transport.curve_learner_public_key_file=$keys/stranger.pub" --index 9

# 3b. A learner that resets every connection before the handshake completes: how a CURVE learner looks to a
# plain worker on a machine where the learner detects the mismatch first (the worker's ZeroMQ then reports no
# mismatch, only closed connections, and reconnects). Both workers must say so within seconds, not wait for a
# Welcome until worker_give_up_s.
python3 "$root/tests/tools/closing_listener.py" "$tmp/closing.port" &
pids+=($!)
wait_until 10 test -s "$tmp/closing.port" || fail "the closing listener did not start"
closing="tcp://127.0.0.1:$(cat "$tmp/closing.port")"
saved_endpoint="$endpoint"
endpoint="$closing"
expect_refused closing-plain "closed the connection during the ZeroMQ handshake 3 times in a row: it requires CURVE" \
  "${common[@]}" --set transport.curve=false --index 10
expect_refused closing-curve "closed the connection during the CURVE handshake 3 times in a row" "${common[@]}" \
  --set "transport.curve_worker_secret_key_file=$keys/worker-a.key" --index 11
rc=0
FARM_PYTHON_PATH="$build_dir/python" PYTHONPATH="$root/worker/python" timeout 20 "$(farm_python)" -m farm_worker --learner "$closing" \
  --env-module "$root/tests/python/cue_env.py:make" --index 12 --give-up-s 20 > "$tmp/closing-py.log" 2>&1 || rc=$?
[ "$rc" -eq 1 ] && grep -qF "closed the connection during the ZeroMQ handshake 3 times in a row: it requires CURVE" \
  "$tmp/closing-py.log" || { cat "$tmp/closing-py.log"; fail "closing-py: expected status 1 and the closed-handshake message"; }
echo "ok: the Python worker: $(grep -m 1 -F "closed the connection" "$tmp/closing-py.log")"
endpoint="$saved_endpoint"

# 4. The listed worker trains to the end of the run.
start=$(date +%s)
"$worker_bin" --config "$config" "${common[@]}" --set "transport.curve_worker_secret_key_file=$keys/worker-a.key" \
  --learner "$endpoint" --index 0 > "$tmp/worker-a.log" 2>&1 &
worker=$!
pids+=("$worker")
rc=0
wait "$learner" || rc=$?
[ "$rc" -eq 0 ] || { tail -20 "$tmp/learner.log"; fail "the learner exited with status $rc"; }
rc=0
wait "$worker" || rc=$?
[ "$rc" -eq 0 ] || { tail -20 "$tmp/worker-a.log"; fail "the listed worker exited with status $rc"; }
echo "listed worker trained in $(($(date +%s) - start)) s"
python3 - "$tmp/run/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print("summary:", json.dumps({k: s[k] for k in ("workers", "env_steps", "protocol_errors", "auth_refused")}))
assert s["workers"] == 1, s["workers"]  # none of the strangers ever joined
assert s["env_steps"] >= 4096, s["env_steps"]
assert s["protocol_errors"] == 0, s["protocol_errors"]
assert s["auth_refused"] >= 1, s["auth_refused"]
PY
grep -qF "refused a worker from 127.0.0.1: its CURVE public key $stranger_pub is not in transport.curve_authorized_keys" \
  "$tmp/learner.log" || { cat "$tmp/learner.log"; fail "the learner did not log the refused key"; }
grep -qF "admitted a worker from 127.0.0.1 with CURVE key 'worker-a'" "$tmp/learner.log" ||
  { cat "$tmp/learner.log"; fail "the learner did not log the admitted key"; }
echo "ok: the listed worker trained, the stranger was refused and counted"

# 5. The bind rule.
rc=0
"$learner_bin" --config "$config" --set transport.bind='tcp://0.0.0.0:*' --set "run_dir=$tmp/run-open" \
  > "$tmp/open.log" 2>&1 || rc=$?
[ "$rc" -eq 2 ] || { cat "$tmp/open.log"; fail "binding 0.0.0.0 without curve or insecure: expected status 2, got $rc"; }
grep -qF "transport.bind: 'tcp://0.0.0.0:*' is not a loopback address" "$tmp/open.log" || { cat "$tmp/open.log"; fail "no clear message"; }
grep -qF "transport.curve: true" "$tmp/open.log" && grep -qF "transport.insecure: true" "$tmp/open.log" ||
  { cat "$tmp/open.log"; fail "the message must name transport.curve and transport.insecure"; }
[ ! -e "$tmp/run-open" ] || fail "a refused learner left a run directory behind"
echo "ok: refused: $(cat "$tmp/open.log")"
"$learner_bin" --config "$config" --set transport.bind='tcp://0.0.0.0:*' --set transport.insecure=true \
  --set "run_dir=$tmp/run-insecure" --endpoint-file "$tmp/endpoint-insecure" > "$tmp/insecure.log" 2>&1 &
learner=$!
pids+=("$learner")
wait_endpoint "$learner" "$tmp/endpoint-insecure"
grep -qF "admits any worker, unencrypted" "$tmp/insecure.log" || { cat "$tmp/insecure.log"; fail "no warning for insecure"; }
kill -TERM "$learner"
wait "$learner" || true
echo "ok: with transport.insecure=true the learner listens on $(cat "$tmp/endpoint-insecure")"
