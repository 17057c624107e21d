#!/usr/bin/env bash
# Builds the libFuzzer targets with Clang (ASan + UBSan) and runs each for a
# bounded number of executions; exits non-zero on any crash, sanitizer report
# or leak. The crashing input is left under the build folder's fuzz-artifacts/.
#
#   scripts/fuzz.sh [RUNS]          (default 200000 executions per target)
#
# Environment: FARM_FUZZ_BUILD_DIR (default build-fuzz), CXX (default clang++),
# FARM_FUZZ_FLAGS (extra libFuzzer flags, e.g. -max_total_time=600).
# Needs clang and libFuzzer's runtime (Debian: clang, libclang-rt-14-dev).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${FARM_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
RUNS="${1:-200000}"
CXX="${CXX:-clang++}"
TARGETS=(wire_decode_fuzzer)

die() { printf 'fuzz: error: %s\n' "$*" >&2; exit 1; }
[[ "$RUNS" =~ ^[0-9]+$ ]] || die "RUNS must be a number of executions, got '$RUNS'"
command -v "$CXX" >/dev/null || die "$CXX not found (apt-get install clang)"
probe="$(mktemp -d)"
trap 'rm -rf "$probe"' EXIT
printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' >"$probe/p.cpp"
"$CXX" -fsanitize=fuzzer,address,undefined "$probe/p.cpp" -o "$probe/p" 2>"$probe/err" ||
  die "$CXX cannot link libFuzzer (Debian: apt-get install libclang-rt-14-dev): $(head -c 300 "$probe/err")"

if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DFARM_FUZZ=ON -DFARM_SANITIZE=address,undefined -DFARM_BUILD_LEARNER=OFF -DFARM_BUILD_TESTS=OFF >/dev/null
fi
nice -n 10 cmake --build "$BUILD" -j "$(nproc)" --target "${TARGETS[@]}" wire_fuzz_seeds

# halt_on_error: the first UBSan report kills the run, so libFuzzer records it as a crash.
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:strict_string_checks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"

seeds="$BUILD/fuzz-seeds"
rm -rf "$seeds"
"$BUILD/tests/fuzz/wire_fuzz_seeds" "$seeds"
mkdir -p "$BUILD/fuzz-artifacts"
for target in "${TARGETS[@]}"; do
  corpus="$BUILD/fuzz-corpus/$target"  # grows across runs; new inputs go here, never into the seeds
  mkdir -p "$corpus"
  printf 'fuzz: %s, %s executions\n' "$target" "$RUNS" >&2
  start=$SECONDS
  # shellcheck disable=SC2086  # FARM_FUZZ_FLAGS is a list of flags
  if ! nice -n 10 "$BUILD/tests/fuzz/$target" -runs="$RUNS" -max_len=4096 -timeout=10 -print_final_stats=1 \
      -artifact_prefix="$BUILD/fuzz-artifacts/$target-" ${FARM_FUZZ_FLAGS:-} "$corpus" "$seeds"; then
    die "$target failed; reproduce with: $BUILD/tests/fuzz/$target $BUILD/fuzz-artifacts/$target-<crash file>"
  fi
  printf 'fuzz: %s: %s executions in %d s, no findings\n' "$target" "$RUNS" $((SECONDS - start)) >&2
done
