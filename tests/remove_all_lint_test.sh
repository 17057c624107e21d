#!/usr/bin/env bash
# No call of std::filesystem::remove_all in the C++ sources: RemoveTree (common/files.h) instead. PyTorch's
# wheels (2.5 and later) export their own copy of remove_all from libtorch.so, which the dynamic linker binds in
# preference to libstdc++'s and which crashes when called from a program built with another libstdc++: on the
# GPU machine (torch 2.11) scripted_encoder_test passed every check and then died of SIGSEGV in such a call.
# Debian's LibTorch 1.13 exports none, so nothing here shows the crash: this rule is what keeps it out.
# Usage: remove_all_lint_test.sh
source "$(dirname "$0")/lib.sh"
cd "$root"
files=()
while IFS= read -r f; do files+=("$f"); done < <(git ls-files '*.cpp' '*.cc' '*.h' '*.hpp')
[ "${#files[@]}" -gt 100 ] || fail "only ${#files[@]} C++ sources found: did the layout change?"
# The pattern finds a call (comments name the function without parentheses); shown to match first.
pattern='remove_all[[:space:]]*\('
echo '  fs::remove_all(dir);' | grep -E "$pattern" > /dev/null || fail "the pattern does not match a call"
found="$(grep -nE "$pattern" "${files[@]}" || true)"
[ -z "$found" ] || fail "std::filesystem::remove_all called (use RemoveTree from common/files.h):
$found"
echo "ok: no remove_all call in ${#files[@]} C++ sources"
