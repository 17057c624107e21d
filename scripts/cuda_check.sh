#!/usr/bin/env bash
# The CUDA compile check (issue 29): compiles the code behind FARM_WITH_CUDA, which Debian 12's CPU-only
# LibTorch never builds, against Debian trixie's CUDA LibTorch, and links farm-learner with it. No GPU needed.
#
#   scripts/cuda_check.sh
#
# 1. Packages: with an apt configuration of its own (its own sources list naming trixie main contrib non-free,
#    its own lists, cache, state and an empty dpkg status, all under the cache dir; APT_CONFIG points at it and it
#    points apt.conf.d, sources.list.d and preferences at an empty dir, so nothing of the system's /etc/apt is read
#    and nothing of the system's apt lists or dpkg database is written) it downloads trixie's libtorch-cuda-dev
#    (LibTorch 2.6, CUDA 12.4), nvidia-cuda-dev (CUDA headers and libraries), libcu++-dev, libcub-dev,
#    libthrust-dev and the Depends closure of libtorch-cuda-2.6 and libcudart12 (the libraries they load, for the
#    symbol check; nvidia-cudnn, an installer, and libcuda1, the driver, left out), and unpacks them with dpkg-deb
#    into the cache dir. An unpacked cache from an earlier run is reused as it is, unless it lacks one of the
#    packages named here (then everything is fetched again).
# 2. A CMake build of its own (build-cuda-check/, Debian's CPU LibTorch, Release; in the background while the
#    packages download) gives farm.pb.h, libfarm_common.a, libfarm_proto.a and every translation unit's flags
#    (compile_commands.json).
# 3. Compiles to objects, FARM_CUDA_CHECK_JOBS at a time: every learner source, and every other source (tests,
#    tools, ...) that mentions FARM_WITH_CUDA or includes a project header with a FARM_WITH_CUDA conditional
#    (found by grep at run time), each with its own flags but -DFARM_WITH_CUDA, the trixie LibTorch's definitions,
#    and its include dirs ahead of the system's (where Debian 12's LibTorch 1.13 has its own ATen/, c10/, torch/).
#    A probe checks that torch/version.h says 2.6 and cuda_runtime_api.h CUDA 12, and every object's dependency
#    list that no header of the CPU LibTorch (or of a CUDA under /usr/local) was read.
# 4. Links farm-learner: the objects, libfarm_common.a, libfarm_proto.a and Debian 12's other libraries as the
#    CMake link line has them, with the trixie libtorch, libtorch_cpu, libtorch_cuda, libc10, libc10_cuda and
#    libcudart in place of the CPU LibTorch, and -Wl,--allow-shlib-undefined (ld still resolves every symbol of the
#    objects; the flag only spares the shared libraries' own references: cuDNN's, and glibc 2.38's that Debian 12's
#    glibc 2.36 lacks). Then loads farm-learner's library closure as ld.so would, the trixie tree first, and fails
#    unless every undefined symbol is defined, with its version, except cuDNN's (libcudnn.so.9: not packaged).
# Exits non-zero on any compile error (the compiler's message is shown), header mix-up, link error or
# unexplained symbol. docs/OPERATIONS.md, "CUDA compile check": what it downloads, its cost and its limits
# (LibTorch 2.6 + CUDA 12.4 headers, not the GPU machine's 2.11 + CUDA 13).
#
# Environment: FARM_CUDA_CHECK_CACHE (the downloads and the unpacked packages; default /var/cache/farm-cuda-check;
# delete it or set FARM_CUDA_CHECK_REFRESH=1 to fetch again), FARM_CUDA_CHECK_BUILD_DIR (default build-cuda-check/
# in this checkout), FARM_CUDA_CHECK_JOBS (compile and unpack jobs; default 2), FARM_CUDA_CHECK_OPT (the
# optimisation flag of the compiles; default -O0, "keep" for the build's -O3: the check is for errors, and -O0
# takes about a fifth less time), FARM_CUDA_CHECK_MIRROR (default http://deb.debian.org/debian).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${FARM_CUDA_CHECK_CACHE:-/var/cache/farm-cuda-check}"
BUILD="${FARM_CUDA_CHECK_BUILD_DIR:-$ROOT/build-cuda-check}"
JOBS="${FARM_CUDA_CHECK_JOBS:-2}"
MIRROR="${FARM_CUDA_CHECK_MIRROR:-http://deb.debian.org/debian}"
export FARM_CUDA_CHECK_OPT="${FARM_CUDA_CHECK_OPT:--O0}"
OUT="$BUILD/cuda-check"
TRIXIE="$CACHE/root"
HELPER="$ROOT/scripts/cuda_check.py"
START=$(date +%s)

# Compile and link: LibTorch 2.6 and CUDA 12.4 headers and libraries (nvidia-cuda-dev depends on libcu++-dev,
# libcub-dev and libthrust-dev: the CUDA headers may include them). The Depends closure of libtorch-cuda-2.6 and
# libcudart12 comes in for the symbol check.
HEADER_PACKAGES=(libtorch-cuda-dev libtorch-cuda-2.6 nvidia-cuda-dev libcudart12 libcu++-dev libcub-dev libthrust-dev
                 libnccl-dev libgloo-cuda-dev)
CLOSURE_ROOTS=(libtorch-cuda-2.6 libcudart12)
# Left out: nvidia-cudnn is an installer (it fetches cuDNN from NVIDIA when installed; Debian ships no libcudnn),
# libcuda1 is the driver's library (LibTorch opens it at run time; no library links it).
CLOSURE_SKIP=nvidia-cudnn,libcuda1
export FARM_ROOT="$ROOT" FARM_BUILD="$BUILD" FARM_OUT="$OUT" FARM_TRIXIE="$TRIXIE"

say() { printf 'cuda_check [%4ds]: %s\n' "$(($(date +%s) - START))" "$*"; }
die() { printf 'cuda_check: error: %s\n' "$*" >&2; exit 1; }

case "${1:-}" in
  -h|--help) awk 'NR > 1 && /^set -euo pipefail/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) die "unknown argument '$1' (scripts/cuda_check.sh --help)" ;;
esac

arch="$(dpkg --print-architecture)"
[ "$arch" = amd64 ] || die "this machine is $arch: the check needs trixie's amd64 CUDA packages (amd64 only)"
[[ "$JOBS" =~ ^[1-9][0-9]*$ ]] || die "FARM_CUDA_CHECK_JOBS: expected a positive integer, got '$JOBS'"

# The project's Debian 12 packages (CPU LibTorch, protobuf, zmq, CMake, g++, python3, binutils ...).
"$ROOT/scripts/farm" deps

# ------------------------------------------------------------------------------ 2. the CPU build (background)
# Needs nothing from trixie: it runs while the packages download.
cpu_build() {
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    # FARM_UNITY_BATCH=1: one compile command per source file in compile_commands.json (a unity build lists its
    # generated units instead, and the check compiles and names each file).
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DFARM_BUILD_TESTS=ON -DFARM_BUILD_LEARNER=ON \
          -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DFARM_UNITY_BATCH=1
  else
    cmake -DFARM_UNITY_BATCH=1 "$BUILD"
  fi
  cmake --build "$BUILD" -j "$JOBS" --target farm_common farm_proto
}
mkdir -p "$BUILD"
say "configuring $BUILD (Debian's CPU LibTorch) and building farm_common and farm_proto (farm.pb.h), in the background"
set -m  # its own process group: an early exit stops cmake and the compilers it started, not just the subshell
cpu_build > "$BUILD/cuda-check-cmake.log" 2>&1 &
cpu_build_pid=$!
set +m
trap 'kill -- "-$cpu_build_pid" 2>/dev/null || true' EXIT

# ------------------------------------------------------------------------------------------------ 1. packages
fetch_packages() {
  local apt="$CACHE/apt" debs="$CACHE/debs" status=0
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/empty" "$apt/state" "$debs" ||
    die "cannot write $CACHE (run as root, or set FARM_CUDA_CHECK_CACHE to a writable directory)"
  : > "$apt/state/status"
  cat > "$apt/sources.list" <<EOF
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR trixie main contrib non-free
EOF
  cat > "$apt/apt.conf" <<EOF
Dir::Etc::Parts "$apt/empty";
Dir::Etc::main "/dev/null";
Dir::Etc::SourceList "$apt/sources.list";
Dir::Etc::SourceParts "$apt/empty";
Dir::Etc::Preferences "/dev/null";
Dir::Etc::PreferencesParts "$apt/empty";
Dir::State "$apt/state";
Dir::State::Lists "$apt/lists";
Dir::State::status "$apt/state/status";
Dir::Cache "$apt/cache";
Dir::Log "$apt/state";
APT::Architecture "amd64";
APT::Architectures { "amd64"; };
Acquire::Languages "none";
Acquire::Retries "3";
APT::Sandbox::User "root";
EOF
  export APT_CONFIG="$apt/apt.conf"
  say "apt-get update: trixie main contrib non-free, with the private configuration $APT_CONFIG"
  apt-get -q update > "$apt/update.log" 2>&1 || status=$?
  if [ "$status" -ne 0 ] || grep -q '^[WE]:' "$apt/update.log"; then
    cat "$apt/update.log" >&2
    die "apt-get update of trixie failed (its keys come with Debian 12's debian-archive-keyring 2023.3+deb12u1 and later)"
  fi
  local closure packages
  closure="$(python3 "$HELPER" apt-closure "${CLOSURE_ROOTS[@]}" --skip "$CLOSURE_SKIP")"
  # shellcheck disable=SC2086  # one package name per word
  mapfile -t packages < <(printf '%s\n' "${HEADER_PACKAGES[@]}" $closure | sort -u)
  printf '%s\n' "${packages[@]}" > "$apt/packages.txt"
  say "downloading ${#packages[@]} packages into $debs (apt-get download)"
  (cd "$debs" && apt-get -q download "${packages[@]}" > "$apt/download.log" 2>&1) ||
    { tail -20 "$apt/download.log"; die "apt-get download failed"; }
  grep -E '^Fetched' "$apt/download.log" | sed 's/^/cuda_check:   /' || true
  for p in "${packages[@]}"; do
    compgen -G "$debs/${p}_*.deb" > /dev/null || die "apt-get download left no $p in $debs"
  done
  say "downloaded $(du -sh "$debs" | cut -f1); unpacking with dpkg-deb, $JOBS at a time, largest first"
  rm -rf "$TRIXIE.tmp"
  mkdir -p "$TRIXIE.tmp"
  # nvidia-cuda-dev's static archives (3.3 GB unpacked) are of no use to a shared link: left out of the tree.
  # shellcheck disable=SC2016,SC2011  # Debian's .deb file names have no blanks or quotes
  ls -S "$debs"/*.deb | xargs -P "$JOBS" -I{} sh -c '
    case "$(basename "$1")" in
      nvidia-cuda-dev_*) dpkg-deb --fsys-tarfile "$1" | tar -x -C "$2" --wildcards --exclude="*.a" ;;
      *) dpkg-deb -x "$1" "$2" ;;
    esac || { echo "cuda_check: error: could not unpack $1" >&2; exit 1; }' _ {} "$TRIXIE.tmp" ||
    die "unpacking failed"
  (cd "$debs" && ls -- *.deb) > "$TRIXIE.tmp/.farm-cuda-check-debs"
  rm -rf "$TRIXIE"
  mv "$TRIXIE.tmp" "$TRIXIE"
  rm -rf "$debs"  # the unpacked tree is the cache
  say "unpacked into $TRIXIE ($(du -sh "$TRIXIE" | cut -f1))"
}

# A cache unpacked before a package was added to HEADER_PACKAGES lacks it: fetched again then.
missing_from_cache() {
  local p
  for p in "${HEADER_PACKAGES[@]}"; do grep -q "^${p}_" "$TRIXIE/.farm-cuda-check-debs" || echo "$p"; done
}
if [ -n "${FARM_CUDA_CHECK_REFRESH:-}" ] || [ ! -f "$TRIXIE/.farm-cuda-check-debs" ]; then
  fetch_packages
elif [ -n "$(missing_from_cache)" ]; then
  say "the unpacked cache lacks $(missing_from_cache | tr '\n' ' ')(added since it was made): fetching again"
  fetch_packages
else
  say "reusing the packages unpacked in $TRIXIE ($(wc -l < "$TRIXIE/.farm-cuda-check-debs") .debs; FARM_CUDA_CHECK_REFRESH=1 fetches again)"
fi
grep -E '^(libtorch-cuda-2.6|nvidia-cuda-dev)_' "$TRIXIE/.farm-cuda-check-debs" | sed 's/^/cuda_check:   /'

if ! wait "$cpu_build_pid"; then
  cat "$BUILD/cuda-check-cmake.log"
  die "configuring or building $BUILD failed"
fi
trap - EXIT
say "CMake build ready: $BUILD"

# ------------------------------------------------------------------------------------------------ 3. compile
rm -rf "$OUT"
mkdir -p "$OUT/logs"
python3 "$HELPER" plan | sed 's/^/cuda_check: /'
# The include order: torch/version.h and CUDA's runtime header must be trixie's.
cat > "$OUT/version_probe.cpp" <<'EOF'
#include <torch/version.h>
#include <cuda_runtime_api.h>
static_assert(TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR == 6, "not the trixie LibTorch 2.6 headers");
static_assert(CUDART_VERSION >= 12000 && CUDART_VERSION < 13000, "not CUDA 12's headers");
EOF
(cd "$BUILD" && bash "$OUT/probe.sh") || die "the version probe failed: the include dirs do not put LibTorch 2.6 and CUDA 12 first"

total="$(wc -l < "$OUT/jobs.txt")"
say "compiling $total translation units with -DFARM_WITH_CUDA against LibTorch 2.6 + CUDA 12.4, $JOBS at a time"
# One job: compile, then print its line and the compiler's output (if any) in one piece, so that parallel jobs do
# not interleave.
# Seconds: wall, and CPU (user + system) in parentheses, which a busy machine inflates less.
compile_one() {
  local n="$1" rel="$2" rc=0 t0 secs cpu log="$OUT/logs/$1.log" TIMEFORMAT='%3U %3S'
  t0=$(date +%s.%N)
  { time bash "$OUT/jobs/$n.sh" > "$log" 2>&1 || rc=$?; } 2> "$log.time"
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  cpu=$(awk '{ printf "%.1f", $1 + $2 }' "$log.time")
  if [ "$rc" -eq 0 ]; then
    { printf 'cuda_check: [%2d/%d] %-36s %6s s (cpu %5s s)\n' "$((10#$n))" "$CUDA_CHECK_TOTAL" "$rel" "$secs" "$cpu"
      cat "$log"; } > "$log.msg"
  else
    { printf 'cuda_check: [%2d/%d] %-36s %6s s (cpu %5s s)  FAILED (exit %s):\n' "$((10#$n))" "$CUDA_CHECK_TOTAL" "$rel" \
        "$secs" "$cpu" "$rc"
      cat "$log"; } > "$log.msg"
    echo "$rel" >> "$OUT/failed.txt"
  fi
  cat "$log.msg"
  return "$((rc != 0))"
}
export -f compile_one
export OUT CUDA_CHECK_TOTAL="$total"
: > "$OUT/failed.txt"
compile_status=0
# Each line "NNN REL": compile_one NNN REL.
# shellcheck disable=SC2016
cut -f1,2 "$OUT/jobs.txt" | xargs -P "$JOBS" -L1 bash -c 'compile_one "$1" "$2"' _ || compile_status=$?
if [ -s "$OUT/failed.txt" ] || [ "$compile_status" -ne 0 ]; then
  echo "cuda_check: FAILED: $(wc -l < "$OUT/failed.txt") of $total translation units do not compile with FARM_WITH_CUDA against LibTorch 2.6:"
  while read -r rel; do
    n="$(awk -F'\t' -v r="$rel" '$2 == r { print $1 }' "$OUT/jobs.txt")"
    echo "  $rel:"
    grep -m 5 -E ': (fatal )?error:' "$OUT/logs/$n.log" | sed 's/^/    /'
  done < "$OUT/failed.txt"
  exit 1
fi
python3 "$HELPER" deps-check || die "a translation unit read headers other than the trixie LibTorch's and CUDA's (above)"
say "all $total translation units compiled; none read a header of Debian 12's CPU LibTorch"

# --------------------------------------------------------------------------------------------------- 4. link
python3 "$HELPER" link "$OUT/farm-learner" -Wl,--allow-shlib-undefined > "$OUT/link.sh"
say "linking farm-learner against the trixie LibTorch and libcudart (-Wl,--allow-shlib-undefined; $OUT/link.sh)"
if ! bash "$OUT/link.sh" > "$OUT/link.log" 2>&1; then
  cat "$OUT/link.log"
  die "linking farm-learner against LibTorch 2.6 + CUDA 12.4 failed"
fi
sed 's/^/cuda_check:   ld: /' "$OUT/link.log"
say "checking the symbols of farm-learner's $(readelf -dW "$OUT/farm-learner" | grep -c NEEDED) direct and all indirect shared libraries"
python3 "$HELPER" symbols "$OUT/farm-learner" ||
  die "the shared libraries leave symbols unresolved that are not cuDNN's (above)"
say "OK: $total translation units compile with FARM_WITH_CUDA against LibTorch 2.6 + CUDA 12.4, and farm-learner links ($(du -h "$OUT/farm-learner" | cut -f1))"
