#!/usr/bin/env bash
# No `| grep -q` and no `| head` in the shell scripts of tests/ and scripts/: under `set -o pipefail` the reader
# exits at its first match (or line N) and the writer, if it writes again, dies of SIGPIPE and fails the whole
# pipeline, so the outcome depends on timing (the compose test once failed "the learner's log does not say who
# joined" with the line in the log). Use `grep PATTERN > /dev/null`, `grep -m N` on a file, or `sed -n 1,Np`,
# which read to the end. The first check shows the failure itself, so that this rule is not taken on faith.
# Usage: pipe_lint_test.sh
source "$(dirname "$0")/lib.sh"
cd "$root"
status=0
seq 1 200000 | grep -q '^1$' || status=$?
[ "$status" -eq 141 ] || echo "note: 'seq | grep -q' under pipefail ended with status $status here (141 expected)"
seq 1 200000 | grep '^1$' > /dev/null || fail "'seq | grep > /dev/null' failed under pipefail"

# Every shell script: *.sh, and the files without an extension whose first line names a shell.
files=()
while IFS= read -r f; do
  case "$f" in
    *.sh) files+=("$f") ;;
    */*.*) ;;
    *) [[ "$(sed -n 1p "$f")" == '#!'*sh* ]] && files+=("$f") ;;
  esac
done < <(git ls-files tests scripts .ci docker)
[ "${#files[@]}" -gt 30 ] || fail "only ${#files[@]} shell scripts found: did the layout change?"
found="$(grep -nE '(^|[^|])\|[[:space:]]*(grep[[:space:]]+(-[a-zA-Z]*q|--quiet)|head)\b' "${files[@]}" |
  grep -v '^tests/pipe_lint_test.sh:' || true)"
[ -z "$found" ] || fail "pipes that can die of SIGPIPE under pipefail:
$found"
echo "ok: no '| grep -q' or '| head' in ${#files[@]} shell scripts"
