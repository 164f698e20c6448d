#!/usr/bin/env python3
"""The include graph, read from the sources' #include "..." lines (docs/design.md §1.1): no include
cycle between files, none between file names either (two headers of one name would make one), no two
headers of one name, and no include from a lower layer to a higher one
(common -> ingest; common -> shm -> monitor; shm -> worker and optimizer -> planner and tools -> launcher;
tests and bench above all).
With COMPILE_COMMANDS_JSON (build/compile_commands.json) the same checks run on the graph the
compiler reports (-H) for every translation unit, which must match the #include lines.
Usage: include_graph.py SOURCE_ROOT [COMPILE_COMMANDS_JSON]. It first runs the same checks on small
trees it writes with a known defect each, and fails if any defect goes unseen."""
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

SOURCE_EXT = (".c", ".h", ".cu", ".cuh")
HEADER_EXT = (".h", ".cuh")
# What each top-level folder may include, besides itself.
MAY_INCLUDE = {
    "common": set(),
    "shm": {"common"},
    "worker": {"common", "shm"},
    "optimizer": {"common", "shm"},
    "planner": {"common", "shm", "worker", "optimizer"},
    "ingest": {"common"},
    "monitor": {"common", "shm"},
    "tools": {"common", "shm", "worker", "optimizer"},
    "launcher": {"common", "shm", "worker", "optimizer", "planner"},
    "tests": {"common", "shm", "worker", "optimizer", "planner", "ingest", "monitor", "tools", "launcher"},
    "bench": {"common", "shm", "worker", "optimizer", "planner", "ingest", "monitor", "tools", "launcher"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources(root):
    """Source files under the layer folders, as paths relative to root."""
    out = []
    for top in sorted(MAY_INCLUDE):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if f.endswith(SOURCE_EXT):
                    out.append(os.path.relpath(os.path.join(dirpath, f), root))
    return out


def read_graph(root, files):
    """Edges file -> included file, resolved as the compiler does: beside the including file, then
    from the source root (the one include directory). Returns (edges, errors)."""
    known = set(files)
    edges, errors = {f: [] for f in files}, []
    for f in files:
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        for name in INCLUDE.findall(text):
            beside = os.path.normpath(os.path.join(os.path.dirname(f), name))
            target = beside if beside in known else os.path.normpath(name)
            if target not in known:
                errors.append(f'{f}: #include "{name}" names no source file of the tree')
                continue
            edges[f].append(target)
    return edges, errors


def find_cycle(edges):
    """One cycle of the directed graph as a list of nodes (first repeated last), or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = {n: WHITE for n in edges}
    for start in sorted(edges):
        if colour[start] != WHITE:
            continue
        stack, path = [(start, iter(sorted(edges[start])))], [start]
        colour[start] = GREY
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                colour[node] = BLACK
                stack.pop()
                path.pop()
            elif colour.get(nxt, WHITE) == GREY:
                return path[path.index(nxt):] + [nxt]
            elif colour.get(nxt, WHITE) == WHITE:
                colour[nxt] = GREY
                stack.append((nxt, iter(sorted(edges.get(nxt, [])))))
                path.append(nxt)
    return None


def check(root):
    """Every violation in the tree at root, one line each."""
    files = sources(root)
    edges, errors = read_graph(root, files)
    return files, edges, errors + graph_errors(files, edges)


def graph_errors(files, edges):
    """The violations in one include graph (edges file -> included files)."""
    errors = []
    cycle = find_cycle(edges)
    if cycle:
        errors.append("include cycle between files: " + " -> ".join(cycle))
    # The same graph over file names: a header including another of its own name, or a cycle
    # that closes only through two files of one name.
    by_name = {}
    for f, targets in edges.items():
        by_name.setdefault(os.path.basename(f), set()).update(os.path.basename(t) for t in targets)
    cycle = find_cycle({n: sorted(t) for n, t in by_name.items()})
    if cycle:
        errors.append("include cycle between file names: " + " -> ".join(cycle))
    seen = {}
    for f in files:
        if f.endswith(HEADER_EXT):
            seen.setdefault(os.path.basename(f), []).append(f)
    errors += [f"headers share the name {n}: {', '.join(p)}" for n, p in sorted(seen.items()) if len(p) > 1]
    for f, targets in sorted(edges.items()):
        top = f.split(os.sep)[0]
        for t in targets:
            ttop = t.split(os.sep)[0]
            if ttop != top and ttop not in MAY_INCLUDE[top]:
                errors.append(f"{f} includes {t}: {top} is below {ttop} (docs/design.md §1.1)")
    return errors


def compiler_command(entry):
    """The entry's compile command made to only preprocess and print each header it opens (-H):
    cc's own flags; for nvcc, the host compiler on the same -I and -D flags and the include folders
    nvcc adds itself (preprocessing needs no CUDA compiler)."""
    args = shlex.split(entry["command"]) if "command" in entry else list(entry["arguments"])
    if os.path.basename(args[0]) == "nvcc":
        cuda = os.path.join(os.path.dirname(shutil.which(args[0]) or "/usr/local/cuda/bin/nvcc"), "..", "include")
        keep = [a for a in args[1:] if a.startswith(("-I", "-D"))] + [f"-I{cuda}", f"-I{cuda}/cccl"]
        return ["g++", "-x", "c++"] + keep + ["-E", "-H", "-w", "-o", os.devnull, entry["file"]]
    out, skip = [args[0]], False
    for a in args[1:]:
        if skip:
            skip = False
        elif a in ("-o", "-MQ", "-MF", "-MT"):
            skip = True
        elif a not in ("-c", "-MD", "-MMD"):
            out.append(a)
    return out + ["-E", "-H", "-w", "-o", os.devnull]


def compiler_graph(root, compile_commands):
    """Edges file -> file it includes among the tree's files, as the compiler reports them for each
    translation unit of compile_commands.json (-H: one line per header opened, dots for its depth).
    Returns (edges, errors)."""
    with open(compile_commands) as fh:
        entries = json.load(fh)
    root = os.path.realpath(root)

    def rel(directory, path):
        p = os.path.realpath(os.path.join(directory, path))
        return os.path.relpath(p, root) if p.startswith(root + os.sep) and "/build" not in p[len(root):] else None

    def one(entry):
        entry = dict(entry, directory=os.path.join(os.path.dirname(os.path.abspath(compile_commands)),
                                                   entry["directory"]))
        r = subprocess.run(compiler_command(entry), cwd=entry["directory"], capture_output=True, text=True)
        return entry, r

    edges, errors = {}, []
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for entry, r in pool.map(one, entries):
            tu = rel(entry["directory"], entry["file"])
            if r.returncode != 0:
                errors.append(f"{entry['file']}: the compiler could not preprocess it: {r.stderr.strip()[-300:]}")
                continue
            stack = [tu]  # stack[d]: the file open at depth d (None: outside the tree)
            for line in r.stderr.splitlines():
                m = re.match(r"^(\.+) (.+)$", line)
                if not m:
                    continue
                depth, f = len(m[1]), rel(entry["directory"], m[2])
                del stack[depth:]
                parent = stack[depth - 1] if depth - 1 < len(stack) else None
                if parent and f:
                    edges.setdefault(parent, set()).add(f)
                stack += [None] * (depth - len(stack)) + [f]
    return {f: sorted(t) for f, t in edges.items()}, errors


def write_tree(root, tree):
    for path, text in tree.items():
        os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
        with open(os.path.join(root, path), "w") as fh:
            fh.write(text)


# Small trees with one defect each, and the words the report of that defect must contain.
DEFECTS = [
    ("a cycle of two headers",
     {"common/a.h": '#include "common/b.h"\n', "common/b.h": '#include "a.h"\n'}, "cycle between files"),
    ("a header including its namesake (a cycle only by name)",
     {"common/plan.h": "", "planner/plan.h": '#include "common/plan.h"\n', "planner/plan.c": '#include "plan.h"\n'},
     "cycle between file names"),
    ("two headers of one name", {"common/x.h": "", "shm/x.h": '#include "common/x.h"\n'}, "share the name x.h"),
    ("shm including the worker", {"shm/ring.c": '#include "worker/backend.h"\n', "worker/backend.h": ""},
     "shm is below worker"),
    ("the worker including the optimizer", {"worker/a.c": '#include "optimizer/adamw.h"\n',
                                             "optimizer/adamw.h": ""}, "worker is below optimizer"),
    ("an include of nothing", {"tools/a.c": '#include "tools/gone.h"\n'}, "names no source file"),
]
# The same, compiled (common/a.c is the translation unit).
COMPILED = [
    ("a cycle of two headers", {"common/a.c": '#include "a.h"\n', "common/a.h": '#ifndef A\n#define A\n#include "b.h"\n#endif\n',
                                "common/b.h": '#ifndef B\n#define B\n#include "a.h"\n#endif\n'}, "cycle between files"),
    ("shm including the worker", {"common/a.c": '#include "shm/b.h"\n', "shm/b.h": '#include "worker/c.h"\n',
                                  "worker/c.h": ""}, "shm is below worker"),
    ("a clean tree", {"common/a.c": '#include "a.h"\n', "common/a.h": ""}, None),
]
CLEAN = {"common/a.h": "", "shm/b.h": '#include "common/a.h"\n', "launcher/c.h": "",
         "launcher/c.c": '#include "shm/b.h"\n#include "c.h"\n'}


def run_self_test(cases, errors_of, prefix):
    """Writes each (what, tree, expected words or None for a clean tree) and checks errors_of(root)
    reports the defect, or nothing; prints one line each, returns whether all were seen."""
    ok = True
    for what, tree, expect in cases:
        with tempfile.TemporaryDirectory(prefix=prefix) as d:
            write_tree(d, tree)
            errors = errors_of(d)
        seen = any(expect in e for e in errors) if expect else not errors
        print(f"# self-test, {what}: {'seen' if expect and seen else 'clean' if seen else 'MISSED'}"
              + ("".join(f"\n#   {e}" for e in errors) if errors and not seen else ""))
        ok &= seen
    return ok


def compiler_errors(root):
    """graph_errors on what the compiler reports for root/compile_commands.json."""
    edges, errors = compiler_graph(root, os.path.join(root, "compile_commands.json"))
    return errors + graph_errors(sources(root), edges)


def self_test():
    """Fails unless every known defect is reported and a clean tree passes, by the #include lines
    and by the compiler."""
    ok = run_self_test(DEFECTS + [("a clean tree", CLEAN, None)], lambda d: check(d)[2], "include_graph.")
    compiled = [{"directory": ".", "command": "cc -I. -c common/a.c", "file": "common/a.c"}]
    cases = [(f"the compiler sees {what}", dict(tree, **{"compile_commands.json": ""}), expect)
             for what, tree, expect in COMPILED]
    for _, tree, _ in cases:
        tree["compile_commands.json"] = json.dumps(compiled)
    return run_self_test(cases, compiler_errors, "include_graph.") and ok


def main():
    if len(sys.argv) not in (2, 3):
        print("usage: include_graph.py SOURCE_ROOT [COMPILE_COMMANDS_JSON]", file=sys.stderr)
        return 2
    if not self_test():
        print("the checks missed a defect they must see")
        return 1
    root = sys.argv[1]
    files, edges, errors = check(root)
    print(f"{len(files)} source files, {sum(len(t) for t in edges.values())} includes between them")
    if len(sys.argv) == 3:
        # the same checks on what the compiler opens, which must be what the #include lines say
        cc_edges, cc_errors = compiler_graph(root, sys.argv[2])
        print(f"the compiler: {len(cc_edges)} files include others, {sum(len(t) for t in cc_edges.values())} includes")
        errors += cc_errors + [f"the compiler: {e}" for e in graph_errors(files, cc_edges)]
        for f, targets in sorted(cc_edges.items()):
            errors += [f"the compiler includes {t} from {f}, which its #include lines do not say"
                       for t in targets if t not in edges.get(f, [])]
    for e in errors:
        print(e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
