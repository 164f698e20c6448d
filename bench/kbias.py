"""Update directions of a Qwen2-style model (q/k/v biases) trained by slidedp's CUDA backend, by
PyTorch under bf16 autocast, and by PyTorch in fp32 (the reference; TF32 off), from the same initial
weights, data order and AdamW as slidedp's job (docs/design.md §2.3, §9). Prints, per tensor, the cosine of
each run's update (final - initial weights) with the reference's; k_proj.bias rows are marked.
Used by bench/gpu_kbias.sh on a GPU host:

    python3 bench/kbias.py --make DIR        # DIR/model (random Qwen2-style), DIR/train.bin, DIR/job.ini
    python3 bench/kbias.py JOB_INI OURS_FINAL_DIR [REF64.safetensors]

JOB_INI is the job slidedp ran (one rank, cosine schedule, no clipping); OURS_FINAL_DIR its fp32
export. REF64: a parity fixture's float64 reference (final.<name>), compared too.
"""

import configparser
import glob
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def lr_at(step, t):
    if step <= t["warmup"] and t["warmup"] > 0:
        return t["lr"] * step / t["warmup"]
    if t["steps"] == t["warmup"]:
        return t["lr"]
    p = (step - t["warmup"]) / (t["steps"] - t["warmup"])
    lo = t["lr"] * t["min_lr_ratio"]
    return lo + 0.5 * (t["lr"] - lo) * (1 + math.cos(math.pi * p))


def read_tokens(path):
    header = np.fromfile(path, dtype="<i4", count=256)
    dtype = "<u2" if header[0] == 20240520 else "<u4"
    return torch.from_numpy(np.fromfile(path, dtype=dtype, offset=1024, count=int(header[2])).astype(np.int64))


def train(model_dir, tokens, t, autocast):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").cuda()
    names = [n for n, _ in model.named_parameters()]
    params = dict(model.named_parameters())
    init = {n: p.detach().clone() for n, p in params.items()}
    opt = torch.optim.AdamW(
        [{"params": [params[n] for n in names if params[n].dim() >= 2], "weight_decay": t["weight_decay"]},
         {"params": [params[n] for n in names if params[n].dim() < 2], "weight_decay": 0.0}],
        lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["eps"], foreach=False)
    T, mb, A = t["seq_len"], t["micro_batch"], t["grad_accum"]
    nseq = (len(tokens) - 1) // T
    data = tokens.cuda()
    vocab = model.config.vocab_size
    for s in range(1, t["steps"] + 1):
        opt.zero_grad(set_to_none=True)
        for a in range(A):
            ks = [(((s - 1) * A + a) * mb + i) % nseq for i in range(mb)]
            x = torch.stack([data[k * T:k * T + T] for k in ks])
            y = torch.stack([data[k * T + 1:k * T + T + 1] for k in ks])
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                logits = model(input_ids=x, use_cache=False).logits
            ce = F.cross_entropy(logits.float().reshape(-1, vocab), y.reshape(-1), reduction="sum")
            (ce / (A * mb * T)).backward()
        for group in opt.param_groups:
            group["lr"] = lr_at(s, t)
        opt.step()
    return init, {n: params[n].detach().clone() for n in names}


def cos(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    d = a.norm() * b.norm()
    return float((a @ b) / d) if d > 0 else float("nan")


def read_job(path):
    """The job's model dir, data file and training settings (slidedp's defaults where unset)."""
    ini = configparser.ConfigParser(inline_comment_prefixes=(";",))
    ini.read(path)
    base = os.path.dirname(os.path.abspath(path))
    get = lambda sec, key, default: ini.get(sec, key, fallback=default)
    t = {k: float(get("train", k, d)) for k, d in (("lr", 1e-5), ("min_lr_ratio", 0.1), ("weight_decay", 0.0),
                                                   ("beta1", 0.9), ("beta2", 0.95), ("eps", 1e-8))}
    t.update({k: int(get(s, k, d)) for s, k, d in (("data", "seq_len", 4096), ("train", "micro_batch", 1),
                                                   ("train", "grad_accum", 1), ("train", "steps", 1000),
                                                   ("train", "warmup", 0))})
    assert get("train", "schedule", "cosine") == "cosine" and float(get("train", "grad_clip", 1.0)) == 0, path
    assert int(get("runtime", "gpus", 1)) == 1, path
    return os.path.join(base, get("model", "path", "")), os.path.join(base, get("data", "train", "")), t


def make(d):
    """A Qwen2-style model bigger than the fixture (HF init: biases start at zero), random tokens, a job."""
    from transformers import Qwen2Config
    cfg = Qwen2Config(vocab_size=4096, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2048,
                      rope_theta=1e6, tie_word_embeddings=False)
    torch.manual_seed(18)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(os.path.join(d, "model"))
    n = 64 * 512 + 1
    header = np.zeros(256, dtype="<i4")
    header[:3] = (20240801, 7, n)
    tokens = np.random.default_rng(18).integers(0, 4096, size=n, dtype=np.uint32)
    with open(os.path.join(d, "train.bin"), "wb") as f:
        f.write(header.tobytes() + tokens.tobytes())
    with open(os.path.join(d, "job.ini"), "w") as f:
        f.write("[model]\npath = model\n[data]\ntrain = train.bin\nseq_len = 512\n[train]\nmicro_batch = 4\n"
                "grad_accum = 2\nsteps = 6\nlr = 1e-4\nwarmup = 2\nweight_decay = 0.1\ngrad_clip = 0\n"
                "[checkpoint]\ndir = ckpt\nexport_dtype = fp32\n[runtime]\ndevice = cuda\n[log]\ndir = log\n")


def main():
    if sys.argv[1] == "--make":
        make(sys.argv[2])
        return
    model_dir, train_bin, t = read_job(sys.argv[1])
    ours_dir = sys.argv[2]
    ref64 = load_file(sys.argv[3]) if len(sys.argv) > 3 else None
    tokens = read_tokens(train_bin)
    init, fp32 = train(model_dir, tokens, t, autocast=False)
    _, amp = train(model_dir, tokens, t, autocast=True)
    ours = {}
    for f in sorted(glob.glob(ours_dir + "/*.safetensors")):
        ours.update(load_file(f, device="cuda"))
    cols = ["ours", "torch bf16"] + (["fp64 ref"] if ref64 else [])
    print(f"{sys.argv[1]}: update-direction cosine with the fp32 PyTorch reference ({t['steps']} steps)")
    print(f"| {'tensor':44} | " + " | ".join(f"{c:>10}" for c in cols) + " |")
    print(f"|{'-' * 46}|" + "|".join("-" * 12 for _ in cols) + "|")
    worst = {c: (2.0, "") for c in cols}
    for n in init:
        d_ref = fp32[n] - init[n]
        row = [cos(ours[n].float() - init[n], d_ref), cos(amp[n] - init[n], d_ref)]
        if ref64:
            row.append(cos(ref64["final." + n].cuda() - init[n], d_ref))
        for c, v in zip(cols, row):
            if v < worst[c][0]:
                worst[c] = (v, n)
        mark = "  <- k_proj.bias" if n.endswith("k_proj.bias") else ""
        print(f"| {n:44} | " + " | ".join(f"{v:10.4f}" for v in row) + f" |{mark}")
    for c in cols:
        print(f"lowest cosine, {c}: {worst[c][0]:.4f} ({worst[c][1]})")


if __name__ == "__main__":
    main()
