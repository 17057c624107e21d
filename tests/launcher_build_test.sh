#!/usr/bin/env bash
# What each launcher command builds (issue 32, a new user's first hour): `scripts/farm train` configures once, with
# the tests (so that `scripts/farm test` reuses the directory), shows cmake's configure lines, and builds only
# farm-learner and farm-worker; `build` the programs; `test` everything; ccache is used when installed. cmake,
# ctest, ccache and dpkg-query are stand-ins on PATH that record their arguments; the stand-in build makes a
# learner that writes its endpoint and a worker that exits, so train runs to its end.
# Usage: launcher_build_test.sh
source "$(dirname "$0")/lib.sh"
bin="$tmp/bin" build="$tmp/build"
mkdir -p "$bin"
cat > "$bin/dpkg-query" <<'SH'
#!/usr/bin/env bash
printf 'install ok installed'
SH
cat > "$bin/cmake" <<'SH'
#!/usr/bin/env bash
echo "cmake $*" >> "$FARM_TEST_LOG"
if [ "$1" = -S ]; then
  build="$4"
  mkdir -p "$build"
  printf 'FARM_BUILD_TESTS:BOOL=ON\n' > "$build/CMakeCache.txt"
  echo "-- Found Torch: stand-in"
  exit 0
fi
if [ "$1" = --build ]; then
  build="$2"
  mkdir -p "$build/learner" "$build/worker"
  cat > "$build/learner/farm-learner" <<'L'
#!/usr/bin/env bash
while [ $# -gt 0 ]; do [ "$1" = --endpoint-file ] && echo tcp://127.0.0.1:1 > "$2"; shift; done
exit 0
L
  printf '#!/usr/bin/env bash\nexit 0\n' > "$build/worker/farm-worker"
  chmod +x "$build/learner/farm-learner" "$build/worker/farm-worker"
  echo "[100%] Built target stand-in"
fi
SH
printf '#!/usr/bin/env bash\necho "ctest $*" >> "$FARM_TEST_LOG"\n' > "$bin/ctest"
chmod +x "$bin"/*
export FARM_TEST_LOG="$tmp/calls" FARM_BUILD_DIR="$build"
farm() { env -u FARM_SKIP_BUILD -u FARM_BUILD_TARGETS PATH="$bin:$PATH" "$root/scripts/farm" "$@" 2>&1; }

out="$(farm train --workers 1)" || fail "scripts/farm train failed: $out"
grep -q "cmake: -- Found Torch: stand-in" <<<"$out" || fail "the configure's lines were not shown: $out"
grep -q "^cmake -S .* -DFARM_BUILD_TESTS=ON" "$tmp/calls" || fail "train did not configure with the tests: $(cat "$tmp/calls")"
if ! command -v ccache > /dev/null; then
  grep -q "CMAKE_CXX_COMPILER_LAUNCHER" "$tmp/calls" && fail "ccache was used without being installed: $(cat "$tmp/calls")"
fi
build_line="$(grep -- "^cmake --build" "$tmp/calls")"
[[ "$build_line" == *"--target farm-learner farm-worker" ]] || fail "train built more than the learner and the worker: $build_line"
grep -q "farm: building farm-learner farm-worker" <<<"$out" || fail "no line saying what is built: $out"

: > "$tmp/calls"
out="$(farm test -R nothing)" || fail "scripts/farm test failed: $out"
grep -q "^cmake -S" "$tmp/calls" && fail "test configured again instead of reusing train's build: $(cat "$tmp/calls")"
grep -qx "cmake --build $build -j [0-9]*" "$tmp/calls" || fail "test did not build everything: $(cat "$tmp/calls")"
grep -q "^ctest .*-R nothing" "$tmp/calls" || fail "test did not run ctest: $(cat "$tmp/calls")"

: > "$tmp/calls"
out="$(farm build)" || fail "scripts/farm build failed: $out"
grep -q -- "--target farm-learner farm-worker farm-eval farm-export farm-keygen farm-random$" "$tmp/calls" ||
  fail "build did not build the programs: $(cat "$tmp/calls")"

# ccache and ninja installed: the first configure of a build directory uses them.
printf '#!/usr/bin/env bash\nexec "$@"\n' > "$bin/ccache"
printf '#!/usr/bin/env bash\nexit 0\n' > "$bin/ninja"
chmod +x "$bin/ccache" "$bin/ninja"
rm -rf "$build"
: > "$tmp/calls"
out="$(farm build)" || fail "scripts/farm build with ccache failed: $out"
grep -q "^cmake -S .* -DCMAKE_CXX_COMPILER_LAUNCHER=ccache" "$tmp/calls" ||
  fail "ccache is installed but the configure did not use it: $(cat "$tmp/calls")"
grep -q "^cmake -S $root -B $build -G Ninja " "$tmp/calls" ||
  fail "ninja is installed but the configure did not use it: $(cat "$tmp/calls")"
echo "ok: train builds farm-learner and farm-worker, build the programs, test everything in the same directory"
