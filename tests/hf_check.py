"""Checks an HF directory exported by slidedp against transformers: the safetensors metadata is
{"format": "pt"}, a tied model does not store lm_head.weight, transformers loads every tensor, and
its forward logits on our tokens match the logits of slidedp's own forward pass.

    python3 tests/hf_check.py MODEL_DIR LOGITS.safetensors

LOGITS.safetensors holds "tokens" (int32 [B,T]) and "logits" (fp32 [B,T,V]). Exit 0 when the
normalised error ||ours - hf|| / ||hf|| is below 1e-2 (bf16 tolerance) and the checks pass, else 1.
"""

import json
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

TOLERANCE = 1e-2


def weight_files(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            return sorted(set(json.load(f)["weight_map"].values()))
    return ["model.safetensors"]


def check_files(model_dir):
    """Returns a list of problems with the directory's safetensors files."""
    problems, names = [], set()
    for name in weight_files(model_dir):
        with safe_open(os.path.join(model_dir, name), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != "pt":
                problems.append(f"{name}: __metadata__ format is {meta.get('format')!r}, expected 'pt'")
            names.update(f.keys())
    config = AutoConfig.from_pretrained(model_dir)
    if config.tie_word_embeddings and "lm_head.weight" in names:
        problems.append("tied model stores lm_head.weight")
    return problems


def main():
    if len(sys.argv) != 3:
        print("usage: python3 tests/hf_check.py MODEL_DIR LOGITS.safetensors", file=sys.stderr)
        return 2
    model_dir, logits_path = sys.argv[1], sys.argv[2]
    problems = check_files(model_dir)

    model, info = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    model.eval()
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        if info.get(key):
            problems.append(f"transformers reports {key}: {sorted(map(str, info[key]))}")

    data = load_file(logits_path)
    tokens, ours = data["tokens"].long(), data["logits"].float()
    with torch.no_grad():
        hf = model(input_ids=tokens, use_cache=False).logits.float()
    if hf.shape != ours.shape:
        problems.append(f"logits shape {tuple(ours.shape)}, transformers gives {tuple(hf.shape)}")
    else:
        diff = ours - hf
        max_abs = diff.abs().max().item()
        nerr = (diff.norm() / hf.norm()).item()
        agree = (ours.argmax(-1) == hf.argmax(-1)).float().mean().item()
        print(f"hf_check: {model_dir}: logits {tuple(hf.shape)}, max abs diff {max_abs:.3e}, "
              f"normalised error {nerr:.3e} (tolerance {TOLERANCE:g}), argmax agrees on {100 * agree:.1f}%")
        if not nerr < TOLERANCE:
            problems.append(f"normalised error {nerr:.3e} is not below {TOLERANCE:g}")
    for p in problems:
        print(f"hf_check: FAIL: {p}")
    print("hf_check: " + ("FAIL" if problems else "OK"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
