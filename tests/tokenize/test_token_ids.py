#!/usr/bin/python3
"""Token-id exactness: `slidedp-data tokenize --format text` against HF's Rust tokenizers (npm
`tokenizers`) and tokenizers.js (npm `@huggingface/tokenizers`) on the real Qwen3, Llama 3 and
Llama 3.1 tokenizer files, about 5,400 strings each (tests/tokenize/strings.py). Each document
must be the reference ids (with the post-processor's BOS where the tokenizer has one) + EOS."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import strings  # noqa: E402
import tokutil  # noqa: E402

SEEDS = {"qwen3": 1701, "llama3": 1702, "llama3_1": 1703}
HERE = os.path.dirname(os.path.abspath(__file__))


def check_family(scratch, family, seed):
    d = tokutil.model_dir(scratch, family)
    tok = json.load(open(os.path.join(d, "tokenizer.json")))
    eos = json.load(open(os.path.join(d, "tokenizer_config.json")))["eos_token"]
    eos_id = next(a["id"] for a in tok["added_tokens"] if a["content"] == eos)
    texts = strings.make(seed, [a["content"] for a in tok["added_tokens"]])
    print(f"{family}: {len(texts)} strings, seed {seed}", flush=True)
    with open(os.path.join(scratch, "strings.json"), "w") as f:
        json.dump(texts, f)
    with open(os.path.join(scratch, "in.jsonl"), "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    subprocess.run(["node", os.path.join(HERE, "ref_encode.mjs"), os.path.abspath(tokutil.NODE_MODULES), d,
                    os.path.join(scratch, "strings.json"), os.path.join(scratch, "ref.json")], check=True)
    ref = json.load(open(os.path.join(scratch, "ref.json")))
    out = os.path.join(scratch, "out.bin")
    tokutil.run_tokenize(["--model", d, "--in", os.path.join(scratch, "in.jsonl"), "--out", out,
                          "--format", "text", "--threads", "2"])
    docs = tokutil.documents(*tokutil.read_shard(out))
    assert len(docs) == len(texts), (len(docs), len(texts))
    bad = {"rust": 0, "js": 0}
    for i, (text, r, (ids, _)) in enumerate(zip(texts, ref, docs)):
        for lib in ("rust", "js"):
            if ids != r[lib] + [eos_id]:
                bad[lib] += 1
                if bad[lib] <= 5:
                    print(f"  MISMATCH {lib} #{i} {text!r}\n    ours {ids[:-1]}\n    ref  {r[lib]}")
    print(f"{family}: {len(texts) - bad['rust']}/{len(texts)} identical to tokenizers (Rust), "
          f"{len(texts) - bad['js']}/{len(texts)} to tokenizers.js", flush=True)
    return bad["rust"] + bad["js"]


def main():
    scratch = tempfile.mkdtemp(prefix="sd_token_ids_")
    try:
        failures = sum(check_family(scratch, fam, seed) for fam, seed in SEEDS.items())
    finally:
        shutil.rmtree(scratch)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
