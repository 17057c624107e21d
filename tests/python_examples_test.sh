#!/usr/bin/env bash
# The Python examples (examples/python) stepped by the Python worker, without a learner and without training:
# tests/python/examples_test.py (every example config's env.python through a PythonWorker's groups; memory_cue_np.py's
# rules: the cue at step 0 only, delay + 1 steps, the answer's reward, memoryless policies at 1 / choices).
# Usage: python_examples_test.sh
# Needs python3 with numpy, zmq and google.protobuf, as the worker does (Debian: python3-numpy python3-zmq
# python3-protobuf).
source "$(dirname "$0")/lib.sh"

# The interpreter: $FARM_PYTHON, else python3 on PATH, else Debian's /usr/bin/python3 (a pyenv or venv python3 on
# PATH does not see Debian's python3-* packages), the first that can import what the worker imports.
pick_python() {
  local py
  for py in ${FARM_PYTHON:-} python3 /usr/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    if "$py" -c 'import numpy, zmq, google.protobuf' 2>/dev/null; then echo "$py"; return 0; fi
  done
  return 1
}
py="$(pick_python)" || fail "python_examples needs a python3 that can import numpy, zmq and google.protobuf
      (tried: ${FARM_PYTHON:+$FARM_PYTHON }python3 /usr/bin/python3).
      Install them: apt-get install -y python3-numpy python3-zmq python3-protobuf"
export PYTHONDONTWRITEBYTECODE=1  # no __pycache__ in the source tree
echo "python: $py"
"$py" "$root/tests/python/examples_test.py" "$root"
