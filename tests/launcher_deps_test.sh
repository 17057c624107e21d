#!/usr/bin/env bash
# scripts/farm deps as root with packages missing: apt-get's output (its progress through a download and install
# that can take minutes) reaches the user instead of minutes of silence. apt-get, dpkg-query and id are stand-ins
# on PATH; nothing is installed.
# Usage: launcher_deps_test.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cat > "$tmp/dpkg-query" <<'SH'
#!/usr/bin/env bash
printf 'unknown ok not-installed'
SH
cat > "$tmp/id" <<'SH'
#!/usr/bin/env bash
echo 0
SH
cat > "$tmp/apt-get" <<'SH'
#!/usr/bin/env bash
# Prints a line per package, as apt-get does while it downloads and unpacks.
for a in "$@"; do case "$a" in -*|install|update) ;; *) echo "Get:1 stand-in $a" ;; esac; done
[ "$1" = update ] && echo "Hit:1 stand-in update"
exit 0
SH
chmod +x "$tmp/dpkg-query" "$tmp/id" "$tmp/apt-get"
out="$(env -u FARM_SKIP_BUILD PATH="$tmp:$PATH" "$root/scripts/farm" deps 2>&1)" || fail "scripts/farm deps failed: $out"
grep -q "installing missing packages: .*libtorch-dev" <<<"$out" || fail "no 'installing' line: $out"
grep -q "Hit:1 stand-in update" <<<"$out" || fail "apt-get update's output was discarded: $out"
grep -q "Get:1 stand-in libtorch-dev" <<<"$out" || fail "apt-get install's output was discarded: $out"
echo "ok: apt-get's progress is shown"
