#!/usr/bin/env bash
# GPU checks, in one run on a machine with an NVIDIA GPU and a CUDA build of PyTorch (python3 -c 'import
# torch.). Never part of CI. Steps (FARM_GPU_STEPS, default "scale ranks tests"), each skipped when the time budget
# runs short:
#   deps   unpack the Debian packages carried in $FARM_GPU_DEBS (default .gpudeps/, made on a Debian 12 machine
#          with `apt-get download`, see docs/OPERATIONS.md) into a private prefix; the runtime libraries in
#          fallback/ (libzmq's own dependencies) are used only where the system lacks that library (always);
#   build  against the device's LibTorch (CUDA) in build-gpu/: the programs and the CUDA-relevant tests only
#          (FARM_GPU_TARGETS), then the binaries go to $OUT/gpu-bin.tgz so that a second call can carry them
#          back (FARM_GPU_BIN=path/to/gpu-bin.tgz skips the build) (always, unless FARM_GPU_BIN);
#   scale  the multi-agent map workload: uav_coverage with the cnn encoder on the GPU, 16 and 64 workers, sync
#          and async (FARM_GPU_SCALE_RUNS), each with env and agent steps/s, the GPU's busy fraction (nvidia-smi
#          utilization.gpu every 100 ms), the learner's time split, workers lost; beside them the env-only limit
#          of the same cores (16 processes stepping the env, no learner);
#   ranks  learner ranks sharing the GPU: uav_coverage cnn, 16 workers, 1 rank and 2 (FARM_GPU_RANKS_RUNS), env
#          steps/s over every rank, GPU busy, the all-reduce's bytes, time and share per update, the backend;
#   tests  the unit tests built (CUDA cases included: CUDA graphs, the graphed PPO step, the store, the learner's
#          protocol on the GPU);
#   e2e, update, train, infer, matmul: the CartPole checks of issues 3 and 4 (per-precision end to end, PPO
#          update samples/s, 16-worker throughput, inference rows/s, matmul peak).
#   core   recurrent policies on the GPU (issue 27): CartPoleNoVel-v1 with a GRU in fp16 (100k steps) and
#          MemoryCue-v0 (delay 32) with a GRU in bf16, side by side, each with farm-eval; then uav_coverage with
#          the cnn encoder and a GRU, 16 workers async (bf16) and 64 workers sync, as the scale runs
#          (FARM_GPU_CORE_SCALE_RUNS, WORKERS:MODE:KEY=VALUE,... each);
#   encoders  issue 31's learning comparison: uav_coverage with the encoders of FARM_GPU_ENC_KINDS (default "cnn
#          impala scripted": the built-in cnn, `impala` [16, 32, 32], the cnn written in PyTorch,
#          examples/models/encoders.py; also `impala2`, impala_channels [16, 32], whose two pools leave the 7x7
#          view 2x2 where three leave 1x1; `impala1`, impala_channels [32], one pool: 4x4x32), the seeds of
#          FARM_GPU_ENC_SEEDS (default "1 2 3") all side by side, FARM_GPU_ENC_WORKERS workers (default 4) x 8
#          envs, FARM_GPU_ENC_STEPS env steps (default 500000), then farm-eval's coverage (100 episodes, one per
#          new cell, no penalty) of each, deterministic and with sampled actions (--sample: the policy as trained);
#   seeds  (--seeds-workload) the seeds' workload, issue 29's table: uav_coverage, cnn encoder, 16 workers x 32
#          envs (4 groups), async, batches of up to 8192 rows, before (the source in $FARM_GPU_BEFORE, a tarball
#          of an earlier commit, built beside this one) and after (this build) with each acting change on its own
#          (FARM_GPU_SEEDS_RUNS), then 64 workers; per run env steps/s (steady: between metrics rows after the
#          first 8 s), GPU busy, the inference thread's split with the forward's wait and device time, workers lost.
# Output under $OUT (default ./gpu-out): log.txt (everything), summary.txt (one line per figure),
# results.jsonl (benchmark JSON), detail.tgz (build, test and run logs, nvidia-smi samples), gpu-bin.tgz.
# Usage: scripts/gpu_check.sh [--seeds-workload] [BUDGET_SECONDS]
#   --seeds-workload: steps "seeds tests", builds in /tmp (outside the checkout), the programs and the CUDA tests
#   only; prepare with `git archive COMMIT | gzip > .gpubefore/before.tgz` for the before column.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT"
SEEDS_MODE=0
if [ "${1:-}" = --seeds-workload ]; then SEEDS_MODE=1; shift; fi
BUDGET="${1:-540}"
START=$(date +%s)
DEBS="${FARM_GPU_DEBS:-$ROOT/.gpudeps}"
PREFIX=/tmp/farm-deps
if [ "$SEEDS_MODE" = 1 ]; then
  BUILD="${FARM_GPU_BUILD_DIR:-/tmp/farm-build-gpu}"
  BEFORE_TGZ="${FARM_GPU_BEFORE:-$ROOT/.gpubefore/before.tgz}"
  : "${FARM_GPU_STEPS:=seeds tests}"
  : "${FARM_GPU_TARGETS:=farm-learner farm-worker farm-bench cuda_graph_test amp_test ppo_graph_test centralised_critic_test learner_protocol_test multi_discrete_test}"
else
  BUILD="${FARM_GPU_BUILD_DIR:-$ROOT/build-gpu}"
  BEFORE_TGZ=""
fi
BEFORE_SRC=/tmp/farm-before-src
BEFORE_BUILD=/tmp/farm-build-before
DEV="${FARM_GPU_DEVICE:-cuda}"  # cpu: a dry run of the script's logic on a machine without a GPU
LOG="$OUT/log.txt"
D="$OUT/detail"
mkdir -p "$D"
exec > >(tee -a "$LOG") 2>&1
trap 'tar czf "$OUT/detail.tgz" -C "$OUT" detail 2>/dev/null && rm -rf "$D"' EXIT

left() { echo $((BUDGET - ($(date +%s) - START))); }
say() { echo "== [$(($(date +%s) - START)) s] $*"; }
fig() { echo "$*" | tee -a "$OUT/summary.txt"; }
STEPS=" ${FARM_GPU_STEPS:-scale ranks tests} "
# enough SECONDS STEP: whether STEP is selected and SECONDS of budget remain (says SKIP otherwise).
enough() {
  [[ "$STEPS" == *" $2 "* ]] || return 1
  if [ "$(left)" -lt "$1" ]; then fig "SKIP $2 (time: $(left) s left, needs $1)"; return 1; fi
}

say "machine"
nvidia-smi -L || true
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv || true
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cxx11abi", torch._C._GLIBCXX_USE_CXX11_ABI, "gpus", torch.cuda.device_count())'
g++ --version | sed -n 1p; cmake --version | sed -n 1p; nproc; command -v nvcc && nvcc --version | tail -1
sed -n 1,2p /etc/os-release 2>/dev/null

say "dependencies from $DEBS"
mkdir -p "$PREFIX"
for f in "$DEBS"/*.deb; do dpkg -x "$f" "$PREFIX" || fig "FAIL unpack $f"; done
mkdir -p "$PREFIX/fallback"
for f in "$DEBS"/fallback/*.deb; do dpkg -x "$f" "$PREFIX/fallback" || fig "FAIL unpack $f"; done
libdir="$PREFIX/usr/lib/x86_64-linux-gnu"
for lib in "$PREFIX"/fallback/usr/lib/x86_64-linux-gnu/*.so.* "$PREFIX"/fallback/lib/x86_64-linux-gnu/*.so.*; do
  # The soname links (libffi.so.8 -> libffi.so.8.1.2): what the dynamic loader looks for.
  [ -L "$lib" ] || continue
  name="$(basename "$lib")"
  # Only a library the system lacks: a Debian 12 copy must not shadow a newer system one.
  if ! ldconfig -p | grep "^[[:space:]]*$name " > /dev/null && [ ! -e "$libdir/$name" ]; then
    ln -s "$(readlink -f "$lib")" "$libdir/$name"; echo "fallback $name"
  fi
done
export PATH="$PREFIX/usr/bin:$PATH"
export LD_LIBRARY_PATH="$PREFIX/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
protoc --version || fig "FAIL protoc"
TORCH_PREFIX="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')"
TORCH_LIB="$(python3 -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
export LD_LIBRARY_PATH="$TORCH_LIB:$LD_LIBRARY_PATH"
ls "$(dirname "$TORCH_LIB")/include" | tr '\n' ' '; echo
# PyTorch's wheels export a std::filesystem::remove_all of their own that crashes when called from this build (the
# likely cause of scripted_encoder_test's SIGSEGV with torch 2.11; tests/remove_all_lint_test.sh keeps the calls out).
fig "libtorch_cpu.so's std::filesystem::remove_all definitions: $(nm -D --defined-only "$TORCH_LIB/libtorch_cpu.so" \
  2>/dev/null | grep -c 'filesystem.*remove_all')"

# The programs and the tests that exercise CUDA; everything else is covered by CI on the CPU.
TARGETS="${FARM_GPU_TARGETS:-farm-learner farm-worker farm-bench farm-eval cuda_graph_test ppo_graph_test
  trajectory_store_test learner_protocol_test centralised_critic_test multi_discrete_test amp_test recurrent_test
  scripted_encoder_test encoder_test export_test ranks_test}"
before_pid=""
if [ -n "${FARM_GPU_BIN:-}" ]; then
  say "build skipped: binaries from $FARM_GPU_BIN"
  mkdir -p "$BUILD" && tar xzf "$FARM_GPU_BIN" -C "$BUILD" || { fig "FAIL unpack $FARM_GPU_BIN"; exit 1; }
else
say "configure"
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
cuda_root=/usr/local/cuda; [ -d "$cuda_root" ] || cuda_root="$(dirname "$(dirname "$(command -v nvcc)")")"
cmake -S "$ROOT" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX;$PREFIX/usr" -DCUDAToolkit_ROOT="$cuda_root" \
  -DCMAKE_CXX_FLAGS="-idirafter $PREFIX/usr/include" \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DTORCH_CUDA_ARCH_LIST=9.0 \
  -DCMAKE_EXE_LINKER_FLAGS="-Wl,--no-as-needed" >"$D/configure.txt" 2>&1
rc=$?
grep -m 30 -E "FARM_WITH_CUDA|CUDA|Torch|Error|error" "$D/configure.txt"
[ $rc -eq 0 ] || { fig "FAIL configure (rc $rc)"; tail -40 "$D/configure.txt"; exit 1; }

# The before column's source, built beside this one (learner and worker only), in the background.
if [ -n "$BEFORE_TGZ" ] && [ -f "$BEFORE_TGZ" ]; then
  say "before: building $BEFORE_TGZ in $BEFORE_BUILD (background)"
  rm -rf "$BEFORE_SRC" && mkdir -p "$BEFORE_SRC" && tar xzf "$BEFORE_TGZ" -C "$BEFORE_SRC"
  (cmake -S "$BEFORE_SRC" -B "$BEFORE_BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
     -DCMAKE_PREFIX_PATH="$TORCH_PREFIX;$PREFIX/usr" -DCUDAToolkit_ROOT="$cuda_root" \
     -DCMAKE_CUDA_ARCHITECTURES=90 -DTORCH_CUDA_ARCH_LIST=9.0 -DFARM_BUILD_TESTS=OFF \
     -DCMAKE_EXE_LINKER_FLAGS="-Wl,--no-as-needed" &&
   cmake --build "$BEFORE_BUILD" -j "$(nproc)" --target farm-learner farm-worker) >"$D/build_before.txt" 2>&1 &
  before_pid=$!
fi

say "build: $(echo $TARGETS | wc -w) targets"
# shellcheck disable=SC2086
cmake --build "$BUILD" -j "$(nproc)" --target $TARGETS >"$D/build.txt" 2>&1
rc=$?
grep -m 40 -E "error|Error" "$D/build.txt"
fig "build rc $rc in $(($(date +%s) - START)) s"
# The binaries (not the objects), for a second call that skips the build (FARM_GPU_BIN).
(cd "$BUILD" && tar czf "$OUT/gpu-bin.tgz" learner/farm-learner worker/farm-worker bench/farm-bench tools/farm-eval \
  $(for t in $TARGETS; do [ -x "tests/$t" ] && echo "tests/$t"; done) python 2>/dev/null)
ls -la "$OUT/gpu-bin.tgz"
fi
B="$BUILD/bench/farm-bench"
TESTS=()
for t in "$BUILD"/tests/*_test; do [ -x "$t" ] && TESTS+=("$(basename "$t")"); done
# FARM_GPU_TESTS: only these test programs (names separated by spaces), for a short rerun.
[ -n "${FARM_GPU_TESTS:-}" ] && read -r -a TESTS <<<"$FARM_GPU_TESTS"

if [ -n "$before_pid" ]; then
  wait "$before_pid"; rc=$?
  fig "build before rc $rc in $(($(date +%s) - START)) s"
  [ $rc -eq 0 ] || grep -m 20 -E "error" "$D/build_before.txt"
fi

# The multi-agent map workload on the GPU: uav_coverage, cnn encoder, 16 and 64 workers, sync and async.
# RUN_BUILD / RUN_ROOT: the binaries and the launcher of the run (default this checkout's, built in $BUILD).
scale_run() {  # NAME WORKERS SECONDS KEY=VALUE...
  local name="$1" workers="$2" secs="$3"; shift 3
  local dir="/tmp/farm-gpu-$name" sets=() smi="$D/nvsmi_$name.csv" learners="${RUN_LEARNERS:-1}"
  for kv in "$@"; do sets+=(--set "$kv"); done
  rm -rf "$dir"
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits -lms 100 \
    >"$smi" 2>/dev/null &
  local smi_pid=$! t0 t1 rc=0
  t0=$(date +%s.%N)
  FARM_SKIP_BUILD=1 FARM_BUILD_DIR="${RUN_BUILD:-$BUILD}" timeout $((secs + 90)) "${RUN_ROOT:-$ROOT}/scripts/farm" run \
    configs/uav_coverage.yaml \
    --workers "$workers" --learners "$learners" --set run_dir="$dir" --set learner.device=$DEV --set ppo.encoder=cnn \
    --set total_env_steps=1000000000 --set max_wall_seconds="$secs" --set learner.progress_interval_s=5 \
    "${sets[@]}" >"$D/scale_$name.txt" 2>&1 || rc=$?
  t1=$(date +%s.%N)
  kill "$smi_pid" 2>/dev/null
  python3 - "$dir" "$smi" "$t0" "$t1" "$name" "$rc" "$OUT/results.jsonl" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys, datetime
run, smi, t0, t1, name, rc = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5], sys.argv[6]
try:
    s = json.load(open(run + "/summary.json"))
except Exception as e:
    print(f"scale {name}: rc {rc}, no summary ({e})"); sys.exit(0)
util = []
for line in open(smi):
    parts = [p.strip() for p in line.split(",")]
    try:
        ts = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
    except (ValueError, IndexError):
        continue
    if t0 + 5 <= ts <= t1 - 1:  # the middle of the run: CUDA start-up and the workers joining left out
        util.append(float(parts[1]))
busy = sum(util) / len(util) if util else float("nan")
keys = ["env_steps", "sps", "agent_sps", "updates", "update_path", "batch_rows_avg", "workers_joined",
        "workers_lost", "rejoins", "connections_closed", "last_join_seconds", "max_rss_mb", "memory_estimate_mb", "store_bytes", "device", "precision"]
t = s["time_seconds"]
split = " ".join(f"{k}={100 * t[k] / t['total']:.0f}%" for k in ("wait_for_data", "held_for_update", "admit", "gather",
                                                                    "forward", "serve", "handoff", "report", "other"))
# Steady env steps/s: between the first metrics row at least 8 s into the run and the last one (start-up, the
# workers joining and the warm-up left out).
rows = []
try:
    for line in open(run + "/metrics.jsonl"):
        r = json.loads(line)
        if r.get("wall_seconds") is not None and r.get("env_steps") is not None:
            rows.append((r["wall_seconds"], r["env_steps"]))
except OSError:
    pass
late = [r for r in rows if r[0] >= 8]
steady = (late[-1][1] - late[0][1]) / (late[-1][0] - late[0][0]) if len(late) >= 2 and late[-1][0] > late[0][0] else None
fwd = t.get("forward", 0)
detail = ""
if "forward_wait" in t and fwd > 0:
    detail = (f"; forward: waiting {100 * t['forward_wait'] / fwd:.0f}% of it, device time "
              f"{100 * t['forward_device'] / t['total']:.0f}% of the wall")
steady_txt = f"{steady:,.0f}" if steady else "n/a"
if s.get("world_size", 1) > 1:  # learner ranks: the run's env steps/s over every rank, and the all-reduce per update
    per = s.get("ranks", [])
    detail += (f"; {s['world_size']} ranks ({s.get('dist_backend')}): {s['env_steps_all_ranks'] / s['wall_seconds']:,.0f} "
               f"env steps/s over all, all-reduce per update " +
               ", ".join(f"{r['allreduce_bytes_per_update'] / 1e6:.1f} MB {1e3 * r['allreduce_seconds_per_update']:.0f} ms "
                         f"({100 * r['allreduce_share_of_update']:.0f}%)" for r in per))
print(f"scale {name}: rc {rc} gpu_busy_mean {busy:.1f}% ({len(util)} samples); steady env sps {steady_txt}; "
      f"{json.dumps({k: s.get(k) for k in keys})}; split {split}{detail}; trainer busy {100 * t['update'] / t['total']:.0f}%")
row = {"case": "seeds", "name": name, "rc": int(rc), "gpu_busy": busy, "steady_sps": steady, "sps": s.get("sps"),
       "agent_sps": s.get("agent_sps"), "workers_joined": s.get("workers_joined"), "workers_lost": s.get("workers_lost"),
       "batch_rows_avg": s.get("batch_rows_avg"), "updates": s.get("updates"), "max_rss_mb": s.get("max_rss_mb"),
       "acting_precision": s.get("acting_precision"), "precision": s.get("precision"),
       "split": {k: (t[k] / t["total"] if t["total"] else None) for k in t if k != "total"}}
with open(sys.argv[7], "a") as f:
    f.write(json.dumps(row) + "\n")
PY
}
if enough 60 scale; then
  say "env-only limit: 16 processes stepping uav_coverage (8 envs each), no learner"
  envpids=()
  for i in $(seq 16); do
    "$BUILD/bench/farm-bench" --seconds 3 env --env uav_coverage --num-envs 8 >"$D/envonly_$i.txt" 2>&1 &
    envpids+=($!)
  done
  wait "${envpids[@]}"  # not a bare wait: that would wait for the log's tee too
  python3 - "$D" <<'PY' | tee -a "$OUT/summary.txt"
import glob, json, sys
r = [json.loads(open(f).read().strip().splitlines()[-1]) for f in glob.glob(sys.argv[1] + "/envonly_*.txt")]
print(f"env-only uav_coverage, {len(r)} processes x 8 envs: {sum(x['steps_per_second'] for x in r):,.0f} env steps/s, "
      f"{sum(x['agent_steps_per_second'] for x in r):,.0f} agent steps/s")
PY
  # WORKERS:MODE[:KEY=VALUE,KEY=VALUE...] per run: more settings after a second colon.
  for spec in ${FARM_GPU_SCALE_RUNS:-16:sync 16:async 64:sync 64:async}; do
    IFS=: read -r w mode extra <<<"$spec"
    extras=()
    [ -n "$extra" ] && IFS=, read -r -a extras <<<"$extra"
    enough 75 scale || break
    name="w${w}_$mode"
    [ -n "$extra" ] && name="${name}_$(echo "$extra" | tr -c 'A-Za-z0-9=\n' '_' | sed 's/env_num_//g; s/batcher_//g; s/learner_//g')"
    say "uav_coverage cnn, $w workers, $mode ${extras[*]}"
    scale_run "$name" "$w" "${FARM_GPU_SCALE_SECONDS:-30}" mode="$mode" "${extras[@]}"
  done
fi

# Learner ranks sharing the one GPU: uav_coverage cnn at 16 workers, 1 rank against 2 (each rank on cuda:0), sync;
# FARM_GPU_RANKS_RUNS: LEARNERS:WORKERS:MODE per run.
if enough 90 ranks; then
  for spec in ${FARM_GPU_RANKS_RUNS:-1:16:sync 2:16:sync}; do
    IFS=: read -r k w mode <<<"$spec"
    enough 75 ranks || break
    say "uav_coverage cnn, $w workers, $mode, $k learner rank(s)"
    RUN_LEARNERS="$k" scale_run "ranks${k}_w${w}_$mode" "$w" "${FARM_GPU_SCALE_SECONDS:-30}" mode="$mode"
  done
fi

# The seeds' workload (issue 29): before and after on this machine, each acting change on its own.
# FARM_GPU_SEEDS_RUNS: COLUMN:WORKERS:ENVS:GROUPS[:KEY=VALUE,...] per run, COLUMN before (the $FARM_GPU_BEFORE build)
# or after (this one); async, cnn, batches of up to 8192 rows in all of them.
SEEDS_DEFAULT="before:16:32:4 after:16:32:4 after:16:32:4:learner.acting_high_priority=false
  after:16:32:4:learner.acting_precision=bf16 after:16:32:4:learner.cuda_graphs=true
  after:16:32:4:learner.cuda_graphs=true,learner.acting_precision=bf16
  after:16:32:4:learner.cuda_graphs=true,learner.precision=bf16
  after:64:8:2:learner.cuda_graphs=true,learner.acting_precision=bf16"
if [[ "$STEPS" == *" seeds "* ]]; then
  secs="${FARM_GPU_SCALE_SECONDS:-22}"
  # The graphed acting path first (its per-env states are new): a failure here explains a failed graphs row.
  if [ -x "$BUILD/tests/cuda_graph_test" ]; then
    timeout 90 "$BUILD/tests/cuda_graph_test" >"$D/test_cuda_graph_first.txt" 2>&1
    fig "test cuda_graph_test (before the runs): rc $? $(grep -E 'test cases|All tests passed' "$D/test_cuda_graph_first.txt" | tail -1)"
    grep -B2 -A12 -E "FAILED|failed" "$D/test_cuda_graph_first.txt" | sed -n 1,40p
  fi
  i=0
  for spec in ${FARM_GPU_SEEDS_RUNS:-$SEEDS_DEFAULT}; do
    IFS=: read -r column w envs groups extra <<<"$spec"
    enough $((secs + 35)) seeds || break
    extras=()
    [ -n "$extra" ] && IFS=, read -r -a extras <<<"$extra"
    i=$((i + 1))
    name="s${i}_${column}_w${w}x${envs}"
    [ -n "$extra" ] && name="${name}_$(echo "$extra" | sed 's/learner\.//g; s/cuda_graphs=true/graphs/; s/acting_precision=/act-/; s/precision=/train-/' | tr -c 'A-Za-z0-9\n-' '_')"
    if [ "$column" = before ]; then
      [ -x "$BEFORE_BUILD/learner/farm-learner" ] || { fig "SKIP $name: no before build"; continue; }
      say "seeds' workload $name (before: $BEFORE_TGZ)"
      RUN_BUILD="$BEFORE_BUILD" RUN_ROOT="$BEFORE_SRC" scale_run "$name" "$w" "$secs" mode=async env.num_envs="$envs" \
        env.num_groups="$groups" batcher.max_rows=8192 "${extras[@]}"
    else
      say "seeds' workload $name"
      scale_run "$name" "$w" "$secs" mode=async env.num_envs="$envs" env.num_groups="$groups" batcher.max_rows=8192 \
        "${extras[@]}"
    fi
  done
  python3 - "$OUT/results.jsonl" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"case": "seeds"' in l]
if rows:
    print("| run | env steps/s (steady) | env steps/s (whole run) | GPU busy | inference thread: held / admit / gather / "
          "forward (waiting) / serve | forward's device time | trainer busy | workers joined / lost |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        t = r["split"]
        pct = lambda k: f"{100 * t[k]:.0f}" if t.get(k) is not None else "-"
        steady = f"{r['steady_sps']:,.0f}" if r.get("steady_sps") else "n/a"
        print(f"| {r['name']} | {steady} | {r['sps']:,.0f} | {r['gpu_busy']:.1f}% | {pct('held_for_update')} / "
              f"{pct('admit')} / {pct('gather')} / {pct('forward')} ({pct('forward_wait')}) / {pct('serve')} % | "
              f"{pct('forward_device')}% | {pct('update')}% | {r['workers_joined']} / {r['workers_lost']} |")
PY
fi

# Unit tests, one process per test binary, side by side (CTest's one process per case would pay CUDA's
# start-up each time). The process-level tests run on the CPU machine; the learner tests here act on the GPU
# (learner.device auto).
if enough 60 tests; then
  say "unit tests"
  declare -A tpid
  for t in "${TESTS[@]}"; do
    [ -x "$BUILD/tests/$t" ] || { fig "FAIL $t not built"; continue; }
    timeout "${FARM_GPU_TEST_TIMEOUT:-120}" "$BUILD/tests/$t" >"$D/test_$t.txt" 2>&1 &
    tpid[$t]=$!
  done
  for t in "${!tpid[@]}"; do
    wait "${tpid[$t]}"; rc=$?
    fig "test $t: rc $rc $(grep -E 'test cases|All tests passed' "$D/test_$t.txt" | tail -1)"
    [ $rc -eq 0 ] || grep -B2 -A12 -E "FAILED|failed" "$D/test_$t.txt" | sed -n 1,60p
  done
  grep -h "skipped" "$D"/test_*.txt | sort | uniq -c
fi

# Learning runs side by side on the one GPU, each evaluated by farm-eval (on the CPU, from its latest checkpoint).
LEARN_PIDS=()
LEARN_NAMES=()
learn_start() {  # NAME CONFIG WORKERS KEY=VALUE...: starts a run in the background
  local name="$1" config="$2" workers="$3"; shift 3
  local dir="/tmp/farm-gpu-learn-$name" sets=()
  for kv in "$@"; do sets+=(--set "$kv"); done
  rm -rf "$dir"
  FARM_SKIP_BUILD=1 FARM_BUILD_DIR="$BUILD" timeout "${LEARN_TIMEOUT:-400}" scripts/farm run "$config" \
    --workers "$workers" --set run_dir="$dir" --set learner.device=$DEV --set learner.progress_interval_s=10 \
    "${sets[@]}" >"$D/learn_$name.txt" 2>&1 &
  LEARN_PIDS+=($!)
  LEARN_NAMES+=("$name")
}
learn_finish() {  # FARM_EVAL_ARGS...: waits for the runs started, evaluates each side by side, a line per run
  local i name dir
  for i in "${!LEARN_PIDS[@]}"; do
    wait "${LEARN_PIDS[$i]}"
    rc=$?
    mkdir -p "/tmp/farm-gpu-learn-${LEARN_NAMES[$i]}"
    echo "$rc" >"/tmp/farm-gpu-learn-${LEARN_NAMES[$i]}/rc"
  done
  local eval_pids=()
  for name in "${LEARN_NAMES[@]}"; do
    dir="/tmp/farm-gpu-learn-$name"
    timeout 120 "$BUILD/tools/farm-eval" "$dir" "$@" >"$dir/eval.json" 2>"$D/eval_$name.txt" &
    eval_pids+=($!)
    if [ -n "${LEARN_SAMPLE:-}" ]; then  # also the policy as trained: actions sampled, not its mode
      timeout 120 "$BUILD/tools/farm-eval" "$dir" --sample "$@" >"$dir/eval_sample.json" 2>"$D/eval_sample_$name.txt" &
      eval_pids+=($!)
    fi
  done
  wait "${eval_pids[@]}"
  python3 - "$OUT/results.jsonl" "${LEARN_NAMES[@]}" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
for name in sys.argv[2:]:
    d = f"/tmp/farm-gpu-learn-{name}"
    try:
        rc = open(d + "/rc").read().strip()
    except OSError:
        rc = "?"
    try:
        s = json.load(open(d + "/summary.json"))
    except Exception as e:
        print(f"learn {name}: rc {rc}, no summary ({e})"); continue
    try:
        ev = json.loads(open(d + "/eval.json").read().strip().splitlines()[-1])
    except Exception as e:
        ev = {"error": str(e)}
    try:
        sampled = json.loads(open(d + "/eval_sample.json").read().strip().splitlines()[-1])
    except Exception:
        sampled = {}  # not asked for (LEARN_SAMPLE), or failed: its log is in detail.tgz
    keys = ["env_steps", "wall_seconds", "sps", "updates", "mean_return_100", "solved_at_steps", "solved_at_seconds",
            "workers_joined", "workers_lost", "max_rss_mb", "memory_estimate_mb", "precision", "acting_precision",
            "device", "update_path"]
    row = {"case": "learn", "name": name, "rc": rc, **{k: s.get(k) for k in keys},
           "eval_mean": ev.get("mean_return"), "eval_std": ev.get("std_return"), "eval_episodes": ev.get("episodes")}
    if sampled:
        row.update(eval_sampled_mean=sampled.get("mean_return"), eval_sampled_std=sampled.get("std_return"))
    print(f"learn {name}: rc {rc}; " + json.dumps({k: v for k, v in row.items() if k not in ("case", "name", "rc")}))
    with open(sys.argv[1], "a") as f:
        f.write(json.dumps(row) + "\n")
PY
  LEARN_PIDS=()
  LEARN_NAMES=()
}

# Recurrent policies on the GPU (issue 27): learning in fp16 and bf16, then the map workload with a GRU at scale.
if enough 200 core; then
  say "recurrent policies on the GPU: CartPoleNoVel (GRU, fp16) and MemoryCue delay 32 (GRU, bf16), side by side"
  LEARN_TIMEOUT=150
  learn_start novel_gru_fp16 configs/cartpole_novel.yaml 2 seed=1 learner.precision=fp16
  learn_start cue32_gru_bf16 configs/memory_cue.yaml 2 seed=1 learner.precision=bf16 max_wall_seconds=110
  learn_finish --episodes 100
  unset LEARN_TIMEOUT
  for spec in ${FARM_GPU_CORE_SCALE_RUNS:-16:async:ppo.core=gru,learner.precision=bf16 64:sync:ppo.core=gru}; do
    IFS=: read -r w mode extra <<<"$spec"
    IFS=, read -r -a extras <<<"$extra"
    enough 75 core || break
    say "uav_coverage cnn with a GRU, $w workers, $mode ${extras[*]}"
    scale_run "gru_w${w}_$mode" "$w" "${FARM_GPU_SCALE_SECONDS:-30}" mode="$mode" "${extras[@]}"
  done
fi

# Issue 31: uav_coverage trained through the built-in cnn, impala and the cnn written in PyTorch, same env steps.
if enough 200 encoders; then
  enc="/tmp/farm-gpu-encoders"
  mkdir -p "$enc"
  python3 examples/models/encoders.py cnn --shape 5 7 7 --features 128 --out "$enc/uav_actor.pt" &&
    python3 examples/models/encoders.py cnn --shape 3 32 32 --features 128 --out "$enc/uav_critic.pt" ||
    fig "FAIL examples/models/encoders.py"
  steps="${FARM_GPU_ENC_STEPS:-500000}" ew="${FARM_GPU_ENC_WORKERS:-4}"
  say "uav_coverage encoders: ${FARM_GPU_ENC_KINDS:-cnn impala scripted}; seeds ${FARM_GPU_ENC_SEEDS:-1 2 3}; $ew workers; $steps env steps"
  LEARN_TIMEOUT=$(($(left) - 60))
  common=(total_env_steps="$steps" max_wall_seconds=$((LEARN_TIMEOUT - 40)) learner.checkpoint_every=50)
  for seed in ${FARM_GPU_ENC_SEEDS:-1 2 3}; do
    for kind in ${FARM_GPU_ENC_KINDS:-cnn impala scripted}; do
      case "$kind" in
        cnn) extra=(ppo.encoder=cnn) ;;
        impala) extra=(ppo.encoder=impala) ;;
        impala2) extra=(ppo.encoder=impala "ppo.impala_channels=[16, 32]") ;;
        impala1) extra=(ppo.encoder=impala "ppo.impala_channels=[32]") ;;
        scripted) extra=(ppo.actor_encoder_script="$enc/uav_actor.pt" ppo.critic_encoder_script="$enc/uav_critic.pt"
                         "ppo.hidden_sizes=[128]") ;;
        *) fig "FAIL FARM_GPU_ENC_KINDS: unknown encoder '$kind' (cnn, impala, impala2, impala1, scripted)"; continue ;;
      esac
      learn_start "enc_${kind}_s$seed" configs/uav_coverage.yaml "$ew" seed="$seed" "${extra[@]}" "${common[@]}"
    done
  done
  LEARN_SAMPLE=1 learn_finish --episodes 100 --set env.options.cell_reward=1 --set env.options.collision_penalty=0
  unset LEARN_TIMEOUT
fi

# PPO update cost: graphed (ppo.graph_update auto, the default: CUDA graphs from the second update) against the
# LibTorch path launched kernel by kernel (off), per precision, for the default 2x64 MLP and a 3x512 one.
if enough 60 update; then
  say "PPO update samples/s"
  for h in "64,64" "512,512,512"; do
    for p in fp32 bf16; do
      for g in auto off; do
        line="$("$B" --seconds 3 update --config configs/cartpole_fast.yaml --envs 4096 \
          --set learner.device=$DEV --set learner.precision=$p --set "ppo.hidden_sizes=[$h]" \
          --set ppo.rollout_length=16 --set ppo.graph_update=$g 2>&1 | tail -1)"
        echo "$line" >>"$OUT/results.jsonl"
        fig "update hidden=[$h] $p graph_update=$g: $line"
      done
    done
  done
fi

# CartPole solved in each precision (sync, 2 workers, seeds as in CI), side by side on the GPU.
if enough 150 e2e; then
  say "CartPole end to end per precision"
  declare -A e2e_pid
  for v in fp32 fp16 bf16 graphs; do
    extra=(learner.precision="$v")
    [ "$v" = graphs ] && extra=(learner.precision=fp32 learner.cuda_graphs=true)
    timeout $(($(left) - 60)) tests/e2e_train.sh "$BUILD" sync 7 learner.device=$DEV "${extra[@]}" \
      >"$D/e2e_$v.txt" 2>&1 &
    e2e_pid[$v]=$!
  done
  for v in fp32 fp16 bf16 graphs; do
    wait "${e2e_pid[$v]}"; rc=$?
    fig "e2e cartpole $v: rc $rc $(grep -E '^ok:' "$D/e2e_$v.txt")"
    [ $rc -eq 0 ] || tail -15 "$D/e2e_$v.txt"
  done
fi

# Training throughput with 16 workers and the GPU's busy fraction.
train_run() {  # NAME SECONDS KEY=VALUE...
  local name="$1" secs="$2"; shift 2
  local dir="/tmp/farm-gpu-$name" sets=()
  for kv in "$@"; do sets+=(--set "$kv"); done
  rm -rf "$dir"
  local t0; t0=$(date +%s.%N)
  FARM_SKIP_BUILD=1 FARM_BUILD_DIR="$BUILD" timeout $((secs + 60)) scripts/farm run configs/cartpole_fast.yaml \
    --workers 16 --set run_dir="$dir" --set learner.device=$DEV --set learner.progress_interval_s=5 "${sets[@]}" \
    >"$D/train_$name.txt" 2>&1
  local rc=$? t1; t1=$(date +%s.%N)
  python3 - "$dir" "$D/nvsmi.csv" "$t0" "$t1" "$name" "$rc" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys, datetime
run, smi, t0, t1, name, rc = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5], sys.argv[6]
try:
    s = json.load(open(run + "/summary.json"))
except Exception as e:
    print(f"train {name}: rc {rc}, no summary ({e})"); sys.exit(0)
util = []
for line in open(smi):
    parts = [p.strip() for p in line.split(",")]
    try:
        ts = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
    except ValueError:
        continue
    # Skip the start-up (CUDA init, workers joining): the middle of the run, from 5 s after start.
    if t0 + 5 <= ts <= t1 - 1:
        util.append(float(parts[1]))
busy = sum(util) / len(util) if util else float("nan")
keys = ["env_steps", "wall_seconds", "sps", "mean_return_100", "solved_at_steps", "solved_at_seconds", "updates",
        "update_path", "graphed_updates",
        "batch_rows_avg", "device", "precision"]
short = {k: s.get(k) for k in keys if k in s}
times = {k: s[k] for k in s if k.startswith("time_")}
print(f"train {name}: rc {rc} gpu_busy_mean {busy:.1f}% over {len(util)} samples; {json.dumps(short)}; {json.dumps(times)}")
PY
}
if enough 100 train; then
  say "training throughput, 16 workers"
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits -lms 100 \
    >"$D/nvsmi.csv" 2>/dev/null &
  smi_pid=$!
  # FARM_GPU_TRAIN_RUNS: which of the runs (default the first three; fast16_graphs and fast16_graphs_big on request).
  runs=" ${FARM_GPU_TRAIN_RUNS:-fast16 fast16_eager fast16_mb1} "
  [[ "$runs" == *" fast16 "* ]] &&
    train_run fast16 30 env.num_envs=1024 ppo.rollout_length=16 batcher.max_rows=16384 stop_at_target=false \
      total_env_steps=1000000000 max_wall_seconds=30
  if [[ "$runs" == *" fast16_eager "* ]] && enough 90 train; then  # the update launched kernel by kernel
    train_run fast16_eager 30 env.num_envs=1024 ppo.rollout_length=16 batcher.max_rows=16384 \
      stop_at_target=false total_env_steps=1000000000 max_wall_seconds=30 ppo.graph_update=off
  fi
  if [[ "$runs" == *" fast16_mb1 "* ]] && enough 90 train; then
    train_run fast16_mb1 30 env.num_envs=1024 ppo.rollout_length=16 batcher.max_rows=16384 \
      stop_at_target=false total_env_steps=1000000000 max_wall_seconds=30 ppo.num_minibatches=1
  fi
  # Not in the default set (issue 3's next step): acting replayed from CUDA graphs beside the graphed update,
  # then the same with twice the envs per worker and forward batches of up to 32768 rows.
  if [[ "$runs" == *" fast16_graphs "* ]] && enough 90 train; then
    train_run fast16_graphs 30 env.num_envs=1024 ppo.rollout_length=16 batcher.max_rows=16384 \
      stop_at_target=false total_env_steps=1000000000 max_wall_seconds=30 learner.cuda_graphs=true
  fi
  if [[ "$runs" == *" fast16_graphs_big "* ]] && enough 90 train; then
    train_run fast16_graphs_big 30 env.num_envs=2048 ppo.rollout_length=16 batcher.max_rows=32768 \
      stop_at_target=false total_env_steps=1000000000 max_wall_seconds=30 learner.cuda_graphs=true
  fi
  kill "$smi_pid" 2>/dev/null
fi

if enough 40 infer; then
  say "inference rows/s"
  for bs in 1024 16384; do
    for p in fp32 bf16; do
      for g in "" --cuda-graphs; do
        line="$("$B" --seconds 2 forward --batch $bs --device $DEV --precision $p $g 2>&1 | grep "^{" | tail -1)"
        echo "$line" >>"$OUT/results.jsonl"; fig "forward b=$bs $p ${g:-eager}: $line"
      done
    done
  done
  for g in false true; do
    line="$("$B" --seconds 3 serve --batch 1024 --clients 4 --set learner.device=$DEV \
      --set learner.cuda_graphs=$g 2>&1 | grep "^{" | tail -1)"
    echo "$line" >>"$OUT/results.jsonl"; fig "serve b=1024 graphs=$g: $line"
  done
fi

if enough 15 matmul; then
  for d in fp32 bf16; do
    line="$("$B" --seconds 2 matmul --device $DEV --dtype $d --n 8192 2>&1 | tail -1)"
    echo "$line" >>"$OUT/results.jsonl"; fig "matmul $d: $line"
  done
fi
say "done"
echo "---- summary"; cat "$OUT/summary.txt"
