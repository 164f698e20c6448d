#!/usr/bin/env python3
"""The include graph, read from the sources' #include "..." lines (docs/design.md §1.1): no include
cycle between files, none between file names either (two headers of one name would make one), no two
headers of one name, and no include from a lower layer to a higher one
(common -> ingest; common -> shm -> monitor; shm -> worker and optimizer -> planner and tools -> launcher;
tests and bench above all).
Usage: include_graph.py SOURCE_ROOT. It first runs the same checks on small trees it writes with a
known defect each, and fails if any defect goes unseen."""
import os
import re
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
    return files, edges, errors


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
CLEAN = {"common/a.h": "", "shm/b.h": '#include "common/a.h"\n', "launcher/c.h": "",
         "launcher/c.c": '#include "shm/b.h"\n#include "c.h"\n'}


def self_test():
    """Fails unless every known defect is reported and a clean tree passes."""
    ok = True
    for what, tree, expect in DEFECTS + [("a clean tree", CLEAN, None)]:
        with tempfile.TemporaryDirectory(prefix="include_graph.") as d:
            write_tree(d, tree)
            _, _, errors = check(d)
        seen = any(expect in e for e in errors) if expect else not errors
        print(f"# self-test, {what}: {'seen' if expect and seen else 'clean' if seen else 'MISSED'}"
              + ("".join(f"\n#   {e}" for e in errors) if errors and not seen else ""))
        ok &= seen
    return ok


def main():
    if len(sys.argv) != 2:
        print("usage: include_graph.py SOURCE_ROOT", file=sys.stderr)
        return 2
    if not self_test():
        print("the checks missed a defect they must see")
        return 1
    files, edges, errors = check(sys.argv[1])
    print(f"{len(files)} source files, {sum(len(t) for t in edges.values())} includes between them")
    for e in errors:
        print(e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
