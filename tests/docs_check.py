#!/usr/bin/env python3
"""The user docs (README.md and docs/*.md) against the launcher, and free of the project's issue numbers.

1. Every `scripts/farm ...` command quoted in a fenced code block (```, lines joined at a trailing backslash) or in
   an inline code span: its COMMAND is one that `scripts/farm --help` lists, and every option it gives (--foo,
   --foo=bar) is one that `scripts/farm COMMAND --help` lists (in a usage line, in brackets, or at the start of a
   line of its option table). The command ends at a shell operator (|, &&, ;, >, 2>, &, a # comment, `, $( ... )).
   Placeholders (COMMAND, <command>) are not checked; option values (CONFIG, RUN_DIR, N, ...) never are.
2. No doc names an issue number ("issue 12", "Issue #12", "issues 3 and 4", "(#12)"): the docs speak to users,
   not to the tracker.

Prints every failure as FILE:LINE: ..., then a summary; exit status 1 on any failure, 2 on a usage error.
The help is asked of the launcher with FARM_SKIP_BUILD=1: nothing is installed or built.
Python 3 standard library only.

Usage: docs_check.py [--root DIR] [--farm LAUNCHER] [--list]
  --root DIR       the tree whose README.md and docs/*.md are checked (default: this checkout)
  --farm LAUNCHER  the launcher asked for help (default: DIR/scripts/farm, else this checkout's)
  --list           also print every quoted command found, as the words checked
"""
import argparse
import glob
import os
import re
import subprocess
import sys

HERE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# scripts/farm as a word: ./scripts/farm, /path/to/checkout/scripts/farm; not scripts/farm.sbatch or scripts/farm_x.
FARM_RE = re.compile(r"(?<![\w.-])(?:[\w.~$/-]*/)?scripts/farm(?![\w./-])")

ISSUE_RES = [
    # issue 12, Issue #12, issues 3 and 4, issues 3, 4 and 7
    re.compile(r"\bissues?\s+#?\d+(?:\s*(?:,|and|&|or)\s*#?\d+)*", re.IGNORECASE),
    # (#12), (#12, #13), (see #12)
    re.compile(r"\((?:[^()#\n]*\s)?#\d+(?:\s*,\s*#\d+)*\)"),
]

# Options every command takes (the launcher's own COMMAND --help).
ALWAYS_OPTIONS = {"--help"}


class Launcher:
    """The launcher's commands and each command's options, from its help (asked once per command)."""

    def __init__(self, path):
        self.path = path
        self.cache = {}
        self.env = dict(os.environ, FARM_SKIP_BUILD="1")
        top = self.help_text([])
        self.commands = set()
        for line in top.splitlines():
            m = re.match(r"\s*scripts/farm\s+([a-z][\w-]*)\b", line)
            if m:
                self.commands.add(m.group(1))
        if not self.commands:
            raise RuntimeError(f"'{path} --help' lists no command:\n{top}")

    def help_text(self, args):
        try:
            out = subprocess.run(["bash", self.path] + args + ["--help"], env=self.env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, universal_newlines=True, timeout=120)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"'{self.path} {' '.join(args + ['--help'])}' took over 120 s")
        if out.returncode != 0:
            raise RuntimeError(f"'{self.path} {' '.join(args + ['--help'])}' exited with status "
                               f"{out.returncode}:\n{out.stdout}")
        return out.stdout

    def options(self, command):
        """The options COMMAND --help lists: those of its usage lines (scripts/farm ..., usage: ...), those in
        brackets ([--foo ...], [... | --foo]) and those that start a line (an option table's entries, 'x, --foo')."""
        if command not in self.cache:
            text = self.help_text([command])
            opts = set(ALWAYS_OPTIONS)
            for line in text.splitlines():
                stripped = line.strip()
                if re.match(r"(?:scripts/farm\s|usage:|Usage:)", stripped):
                    opts.update(re.findall(r"(?<![\w-])--[A-Za-z0-9][\w-]*", stripped))
                    continue
                m = re.match(r"(?:-\w,\s*)?(--[A-Za-z0-9][\w-]*)", stripped)
                if m:
                    opts.add(m.group(1))
                opts.update(re.findall(r"[\[|]\s*(--[A-Za-z0-9][\w-]*)", stripped))
            self.cache[command] = opts
        return self.cache[command]


def shell_words(text):
    """The words of TEXT, as a shell splits them, up to the first shell operator outside quotes: |, &, ;, <, >
    (a 2> drops its 2), a # that starts a word, a backtick, a $( or an unbalanced )."""
    words, word, quote, has_word, i = [], "", None, False, 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == quote:
                quote = None
            elif c == "\\" and quote == '"' and i + 1 < len(text):
                i += 1
                word += text[i]
            else:
                word += c
            i += 1
            continue
        if c in "'\"":
            quote, has_word = c, True
        elif c == "\\" and i + 1 < len(text):
            i += 1
            if text[i] != "\n":
                word += text[i]
                has_word = True
        elif c.isspace():
            if has_word:
                words.append(word)
            word, has_word = "", False
        elif c in "|&;<>`)" or (c == "#" and not has_word) or text.startswith("$(", i):
            if c in "<>" and re.fullmatch(r"\d+", word):
                word, has_word = "", False  # 2> FILE: the 2 is the redirection's
            break
        else:
            word += c
            has_word = True
        i += 1
    if has_word:
        words.append(word)
    return words


def is_placeholder(word):
    return bool(re.fullmatch(r"<[^>]*>|\[?[A-Z][A-Z0-9_]*\]?|\.\.\.", word))


def code_spans(lines):
    """(line number, text) of every fenced block's logical line (joined at trailing backslashes) and every inline
    code span of LINES (the spans of a paragraph may cross its line breaks)."""
    spans = []
    fence = None  # the open fence's marker
    block = []  # (line number, text) of the open block
    para = []  # (line number, text) of the paragraph outside blocks

    def flush_para():
        if not para:
            return
        text = "\n".join(t for _, t in para)
        starts, pos = [], 0
        for n, t in para:
            starts.append((pos, n))
            pos += len(t) + 1
        for m in re.finditer(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", text, re.DOTALL):
            if "\n\n" in m.group(2):
                continue
            at = m.start(2)
            line = max(n for s, n in starts if s <= at)
            spans.append((line, m.group(2).replace("\n", " ")))
        para.clear()

    def flush_block():
        joined, first = "", None
        for n, t in block:
            if first is None:
                first = n
            if t.endswith("\\"):
                joined += t[:-1] + " "
            else:
                spans.append((first, joined + t))
                joined, first = "", None
        if first is not None:
            spans.append((first, joined))
        block.clear()

    for number, line in enumerate(lines, 1):
        m = re.match(r"\s*(```+|~~~+)", line)
        if fence is None and m:
            flush_para()
            fence = m.group(1)
            continue
        if fence is not None:
            if m and m.group(1).startswith(fence) and not line.strip()[len(m.group(1)):].strip():
                flush_block()
                fence = None
            else:
                block.append((number, line.rstrip()))
            continue
        if line.strip():
            para.append((number, line))
        else:
            flush_para()
    flush_para()
    if fence is not None:
        flush_block()
    return spans


def check_doc(path, shown, launcher, failures, listing=False):
    """Checks one doc; returns how many commands it quotes that were checked (LISTING: printing each)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    checked = 0
    for number, text in code_spans(lines):
        for m in FARM_RE.finditer(text):
            words = shell_words(text[m.end():])
            if not words:
                continue  # scripts/farm alone: its usage
            command = words[0]
            if listing:
                print(f"{shown}:{number}: scripts/farm {' '.join(words)}")
            if command in ("--help", "-h", "help"):
                checked += 1
                continue
            if is_placeholder(command):
                continue
            checked += 1
            if command.startswith("-") or command not in launcher.commands:
                failures.append(f"{shown}:{number}: 'scripts/farm {command}': no such command in "
                                f"'scripts/farm --help' ({', '.join(sorted(launcher.commands))})")
                continue
            known = launcher.options(command)
            for word in words[1:]:
                word = word.strip("[]")
                if not word.startswith("--") or word == "--":
                    continue
                option = word.split("=", 1)[0].rstrip(".,:")
                if is_placeholder(option[2:]) or "<" in option:
                    continue
                if option not in known:
                    failures.append(f"{shown}:{number}: 'scripts/farm {command}' with {option}, which "
                                    f"'scripts/farm {command} --help' does not list")
    for number, line in enumerate(lines, 1):
        for issue_re in ISSUE_RES:
            for m in issue_re.finditer(line):
                failures.append(f"{shown}:{number}: names an issue number ('{m.group(0)}'): say what it means "
                                f"to a user instead")
    return checked


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=HERE_ROOT, help="the tree whose README.md and docs/*.md are checked")
    parser.add_argument("--farm", help="the launcher asked for help (default: ROOT/scripts/farm, else this "
                                       "checkout's)")
    parser.add_argument("--list", action="store_true", help="print every command found, as its words")
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    farm = args.farm or os.path.join(root, "scripts", "farm")
    if not os.path.isfile(farm):
        farm = os.path.join(HERE_ROOT, "scripts", "farm")
    try:
        launcher = Launcher(farm)
    except RuntimeError as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    # README.md and docs/*.md only: not records/, not a build tree, not docs/ subfolders.
    docs = [p for p in [os.path.join(root, "README.md")] if os.path.isfile(p)]
    docs += sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    if not docs:
        print(f"FAIL: no README.md or docs/*.md under {root}", file=sys.stderr)
        return 2
    failures, total = [], 0
    per_doc = []
    for path in docs:
        shown = os.path.relpath(path, root)
        before = len(failures)
        try:
            n = check_doc(path, shown, launcher, failures, args.list)
        except RuntimeError as e:
            failures.append(f"{shown}: {e}")
            n = 0
        total += n
        per_doc.append((shown, n, len(failures) - before))
    for failure in failures:
        print(f"FAIL: {failure}")
    for shown, n, bad in per_doc:
        print(f"  {shown}: {n} commands checked, {bad} failures")
    print(f"docs_check: {len(docs)} docs scanned, {total} scripts/farm commands checked against "
          f"{len(launcher.cache)} commands' help, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
