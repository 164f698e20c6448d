#!/usr/bin/env python3
"""PyTorch references for the kernel benchmarks on the GPU host: scaled_dot_product_attention (causal, GQA,
bf16) forward and forward+backward at the shapes of bench_attention, and one transformers
Qwen3DecoderLayer (sdpa, bf16) forward+backward at the shape of bench_layer. Timed with CUDA
events, warm-up then the median of repeats; prints RESULT lines that bench/gpu_parity.sh reads."""
import statistics

import torch
import torch.nn.functional as F


def median_ms(fn, warm=3, reps=20):
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def attention(B, T, Hq=16, Hkv=8, D=128):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, Hq, T, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    k = torch.randn(B, Hkv, T, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    v = torch.randn(B, Hkv, T, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    dout = torch.randn(B, Hq, T, D, device="cuda", dtype=torch.bfloat16, generator=g)
    reps = 5 if T >= 16384 else 20

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    def fwd_bwd():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        torch.autograd.grad(out, (q, k, v), dout)

    flops_f = 4.0 * B * Hq * T * T * D / 2
    t_f = median_ms(fwd, reps=reps)
    t_fb = median_ms(fwd_bwd, reps=reps)
    print(f"torch sdpa B={B} T={T} Hq={Hq} Hkv={Hkv} D={D} causal: fwd {t_f:.3f} ms {flops_f / t_f * 1e-9:.1f} TFLOP/s"
          f" | fwd+bwd {t_fb:.3f} ms {3.5 * flops_f / t_fb * 1e-9:.1f} TFLOP/s")
    print(f"RESULT torch_attention_fwd_B{B}_T{T} {flops_f / t_f * 1e-9:.1f}")
    print(f"RESULT torch_attention_fwdbwd_B{B}_T{T} {3.5 * flops_f / t_fb * 1e-9:.1f}")


def layer(B=2, T=4096):
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RotaryEmbedding

    cfg = Qwen3Config(hidden_size=2048, intermediate_size=6144, num_attention_heads=16, num_key_value_heads=8,
                      head_dim=128, num_hidden_layers=1, vocab_size=256, max_position_embeddings=40960,
                      rope_theta=1e6, rms_norm_eps=1e-6)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    lyr = Qwen3DecoderLayer(cfg, layer_idx=0).cuda().to(torch.bfloat16)
    rot = Qwen3RotaryEmbedding(cfg).cuda()
    x = torch.randn(B, T, 2048, device="cuda", dtype=torch.bfloat16).requires_grad_()
    pos = torch.arange(T, device="cuda")[None].expand(B, -1)
    cos, sin = rot(x, pos)
    dout = torch.randn_like(x)

    def step():
        out = lyr(x, attention_mask=None, position_ids=pos, position_embeddings=(cos, sin))
        out = out[0] if isinstance(out, tuple) else out
        out.backward(dout)

    t = median_ms(step)
    print(f"torch Qwen3DecoderLayer (sdpa, bf16) B={B} T={T} fwd+bwd {t:.3f} ms")
    print(f"RESULT torch_layer_ms {t:.3f}")


if __name__ == "__main__":
    print("torch", torch.__version__, torch.cuda.get_device_name())
    attention(2, 4096)
    attention(1, 32768)
    layer()
