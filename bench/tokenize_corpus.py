#!/usr/bin/python3
"""Builds the tokenizer benchmark's corpus (bench/tokenize_speed.sh): real text from Debian's
linux-source-6.1 package (the kernel's documentation and C sources, in the tarball's order),
cut at blank lines into documents of at most 8 KiB, until MIB mebibytes. Writes
OUT.jsonl ({"text": ...} per line, for slidedp-data tokenize --format text) and OUT.json (a JSON
list of the same strings, for npm tokenizers' encodeBatch).
usage: tokenize_corpus.py LINUX_SOURCE_TAR_XZ MIB OUT"""
import json
import sys
import tarfile

MAX_DOC = 8192


def documents(tar):
    for m in tar:  # in archive order: the xz stream is read once, front to back
        if not m.isfile() or not ("/Documentation/" in m.name or m.name.endswith((".c", ".h"))):
            continue
        text = tar.extractfile(m).read().decode("utf-8", errors="replace").replace("\x00", "")
        doc = ""
        for para in text.split("\n\n"):
            if doc and len(doc) + len(para) + 2 > MAX_DOC:
                yield doc
                doc = ""
            doc = doc + "\n\n" + para if doc else para
        if doc.strip():
            yield doc


def main():
    src, mib, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    limit, total, strings = mib << 20, 0, []
    with tarfile.open(src, "r|xz") as tar, open(out + ".jsonl", "w") as jl:
        for doc in documents(tar):
            jl.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
            strings.append(doc)
            total += len(doc.encode())
            if total >= limit:
                break
    with open(out + ".json", "w") as f:
        json.dump(strings, f, ensure_ascii=False)
    print(f"corpus: {len(strings)} documents, {total / 2**20:.1f} MiB of UTF-8 text from {src}")


if __name__ == "__main__":
    main()
