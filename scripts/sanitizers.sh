#!/usr/bin/env bash
# Builds the test suite with sanitizers and runs it; any sanitizer report
# fails the run (halt_on_error, non-zero exit code).
#
#   scripts/sanitizers.sh [asan|tsan|all] [--no-learner] [-- CTEST_ARGS...]
#
#   asan   ASan + UBSan (and LeakSanitizer) in build-asan: the whole CTest
#          suite, LibTorch tests and end-to-end runs included.
#   tsan   ThreadSanitizer in build-tsan: the whole CTest suite too. Debian's
#          LibTorch, OpenBLAS and libzmq are not instrumented; what TSan cannot
#          see inside them is suppressed in scripts/sanitizers/tsan.supp.
#   all    both (the default).
#   --no-learner   build without LibTorch (-DFARM_BUILD_LEARNER=OFF) and run the
#                  rest: a few minutes instead of most of an hour per build.
#                  .ci/run uses `asan --no-learner`.
#
# Environment: CXX (compiler; default clang++ where installed: it compiles the
# instrumented code about four times faster than g++), FARM_SANITIZE_JOBS
# (build jobs; default nproc). Suppressions for third-party libraries only
# live in scripts/sanitizers/, each with its reason.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SUPP="$ROOT/scripts/sanitizers"
JOBS="${FARM_SANITIZE_JOBS:-$(nproc)}"
what=all learner=ON ctest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    asan|tsan|all) what="$1" ;;
    --no-learner) learner=OFF ;;
    --) shift; ctest_args=("$@"); break ;;
    *) printf 'sanitizers: unknown argument %s\n' "$1" >&2; exit 2 ;;
  esac
  shift
done

log() { printf 'sanitizers: %s\n' "$*" >&2; }

if [ -z "${CXX:-}" ] && command -v clang++ >/dev/null; then CXX=clang++; fi

# build DIR SANITIZERS LEARNER: configures and builds everything with FARM_SANITIZE. The compiler is
# chosen when DIR is first configured; remove DIR to change it.
build() {
  local dir="$1" sanitize="$2" with_learner="$3" args=()
  if [ -n "${CXX:-}" ] && [ ! -f "$dir/CMakeCache.txt" ]; then args+=(-DCMAKE_CXX_COMPILER="$CXX"); fi
  # RelWithDebInfo: -O2 keeps the end-to-end runs' speed; -g gives reports with lines.
  cmake -S "$ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFARM_SANITIZE="$sanitize" \
    -DFARM_BUILD_LEARNER="$with_learner" "${args[@]}" >/dev/null
  nice -n 10 cmake --build "$dir" -j "$JOBS"
}

# run DIR LABEL: runs CTest with the sanitizer options already exported. Reports go to files in
# DIR/sanitizer-reports (log_path), because the end-to-end tests start learners and workers whose exit
# codes and stderr a test script may not pass on: any report file fails the run, whatever CTest says.
run() {
  local dir="$1" label="$2" start=$SECONDS rc=0 reports
  log "$label: ctest in $dir"
  (cd "$dir" && ctest --output-on-failure -j "$JOBS" "${ctest_args[@]}") || rc=$?
  log "$label: $((SECONDS - start)) s, ctest exit $rc"
  reports="$(find "$REPORTS" -type f 2>/dev/null | sort)"
  if [ -n "$reports" ]; then
    for f in $reports; do
      log "report $f:"
      cat "$f" >&2
    done
    log "$label: $(echo "$reports" | wc -l) sanitizer report(s) in $REPORTS"
    [ "$rc" -ne 0 ] || rc=1
  fi
  return "$rc"
}

status=0
if [ "$what" = asan ] || [ "$what" = all ]; then
  start=$SECONDS
  build "$ROOT/build-asan" address,undefined "$learner"
  log "asan: built in $((SECONDS - start)) s"
  (
    REPORTS="$ROOT/build-asan/sanitizer-reports"
    rm -rf "$REPORTS" && mkdir -p "$REPORTS"
    export ASAN_OPTIONS="halt_on_error=1:exitcode=66:detect_leaks=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1:suppressions=$SUPP/asan.supp:log_path=$REPORTS/asan"
    export LSAN_OPTIONS="suppressions=$SUPP/lsan.supp:print_suppressions=0"
    export UBSAN_OPTIONS="halt_on_error=1:exitcode=66:print_stacktrace=1:suppressions=$SUPP/ubsan.supp:log_path=$REPORTS/ubsan"
    run "$ROOT/build-asan" asan
  ) || status=1
fi
if [ "$what" = tsan ] || [ "$what" = all ]; then
  start=$SECONDS
  build "$ROOT/build-tsan" thread "$learner"
  log "tsan: built in $((SECONDS - start)) s"
  (
    REPORTS="$ROOT/build-tsan/sanitizer-reports"
    rm -rf "$REPORTS" && mkdir -p "$REPORTS"
    export TSAN_OPTIONS="halt_on_error=1:exitcode=66:second_deadlock_stack=1:suppressions=$SUPP/tsan.supp:log_path=$REPORTS/tsan"
    run "$ROOT/build-tsan" tsan
  ) || status=1
fi
exit "$status"
