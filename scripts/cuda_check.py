#!/usr/bin/env python3
"""Helper of scripts/cuda_check.sh (the CUDA compile check); not meant to be run by hand.

  apt-closure PKG... [--skip A,B]   the Depends closure of PKG (first installable alternative of each),
                                    through `apt-cache depends` under the caller's APT_CONFIG
  plan                              the translation units to compile and their commands (jobs/NNN.sh)
  deps-check                        no header of Debian 12's CPU LibTorch (libtorch-dev) was read
  link                              the link command of farm-learner against the trixie LibTorch
  symbols EXE                       EXE's shared libraries resolved as the loader would (the trixie tree first,
                                    then the system's dirs): every undefined symbol defined, but cuDNN's
Paths come from the environment the shell script sets: FARM_ROOT (checkout), FARM_BUILD (the CMake build
configured with Debian's CPU LibTorch), FARM_OUT (this check's own outputs), FARM_TRIXIE (the unpacked trixie
packages).
"""
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(os.environ.get("FARM_ROOT", ".")).resolve()
BUILD = Path(os.environ.get("FARM_BUILD", "build-cuda-check")).resolve()
OUT = Path(os.environ.get("FARM_OUT", BUILD / "cuda-check")).resolve()
TRIXIE = Path(os.environ.get("FARM_TRIXIE", "/var/cache/farm-cuda-check/root")).resolve()
MULTIARCH = "x86_64-linux-gnu"
# Headers of the trixie LibTorch (libtorch-cuda-dev) and CUDA (nvidia-cuda-dev, libcu++-dev, ...): ahead of
# the system's /usr/include, where Debian 12's CPU LibTorch 1.13 has its own ATen/, c10/ and torch/.
TRIXIE_INCLUDES = ["usr/include/torch/csrc/api/include", "usr/include"]
# The trixie shared libraries that farm-learner links directly; torch_cpu and torch_cuda with --no-as-needed, as
# LibTorch's CMake config links them (their CPU and CUDA kernels register themselves when loaded).
NO_AS_NEEDED = ["libtorch_cpu.so.2.6", "libtorch_cuda.so.2.6"]
AS_NEEDED = ["libtorch.so.2.6", "libc10_cuda.so.2.6", "libc10.so.2.6", "libcudart.so.12"]
# A preprocessor conditional on FARM_WITH_CUDA (a mere mention in a comment changes nothing).
CUDA_DIRECTIVE = re.compile(r"^\s*#\s*(if|ifdef|ifndef|elif|elifdef|elifndef)\b.*\bFARM_WITH_CUDA\b", re.M)
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def die(msg):
    print(f"cuda_check: error: {msg}", file=sys.stderr)
    sys.exit(1)


# ---------------------------------------------------------------------------------------------------- apt-closure
def apt_closure(args):
    skip = set()
    roots = []
    it = iter(args)
    for a in it:
        if a == "--skip":
            skip.update(x for x in next(it).split(",") if x)
        else:
            roots.append(a)
    seen, todo = set(), list(roots)
    flags = ["--no-recommends", "--no-suggests", "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"]
    while todo:
        batch = sorted({p for p in todo if p not in seen and p not in skip})
        todo = []
        if not batch:
            break
        seen.update(batch)
        out = subprocess.run(["apt-cache", "depends", *flags, *batch], check=True, capture_output=True,
                             text=True).stdout
        # Each package: a line with its name, then "  Depends: X" / "  PreDepends: X" lines; "  |Depends: X" says
        # the next line is an alternative of X; a virtual X ("<X>") is followed by its providers, indented more.
        group, pending = [], False
        for line in out.splitlines() + ["END"]:
            m = re.match(r"^  (\|?)(Pre)?Depends: (.*)$", line)
            if m or not line.startswith("    "):
                if group and not pending:
                    todo.append(pick(group, skip))
                    group = []
                if m:
                    group.append([m.group(3), []])
                    pending = m.group(1) == "|"
                else:
                    group, pending = [], False
            elif group:  # a provider of the virtual package just named
                group[-1][1].append(line.strip())
    print("\n".join(sorted(seen)))


def pick(group, skip):
    """The first alternative that is a real package (or a virtual one's first provider), unless skipped."""
    for name, providers in group:
        if name in skip:
            return name
        if not name.startswith("<"):
            return name
        if providers:
            return providers[0]
    return group[0][0]


# ----------------------------------------------------------------------------------------------------------- plan
def project_includes(path, cache):
    """Project headers a file includes, transitively ("..." includes found under the checkout)."""
    if path in cache:
        return cache[path]
    cache[path] = set()
    found = set()
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return found
    for inc in INCLUDE.findall(text):
        for base in (ROOT, path.parent):
            cand = (base / inc).resolve()
            if cand.is_file() and ROOT in cand.parents:
                found.add(cand)
                found |= project_includes(cand, cache)
                break
    cache[path] = found
    return found


def defines(cmd):
    return [a for a in cmd if a.startswith("-D")]


def cmake_defs_of_trixie():
    """-D flags a CMake build against the trixie LibTorch gets from its config (torch_cpu's and torch_cuda's
    INTERFACE_COMPILE_DEFINITIONS, TORCH_CXX_FLAGS)."""
    cmake = TRIXIE / "usr/lib" / MULTIARCH / "cmake"
    targets = (cmake / "Caffe2/Caffe2Targets.cmake").read_text()
    defs = []
    for m in re.finditer(r'INTERFACE_COMPILE_DEFINITIONS "([^"$\\]*)"', targets):
        defs += ["-D" + d for d in m.group(1).split(";") if d]
    config = (cmake / "Torch/TorchConfig.cmake").read_text()
    m = re.search(r'set\(TORCH_CXX_FLAGS "([^"]*)"\)', config)
    if m:
        defs += shlex.split(m.group(1))
    return unique(defs)


def unique(items):
    """`items` in order, each once."""
    return list(dict.fromkeys(items))


def is_cpu_torch_include(path):
    p = os.path.normpath(path)
    return p == "/usr/include/torch/csrc/api/include" or any(
        p == d or p.startswith(d + "/") for d in ("/usr/include/torch", "/usr/include/ATen", "/usr/include/c10",
                                                   "/usr/include/caffe2"))


def plan(_args):
    cc_path = BUILD / "compile_commands.json"
    if not cc_path.is_file():
        die(f"{cc_path} is missing (configure with -DCMAKE_EXPORT_COMPILE_COMMANDS=ON)")
    entries = json.loads(cc_path.read_text())
    learner_dir = ROOT / "learner"
    by_file = {}
    for e in entries:
        f = Path(e["file"]).resolve()
        if f.suffix not in (".cpp", ".cc", ".cxx") or BUILD in f.parents:
            continue
        # One command per source; the learner's sources from farm_learner_core and farm-learner.
        by_file.setdefault(f, e)
    cache = {}
    chosen = []
    for f, e in sorted(by_file.items()):
        text = f.read_text(errors="replace")
        in_learner = learner_dir in f.parents
        if in_learner:
            why = "learner (linked into farm-learner)"
        elif "FARM_WITH_CUDA" in text:
            why = "mentions FARM_WITH_CUDA"
        else:
            headers = [h for h in project_includes(f, cache) if CUDA_DIRECTIVE.search(h.read_text(errors="replace"))]
            if not headers:
                continue
            why = "includes " + ", ".join(str(h.relative_to(ROOT)) for h in sorted(headers))
        chosen.append((f, e, why, in_learner))
    if not any(in_learner for *_, in_learner in chosen):
        die("no learner source in compile_commands.json (was the build configured with the learner?)")

    # The CPU LibTorch's compile definitions (a learner source's minus a source without LibTorch's) give way to the
    # trixie LibTorch's.
    learner_cmd = next(shlex.split(e["command"]) for f, e, *_ in chosen if learner_dir in f.parents)
    plain = [shlex.split(e["command"]) for f, e in by_file.items() if (ROOT / "common") in f.parents]
    old_defs = set(defines(learner_cmd)) - (set(defines(plain[0])) if plain else set())
    new_defs = cmake_defs_of_trixie() + ["-DFARM_WITH_CUDA"]
    includes = []
    for inc in TRIXIE_INCLUDES:
        includes += ["-isystem", str(TRIXIE / inc)]

    # The optimisation level (FARM_CUDA_CHECK_OPT, e.g. -O0; "keep": the build's own, -O3 in Release).
    opt = os.environ.get("FARM_CUDA_CHECK_OPT", "keep")
    if opt != "keep" and not re.fullmatch(r"-O([0-3sgz]|fast)?", opt):
        die(f"FARM_CUDA_CHECK_OPT: expected keep or an -O flag such as -O0, got {opt!r}")

    jobs = OUT / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    for old in jobs.glob("*.sh"):
        old.unlink()
    lines, learner_objs = [], []
    for n, (f, e, why, in_learner) in enumerate(chosen, 1):
        cmd = shlex.split(e["command"])
        rel = f.relative_to(ROOT)
        obj = OUT / "obj" / (str(rel) + ".o")
        obj.parent.mkdir(parents=True, exist_ok=True)
        new = [cmd[0]] + new_defs + includes
        i = 1
        while i < len(cmd):
            a = cmd[i]
            if a in ("-isystem", "-I") and i + 1 < len(cmd) and is_cpu_torch_include(cmd[i + 1]):
                i += 2
                continue
            joined = a[len("-isystem"):] if a.startswith("-isystem") else a[2:] if a.startswith("-I") else ""
            if joined and is_cpu_torch_include(joined):
                i += 1
                continue
            if a in old_defs or a == "-DFARM_WITH_CUDA":
                i += 1
                continue
            if a == "-o":
                i += 2
                continue
            if opt != "keep" and re.fullmatch(r"-O([0-3sgz]|fast)?", a):
                a = opt
            if a in ("-c",) and i + 1 < len(cmd):  # the source comes last, after -c
                i += 2
                continue
            new.append(a)
            i += 1
        new += ["-MD", "-MF", str(obj) + ".d", "-o", str(obj), "-c", str(f)]
        script = jobs / f"{n:03d}.sh"
        script.write_text(f"# {rel}: {why}\ncd {shlex.quote(e['directory'])}\nexec {shlex.join(new)}\n")
        lines.append(f"{n:03d}\t{rel}\t{why}")
        if in_learner:
            learner_objs.append(str(obj))
    (OUT / "jobs.txt").write_text("\n".join(lines) + "\n")
    # The first learner source's flags on the version probe (cuda_check.sh writes version_probe.cpp).
    probe = shlex.split(next(l for l in (jobs / "001.sh").read_text().splitlines() if l.startswith("exec "))[5:])
    probe = probe[:probe.index("-MD")] + ["-fsyntax-only", str(OUT / "version_probe.cpp")]
    (OUT / "probe.sh").write_text(shlex.join(probe) + "\n")
    (OUT / "learner-objects.txt").write_text("\n".join(learner_objs) + "\n")
    print(f"replaced the CPU LibTorch's definitions {' '.join(sorted(old_defs)) or '(none)'}")
    print(f"     by the trixie LibTorch's {' '.join(new_defs)}")
    print(f"include dirs first: {' '.join(str(TRIXIE / i) for i in TRIXIE_INCLUDES)}")
    if opt != "keep":
        print(f"optimisation: {opt} in place of the build's (FARM_CUDA_CHECK_OPT)")


# ----------------------------------------------------------------------------------------------------- deps-check
def deps_check(_args):
    listed = subprocess.run(["dpkg-query", "-L", "libtorch-dev"], capture_output=True, text=True).stdout.split()
    cpu = {os.path.realpath(p) for p in listed if p.startswith("/usr/include/")}
    cpu_dirs = ("/usr/include/torch/", "/usr/include/ATen/", "/usr/include/c10/", "/usr/include/caffe2/")
    bad = 0
    trixie_prefix = str(TRIXIE / "usr/include") + "/"
    for n, rel, _why in (l.split("\t") for l in (OUT / "jobs.txt").read_text().splitlines()):
        d = OUT / "obj" / (rel + ".o.d")
        text = d.read_text().replace("\\\n", " ")
        deps = [os.path.realpath(p) for p in text.split(":", 1)[1].split()]
        wrong = [p for p in deps if p in cpu or p.startswith(cpu_dirs)]
        if wrong:
            bad += 1
            print(f"cuda_check: {rel} read {len(wrong)} header(s) of Debian 12's CPU LibTorch, e.g. {wrong[0]}")
        local = [p for p in deps if p.startswith("/usr/local/") and not p.startswith(str(TRIXIE) + "/")]
        if local:  # e.g. a CUDA toolkit installed by hand under /usr/local: not what CI has
            bad += 1
            print(f"cuda_check: {rel} read {len(local)} header(s) under /usr/local, e.g. {local[0]}")
        used = sum(p.startswith(trixie_prefix) for p in deps)
        if used == 0 and any("torch" in p or "ATen" in p for p in deps):
            bad += 1
            print(f"cuda_check: {rel} read LibTorch headers but none of the trixie ones")
    if bad:
        sys.exit(1)


# ----------------------------------------------------------------------------------------------------------- link
def lib_dirs():
    """Directories of the unpacked trixie tree that hold shared libraries (for -rpath-link)."""
    dirs = []
    for base in ("usr/lib/" + MULTIARCH, "lib/" + MULTIARCH, "usr/lib", "lib"):
        d = TRIXIE / base
        if d.is_dir():
            dirs.append(d)
            dirs += sorted(p for p in d.iterdir() if p.is_dir() and not p.is_symlink() and any(p.glob("*.so*")))
    return unique(dirs)


def link(args):
    output = args[0] if args else str(OUT / "farm-learner")
    extra = args[1:]
    link_txt = BUILD / "learner/CMakeFiles/farm-learner.dir/link.txt"
    if not link_txt.is_file():
        die(f"{link_txt} is missing (a Makefile generator build of the learner)")
    cmd = shlex.split(link_txt.read_text().strip())
    objs = (OUT / "learner-objects.txt").read_text().split()
    main_obj = [o for o in objs if o.endswith("/learner/main.cpp.o")]
    core_objs = [o for o in objs if o not in main_obj]
    libdir = TRIXIE / "usr/lib" / MULTIARCH
    new = [cmd[0]]
    dropped = []
    i = 1
    while i < len(cmd):
        a = cmd[i]
        base = os.path.basename(a.split(",")[-1].strip('"'))
        if a == "-o":
            new += ["-o", output]
            i += 2
            continue
        if a.endswith("main.cpp.o"):
            new += main_obj
        elif a.endswith("libfarm_learner_core.a"):
            new += core_objs
        elif re.match(r"^-Wl,--no-as-needed,", a) or re.match(r"^(lib)?(torch|c10|glog|gflags)", base):
            # The CPU LibTorch 1.13 and what its config adds (glog, gflags): replaced below.
            dropped.append(a)
        elif a == "-Wl,--as-needed" and dropped and dropped[-1].startswith("-Wl,--no-as-needed,"):
            dropped.append(a)
        else:
            new.append(a)
        i += 1
    for name in NO_AS_NEEDED + AS_NEEDED:
        if not (libdir / name).exists():
            die(f"{libdir / name} is missing from the unpacked packages")
    new += ["-Wl,--no-as-needed"] + [str(libdir / n) for n in NO_AS_NEEDED] + ["-Wl,--as-needed"]
    new += [str(libdir / n) for n in AS_NEEDED]
    new += ["-Wl,-rpath-link," + ":".join(str(d) for d in lib_dirs())]
    new += extra
    print(f"cd {shlex.quote(str(BUILD / 'learner'))} && {shlex.join(new)}")


# -------------------------------------------------------------------------------------------------------- symbols
# The system's library dirs, searched after the trixie tree's; the system's ld.so.conf is not read on purpose (a
# CUDA toolkit under /usr/local, on a developer's machine, would answer for cuDNN there and not in CI).
SYSTEM_LIB_DIRS = [Path(d) for d in ("/lib/" + MULTIARCH, "/usr/lib/" + MULTIARCH, "/lib64", "/lib", "/usr/lib")]
# Not packaged by Debian: libtorch-cuda-2.6 depends on nvidia-cudnn, an installer that downloads cuDNN from NVIDIA
# when it is installed, so no package has libcudnn.so.9.
UNPACKAGED = {"libcudnn.so.9": "cuDNN (Debian's nvidia-cudnn downloads it from NVIDIA when installed; no package has it)"}
UNPACKAGED_PREFIX = {"libcudnn.so.9": "cudnn"}


def readelf(args, path):
    return subprocess.run(["readelf", *args, "-W", str(path)], check=True, capture_output=True, text=True).stdout


# "  Num: Value Size Type Bind Vis Ndx Name": a line of readelf --dyn-syms -W. Bind: GLOBAL, WEAK, UNIQUE (GNU
# unique objects, e.g. libstdc++'s locale facet ids; older readelf: "<OS specific>: 10") or LOCAL.
DYNSYM = re.compile(r"^\s*\d+:\s+[0-9a-f]+\s+\S+\s+\S+\s+(?P<bind>GLOBAL|WEAK|UNIQUE|LOCAL|<OS specific>: \d+)\s+"
                    r"\S+\s+(?P<ndx>\S+)\s+(?P<name>\S+)")


class Elf:
    def __init__(self, path):
        self.path = path
        self.needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", readelf(["-d"], path))
        self.undefined = []       # (name, version or "")
        self.defined = set()      # (name, version or "")
        for line in readelf(["--dyn-syms"], path).splitlines():
            m = DYNSYM.match(line)
            if not m or m.group("bind") == "LOCAL":
                continue
            name, _, ver = m.group("name").partition("@")
            ver = ver.lstrip("@")
            if m.group("ndx") == "UND":
                if m.group("bind") != "WEAK":  # a weak reference may stay unresolved
                    self.undefined.append((name, ver))
            else:
                self.defined.add((name, ver))
                self.defined.add((name, ""))


def symbols(args):
    """Loads farm-learner's DT_NEEDED closure as ld.so would, with sonames looked up in the unpacked trixie tree
    first and in the system's library dirs next, and checks that every (non-weak) undefined symbol of every object
    is defined by one of them, with its version. Only cuDNN's may be missing."""
    exe = Path(args[0])
    dirs = lib_dirs() + [d for d in SYSTEM_LIB_DIRS if d.is_dir()]
    loaded, order, missing = {}, [], {}
    queue = [(exe.name, exe, None)]
    while queue:
        soname, path, needer = queue.pop(0)
        if soname in loaded or soname in missing:
            if soname in missing:
                missing[soname].add(needer)
            continue
        if path is None:
            path = next((d / soname for d in dirs if (d / soname).exists()), None)
            if path is None:
                missing[soname] = {needer}
                continue
        elf = Elf(path.resolve())
        loaded[soname] = elf
        order.append(soname)
        queue += [(n, None, soname) for n in elf.needed]
    defined = set()
    for elf in loaded.values():
        defined |= elf.defined
    unresolved = {}
    for soname in order:
        for name, ver in loaded[soname].undefined:
            if (name, ver) not in defined:
                unresolved.setdefault((name, ver), set()).add(soname)
    trixie = sum(str(e.path).startswith(str(TRIXIE)) for e in loaded.values())
    print(f"cuda_check: farm-learner loads {len(loaded) - 1} shared libraries ({trixie} from the trixie packages, "
          f"{len(loaded) - 1 - trixie} from this system: {', '.join(sorted(s for s, e in loaded.items() if s != exe.name and not str(e.path).startswith(str(TRIXIE))))})")
    bad, allowed = [], {}
    for soname, needers in sorted(missing.items()):
        if soname in UNPACKAGED:
            print(f"cuda_check:   {soname} (needed by {', '.join(sorted(needers))}) is not there: {UNPACKAGED[soname]}")
        else:
            bad.append(f"{soname}, needed by {', '.join(sorted(needers))}: in no unpacked package and not on this system")
    for (name, ver), users in sorted(unresolved.items()):
        lib = ver if ver in UNPACKAGED else next(
            (so for so, prefix in UNPACKAGED_PREFIX.items() if not ver and so in missing and name.startswith(prefix)), None)
        if lib:
            allowed.setdefault(lib, []).append(name)
        else:
            bad.append(f"{name}{'@' + ver if ver else ''}, referenced by {', '.join(sorted(users))}")
    for lib, names in allowed.items():
        print(f"cuda_check:   {len(names)} symbols of {lib} unresolved (allowed: {UNPACKAGED[lib]}), e.g. "
              f"{', '.join(names[:3])}")
    if bad:
        print(f"cuda_check: {len(bad)} unresolved libraries or symbols that are not cuDNN's:")
        for b in bad[:40]:
            print("  " + b)
        if len(bad) > 40:
            print(f"  ... and {len(bad) - 40} more")
        sys.exit(1)
    print(f"cuda_check: every other symbol the {len(loaded)} objects need is defined, with its version")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        die("usage: cuda_check.py apt-closure|plan|deps-check|link|symbols ...")
    cmds = {"apt-closure": apt_closure, "plan": plan, "deps-check": deps_check, "link": link, "symbols": symbols}
    if sys.argv[1] not in cmds:
        die(f"unknown command {sys.argv[1]}")
    cmds[sys.argv[1]](sys.argv[2:])
