#!/usr/bin/env bash
# The Python worker's interpreter (env.python_interpreter, empty: automatic) on a machine whose first python3 on
# PATH lacks numpy, as a pyenv or conda python3 does: a shim in a temporary directory first on PATH runs Debian's
# /usr/bin/python3 with a `numpy` package ahead of the real one whose import fails.
# 1. farm-worker with env.python_interpreter set to the shim exits 2 at once with the message (docker-compose and
#    cluster launches run farm-worker like this).
# 2. `scripts/farm run examples/python/uav_coverage.yaml` (the README's example, no python_interpreter in it)
#    picks /usr/bin/python3, says so once with the reason, and trains (summary.json, env steps > 0).
# 3. env.python_interpreter set to the shim: one message naming it, what it lacks and the fixes; exit status 2;
#    no learner started (no run directory).
# 4. Automatic, with FARM_SYSTEM_PYTHON (the fallback for /usr/bin/python3) a second shim lacking zmq: the
#    message names both interpreters and what each lacks; exit status 2; no learner started.
# About 45 s on two cores (the 30 s of training in part 2).
# Usage: python_interpreter_test.sh BUILD_DIR
build_dir="$(cd "$1" && pwd)"
source "$(dirname "$0")/lib.sh"
export PYTHONDONTWRITEBYTECODE=1  # no __pycache__ in the source tree

worker_bin="$build_dir/worker/farm-worker"
learner_bin="$build_dir/learner/farm-learner"
[ -x "$worker_bin" ] || fail "$worker_bin not built"
[ -x "$learner_bin" ] || fail "$learner_bin not built"
/usr/bin/python3 -c 'import zmq, google.protobuf, numpy' 2>/dev/null ||
  fail "/usr/bin/python3 cannot import zmq, google.protobuf and numpy (apt-get install -y python3-zmq python3-protobuf python3-numpy)"
config="$root/examples/python/uav_coverage.yaml"
! grep -q python_interpreter "$config" || fail "$config sets env.python_interpreter: the automatic choice is not tested"

# shim DIR MODULE: DIR/python3, Debian's python3 with a package MODULE first on its path that cannot be imported.
shim() {
  local dir="$1" module="$2"
  mkdir -p "$dir/bin" "$dir/hide/$module"
  echo "raise ImportError('$module hidden by python_interpreter_test')" > "$dir/hide/$module/__init__.py"
  printf '#!/bin/sh\nPYTHONPATH="%s${PYTHONPATH:+:$PYTHONPATH}" exec /usr/bin/python3 "$@"\n' "$dir/hide" > "$dir/bin/python3"
  chmod +x "$dir/bin/python3"
}
shim "$tmp/pyenv" numpy
shim "$tmp/system" zmq
bad="$tmp/pyenv/bin/python3"
"$bad" -c 'import zmq, google.protobuf' || fail "the shim $bad should import zmq and google.protobuf"
! "$bad" -c 'import numpy' 2>/dev/null || fail "the shim $bad should not import numpy"
farm() { PATH="$tmp/pyenv/bin:$PATH" FARM_BUILD_DIR="$build_dir" FARM_SKIP_BUILD=1 "$root/scripts/farm" "$@"; }

# check_refused LOG RC RUN_DIR INTERPRETER...: exit status 2, one message naming each interpreter, the fixes, no
# learner or worker started.
check_refused() {
  local log="$1" rc="$2" run="$3" py
  shift 3
  [ "$rc" -eq 2 ] || { cat "$log"; fail "expected exit status 2, got $rc"; }
  [ "$(grep -c 'run the Python worker (env.python), which imports zmq, google.protobuf, numpy' "$log")" -eq 1 ] ||
    { cat "$log"; fail "expected the message once"; }
  for py in "$@"; do grep -qF "  $py" "$log" || { cat "$log"; fail "the message does not name $py"; }; done
  # The fixes: another interpreter, or the Debian packages (the shims run Debian's python3: apt, not pip).
  grep -qF "env.python_interpreter: /path/to/python" "$log" && grep -qF -- "--set env.python_interpreter=" "$log" &&
    grep -q "apt-get install -y python3-[a-z]*   (for $tmp/.*/bin/python3)" "$log" ||
    { cat "$log"; fail "the message does not give the fixes"; }
  [ ! -e "$run" ] || fail "a run directory was made: the learner started"
  ! grep -q "learner listening\|starting .* workers\|Traceback" "$log" || { cat "$log"; fail "something started"; }
}

# 1. farm-worker itself, as docker-compose runs it.
rc=0
PATH="$tmp/pyenv/bin:$PATH" timeout 60 "$worker_bin" --config "$config" --learner tcp://127.0.0.1:1 \
  --set "env.python_interpreter=$bad" > "$tmp/worker.log" 2>&1 || rc=$?
check_refused "$tmp/worker.log" "$rc" "$tmp/no-run" "$bad (runs /usr/bin/python3"
grep -qF "lacks numpy (numpy hidden by python_interpreter_test)" "$tmp/worker.log" ||
  { cat "$tmp/worker.log"; fail "farm-worker does not say what $bad lacks"; }
echo "ok: farm-worker refuses $bad (exit 2)"

# 2. Automatic: python3 on PATH (the shim) lacks numpy, /usr/bin/python3 is used, said once; it trains.
farm run "$config" --workers 2 --set max_wall_seconds=30 --set run_dir="$tmp/run" \
  > "$tmp/train.log" 2>&1 || { cat "$tmp/train.log"; fail "scripts/farm run failed"; }
[ "$(grep -c '^python: using' "$tmp/train.log")" -eq 1 ] || { cat "$tmp/train.log"; fail "expected one 'python: using' line"; }
grep -q "^python: using /usr/bin/python3 (.*python3 on PATH = $bad .* lacks numpy" "$tmp/train.log" ||
  { cat "$tmp/train.log"; fail "the choice of /usr/bin/python3 over $bad is not said"; }
! grep -q "Traceback\|No module named" "$tmp/train.log" || { cat "$tmp/train.log"; fail "a worker failed"; }
python3 - "$tmp/run/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print("summary:", {k: s.get(k) for k in ("workers", "env_steps", "agent_steps", "updates", "protocol_errors")})
assert s["env_steps"] > 0, s
assert s["protocol_errors"] == 0, s
PY
echo "ok: $(grep '^python: using' "$tmp/train.log")"

# 3. Set to the shim: refused before anything starts.
rc=0
farm run "$config" --workers 2 --set "env.python_interpreter=$bad" --set run_dir="$tmp/run3" > "$tmp/set.log" 2>&1 ||
  rc=$?
check_refused "$tmp/set.log" "$rc" "$tmp/run3" "$bad"
grep -qF "lacks numpy" "$tmp/set.log" || { cat "$tmp/set.log"; fail "the message does not say $bad lacks numpy"; }
echo "ok: env.python_interpreter=$bad refused once, exit 2, nothing started"

# 4. Automatic with no usable interpreter (FARM_SYSTEM_PYTHON, the fallback, lacks zmq): refused.
rc=0
FARM_SYSTEM_PYTHON="$tmp/system/bin/python3" farm run "$config" --workers 2 --set run_dir="$tmp/run4" \
  > "$tmp/auto.log" 2>&1 || rc=$?
check_refused "$tmp/auto.log" "$rc" "$tmp/run4" "python3 on PATH = $bad" "$tmp/system/bin/python3"
grep -qF "lacks numpy" "$tmp/auto.log" && grep -qF "lacks zmq (zmq hidden by python_interpreter_test)" "$tmp/auto.log" &&
  grep -qF "python3-numpy   (for $bad)" "$tmp/auto.log" && grep -qF "python3-zmq   (for $tmp/system/bin/python3)" "$tmp/auto.log" ||
  { cat "$tmp/auto.log"; fail "the message does not say what each interpreter lacks"; }
echo "ok: no usable interpreter: one message, exit 2, nothing started"
cat "$tmp/auto.log"
