#!/usr/bin/env bash
# The Python worker as a package: `pip install --no-build-isolation` of a copy of worker/python into a fresh
# virtualenv (with the system's site packages: pyzmq, protobuf, numpy from Debian) gives `import farm_worker`
# and the `farm-worker-py` command, with the messages inside the package (no FARM_PYTHON_PATH, run from another
# directory); the packaged farm_pb2.py describes exactly what the build generates from proto/farm.proto today
# (compared as serialised descriptors, each in its own interpreter); and the installed command trains against a
# learner. Needs python3-venv, python3-pip and python3-setuptools (scripts/farm test installs them).
# Usage: python_package_test.sh BUILD_DIR
build_dir="$(cd "$1" && pwd)"
source "$(dirname "$0")/lib.sh"
py="$(farm_python)"
"$py" -m venv --help >/dev/null 2>&1 || fail "$py has no venv module (apt-get install -y python3-venv)"

# The committed messages against the build's, as descriptors.
# descriptor PATH MODULE: the serialised FileDescriptorProto of MODULE imported from PATH alone.
descriptor() { (cd "$tmp" && env -u FARM_PYTHON_PATH PYTHONPATH="$1" "$py" -c 'import sys, importlib
m = importlib.import_module(sys.argv[1]); sys.stdout.write(m.DESCRIPTOR.serialized_pb.hex())' "$2"); }
packaged="$(descriptor "$root/worker/python" farm_worker.farm_pb2)"
generated="$(descriptor "$build_dir/python" farm_pb2)"
[ -n "$packaged" ] && [ "$packaged" = "$generated" ] ||
  fail "worker/python/farm_worker/farm_pb2.py is stale: regenerate it (protoc --python_out=worker/python/farm_worker -Iproto proto/farm.proto) after changing proto/farm.proto"
echo "ok: the packaged farm_pb2.py matches proto/farm.proto"

# Install a copy (setuptools builds in the source folder: keep the checkout clean).
cp -r "$root/worker/python" "$tmp/src"
"$py" -m venv --system-site-packages "$tmp/venv"
"$tmp/venv/bin/python" -m pip install --no-build-isolation --no-index --quiet "$tmp/src" > "$tmp/pip.log" 2>&1 ||
  { cat "$tmp/pip.log"; fail "pip install --no-build-isolation worker/python failed"; }
[ -x "$tmp/venv/bin/farm-worker-py" ] || fail "pip install made no farm-worker-py command"
(cd / && env -u PYTHONPATH -u FARM_PYTHON_PATH "$tmp/venv/bin/python" - "$tmp/venv" <<'PY'
import sys
import farm_worker as fw
assert fw.__file__.startswith(sys.argv[1]), fw.__file__  # the installed copy, not the checkout
pb = fw.load_proto()
assert pb.__name__ == "farm_worker.farm_pb2", pb.__name__
assert callable(fw.PythonWorker) and fw.PROTOCOL_VERSION == 3
print("ok: import farm_worker from", fw.__file__)
PY
) || fail "the installed package does not import"
"$tmp/venv/bin/farm-worker-py" --help | grep -- "--env-module" > /dev/null || fail "farm-worker-py --help"

# The installed command against a learner, from another directory, no FARM_PYTHON_PATH.
"$build_dir/learner/farm-learner" --config "$root/configs/cartpole.yaml" --set run_dir="$tmp/run" \
  --set total_env_steps=2000 --set stop_at_target=false --endpoint-file "$tmp/endpoint" > "$tmp/learner.log" 2>&1 &
pids+=($!)
wait_until 60 test -s "$tmp/endpoint" || { cat "$tmp/learner.log"; fail "the learner did not listen"; }
(cd / && env -u PYTHONPATH -u FARM_PYTHON_PATH timeout 120 "$tmp/venv/bin/farm-worker-py" \
  --learner "$(cat "$tmp/endpoint")" --env-module "$root/tests/python/cue_env.py:make" --num-envs 4 \
  > "$tmp/worker.log" 2>&1) || { cat "$tmp/worker.log" "$tmp/learner.log"; fail "the installed farm-worker-py failed"; }
wait "${pids[0]}" || { cat "$tmp/learner.log"; fail "the learner failed"; }
python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); assert s["env_steps"] >= 2000 and s["protocol_errors"] == 0, s' \
  "$tmp/run/summary.json" || fail "the run did not reach 2000 env steps"
echo "ok: the installed farm-worker-py trained: $(tail -1 "$tmp/worker.log")"
