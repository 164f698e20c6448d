#!/usr/bin/env python3
"""The call graph across files (docs/design.md §1.1), from cscope: no cycle of calls between
files anywhere in the tree. A node is a file without its extension (foo.c with foo.h, whose static
inline functions it holds); an edge A -> B says a function of A calls a function that B defines.
Calls through function pointers (the backend's ops, model_io) are not edges: an interface is how a
lower file reaches a higher one without knowing it.
Usage: call_graph.py SOURCE_ROOT [--show FOLDER] (--show prints FOLDER's file-level edges with the
functions behind each). Without cscope (`make deps` installs it) it says so and skips (exit 77).
It first runs the same check on small trees it writes with a known defect each."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from include_graph import find_cycle, run_self_test, sources  # noqa: E402

SKIP_EXIT = 77  # meson's "skipped"


def module(path):
    return os.path.splitext(path)[0]


def is_static(lines, lineno, name):
    """Whether the definition at lineno (1-based) is static: the words before the name on its line,
    or the line before when the name starts the line."""
    text = lines[lineno - 1] if 0 < lineno <= len(lines) else ""
    at = re.search(rf"\b{re.escape(name)}\s*\(", text)
    head = text[:at.start()] if at else text
    if not head.strip() and lineno >= 2:
        head = lines[lineno - 2]
    return re.search(r"\bstatic\b", head) is not None


def without_attributes(text):
    """text with each __attribute__((...)) blanked (newlines kept, so line numbers stay)."""
    out, at = [], 0
    for m in re.finditer(r"__attribute__\s*\(", text):
        if m.start() < at:
            continue
        depth, i = 0, m.end() - 1
        while i < len(text):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
            if depth == 0:
                break
        out += [text[at:m.start()], re.sub(r"[^\n]", " ", text[m.start():i])]
        at = i
    return "".join(out) + text[at:]


def read_files(root, files):
    """{file: (definitions, calls)}: the functions the file defines ({name: is_static}) and the
    names each calls ({caller: set of callees}), from cscope's cross-reference (built uncompressed,
    -c, so that it reads as text: a line number starts each source line; a tab and a mark flag a
    symbol: @ a file, $ a function defined, ` a function called, } a function's end)."""
    with tempfile.TemporaryDirectory(prefix="call_graph.") as d:
        for f in files:  # copies without attributes, which cscope takes for calls or definitions
            with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
                text = without_attributes(fh.read())
            os.makedirs(os.path.join(d, os.path.dirname(f)), exist_ok=True)
            with open(os.path.join(d, f), "w") as fh:
                fh.write(text)
        with open(os.path.join(d, "files"), "w") as fh:
            fh.write("".join(f"{f}\n" for f in files))
        subprocess.run(["cscope", "-b", "-c", "-k", "-i", "files", "-f", "cscope.out"], cwd=d, check=True)
        with open(os.path.join(d, "cscope.out"), encoding="utf-8", errors="replace") as fh:
            text = fh.read().split("\n")
    out, path, lines, caller, lineno = {}, None, [], None, 0
    for raw in text:
        n = re.match(r"^(\d+) ", raw)
        if n:
            lineno = int(n[1])
        if not raw.startswith("\t") or len(raw) < 2:
            continue
        mark, name = raw[1], raw[2:]
        if mark == "@":
            path, caller = (name or None), None
            if path:
                with open(os.path.join(root, path), encoding="utf-8", errors="replace") as fh:
                    lines = fh.read().split("\n")
                out[path] = ({}, {})
        elif mark == "$" and path:
            caller = name
            out[path][0][name] = is_static(lines, lineno, name)
        elif mark == "`" and path and caller:
            out[path][1].setdefault(caller, set()).add(name)
        elif mark == "}":
            caller = None
    return out


def read_graph(root, files):
    """File-level edges {module: {module: [(caller, callee), ...]}} and notes on names several
    files define."""
    per_file = read_files(root, files)
    owners = {}  # name -> modules defining it for others to call (global, or inline in a header)
    for f, (defs, _) in per_file.items():
        header = f.endswith((".h", ".cuh"))
        for name, static in defs.items():
            if header or not static:
                owners.setdefault(name, set()).add(module(f))
    edges, notes = {module(f): {} for f in files}, []
    for f, (defs, calls) in sorted(per_file.items()):
        me = module(f)
        for caller, callees in sorted(calls.items()):
            for callee in sorted(callees - set(defs)):
                targets = owners.get(callee, set()) - {me}
                if len(targets) > 1:
                    # a name each program defines once (main, a backend's entry): the one in the
                    # caller's own folder, else every one of them
                    near = {t for t in targets if os.path.dirname(t) == os.path.dirname(me)}
                    notes.append(f"{f}: {callee} is defined in {', '.join(sorted(targets))}")
                    targets = near or targets
                for t in targets:
                    edges[me].setdefault(t, []).append((caller, callee))
    return edges, notes


def check(root):
    files = sources(root)
    edges, notes = read_graph(root, files)
    errors = []
    cycle = find_cycle({m: sorted(t) for m, t in edges.items()})
    if cycle:
        steps = []
        for a, b in zip(cycle, cycle[1:]):
            caller, callee = edges[a][b][0]
            steps.append(f"{a} ({caller} calls {callee}) -> {b}")
        errors.append("call cycle between files: " + "; ".join(steps))
    return files, edges, notes, errors


DEFECTS = [
    ("two files calling each other",
     {"worker/a.c": "void a(void) { b(); }\nvoid a2(void) {}\n", "worker/b.c": "void b(void) { a2(); }\n"},
     "call cycle between files"),
    ("a cycle of three files",
     {"shm/a.c": "void a(void) { b(); }\n", "shm/b.c": "void b(void) { c(); }\n", "shm/c.c": "void c(void) { a(); }\n"},
     "call cycle between files"),
    ("a cycle closed by a header's inline function",
     {"common/x.h": "static inline void xi(void) { y(); }\n", "common/y.c": "void y(void) {}\nvoid y2(void) { xi(); }\n"},
     "call cycle between files"),
]
CLEAN = {"common/a.c": "void a(void) {}\nstatic void b(void) { a(); }\n",
         "shm/b.c": "static void b(void) {}\nvoid c(void) { a(); b(); }\n",
         "worker/c.c": "static void a(void) {}\nvoid d(void) { c(); a(); }\n"}


def self_test():
    cases = DEFECTS + [("a clean tree (static functions of one name in several files)", CLEAN, None)]
    return run_self_test(cases, lambda d: check(d)[3], "call_graph.")


def show(edges, folder):
    """The file-level edges among files of folder, with the functions behind each."""
    prefix = folder.rstrip("/") + "/"
    for a in sorted(m for m in edges if m.startswith(prefix)):
        for b, why in sorted(edges[a].items()):
            if b.startswith(prefix):
                names = sorted({callee for _, callee in why})
                print(f"{a} -> {b}: {', '.join(names)}")


def main():
    args = sys.argv[1:]
    folder = None
    if len(args) == 3 and args[1] == "--show":
        folder = args[2]
        args = args[:1]
    if len(args) != 1:
        print("usage: call_graph.py SOURCE_ROOT [--show FOLDER]", file=sys.stderr)
        return 2
    if not shutil.which("cscope"):
        print("cscope is not installed (`make deps` installs it, or apt-get install cscope): call graph not checked")
        return SKIP_EXIT
    if not self_test():
        print("the check missed a defect it must see")
        return 1
    files, edges, notes, errors = check(args[0])
    print(f"{len(files)} source files, {sum(len(t) for t in edges.values())} file-level call edges")
    for n in notes:
        print("# " + n)
    if folder:
        show(edges, folder)
    for e in errors:
        print(e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
