#!/usr/bin/python3
"""final/ and every step-S/ checkpoint carry the model directory's tokenizer and generation files
byte for byte (DESIGN §12), so the export loads with its tokenizer: the exported directory's
tokenizer, loaded by HF's tokenizers.js (npm `@huggingface/tokenizers`), encodes strings to the
ids HF's Rust tokenizers give on the source directory. A tiny random-init model with Qwen3's
vocabulary (examples/sft/config.json) trains 2 steps on one CPU worker, seed 1234."""
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokutil  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("SD_SOURCE", ".")
LAUNCH = os.path.join(tokutil.BUILD, "slidedp-launch")
# Written into the model directory beside the real tokenizer files; the export must copy them too.
EXTRA_FILES = {
    "generation_config.json": '{\n  "bos_token_id": 151643,\n  "do_sample": true,\n  "eos_token_id": [151645, '
                              '151643],\n  "temperature": 0.6,\n  "top_p": 0.95\n}\n',
    "special_tokens_map.json": '{"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}\n',
}
COPIED = ["tokenizer.json", "tokenizer_config.json"] + sorted(EXTRA_FILES)
JOB = """[model]
path = {model}
init = random
[data]
train = {train}
seq_len = 32
[train]
steps = 2
lr = 1e-3
seed = 1234
[checkpoint]
dir = {ckpt}
every = 1
keep = 2
[runtime]
device = cpu
gpus = 1
[log]
dir = {log}
"""


def encode(model, texts, scratch, name):
    with open(os.path.join(scratch, name + ".in.json"), "w") as f:
        json.dump(texts, f)
    subprocess.run(["node", os.path.join(HERE, "ref_encode.mjs"), os.path.abspath(tokutil.NODE_MODULES), model,
                    os.path.join(scratch, name + ".in.json"), os.path.join(scratch, name + ".out.json")], check=True)
    return json.load(open(os.path.join(scratch, name + ".out.json")))


def main():
    scratch = tempfile.mkdtemp(prefix="sd_export_tok_")
    failures = 0

    def check(ok, what):
        nonlocal failures
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        failures += not ok

    try:
        model = tokutil.model_dir(scratch, "qwen3")
        shutil.copy(os.path.join(SOURCE, "examples", "sft", "config.json"), model)
        for name, text in EXTRA_FILES.items():
            with open(os.path.join(model, name), "w") as f:
                f.write(text)
        with open(os.path.join(scratch, "in.jsonl"), "w") as f:
            for i in range(16):
                f.write(json.dumps({"text": f"example {i}: " + "the quick brown fox " * (i % 4 + 1)}) + "\n")
        tokutil.run_tokenize(["--model", model, "--in", os.path.join(scratch, "in.jsonl"), "--out",
                              os.path.join(scratch, "train.bin"), "--pack", "32", "--overflow", "truncate"])
        ckpt = os.path.join(scratch, "ckpt")
        ini = os.path.join(scratch, "job.ini")
        with open(ini, "w") as f:
            f.write(JOB.format(model=model, train=os.path.join(scratch, "train.bin"), ckpt=ckpt,
                               log=os.path.join(scratch, "log")))
        p = subprocess.run([LAUNCH, ini], capture_output=True, text=True)
        check(p.returncode == 0, f"slidedp-launch exits 0 (got {p.returncode})")
        if p.returncode != 0:
            print(p.stdout + p.stderr)
            sys.exit(1)
        for sub in ("final", "step-1", "step-2"):
            d = os.path.join(ckpt, sub)
            same = [f for f in COPIED if os.path.exists(os.path.join(d, f))
                    and filecmp.cmp(os.path.join(model, f), os.path.join(d, f), shallow=False)]
            check(same == COPIED, f"{sub}/ holds {', '.join(COPIED)} byte-identical to the model directory "
                                  f"(identical: {', '.join(same) or 'none'})")
        texts = ["Hello, world!", "<|im_start|>user\nHallo, Welt! 你好 🤗<|im_end|>\n",
                 "def f(x):\n    return x ** 2  # 平方\n", "  multiple   spaces\t\ttabs\n\n", "Ünïcödé — ‘quotes’ 🚀🚀"]
        src = encode(model, texts, scratch, "source")
        exported = encode(os.path.join(ckpt, "final"), texts, scratch, "final")
        same = sum(s["rust"] == e["js"] for s, e in zip(src, exported))
        check(same == len(texts), f"final/'s tokenizer (tokenizers.js) encodes {same}/{len(texts)} strings to the "
                                  f"source's ids (Rust tokenizers)")
    finally:
        shutil.rmtree(scratch)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
