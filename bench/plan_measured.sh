#!/usr/bin/env bash
# slidedp-plan's prediction, for the H200 host examples/h200-host.json describes, of each step time
# docs/performance.md (and issue 32) measured on a GPU host, beside the measurement: what a change of
# the cost model does to the documented rows. No GPU needed; from the repo root after `make build`
# (BUILD=dir for another build). The measured runs came from different hosts and trees (their
# sections say which), so the errors mix the model's with the hosts' spread (up to 1.7x for one plan).
# Runs measured before runtime.deterministic became the default (3df67b0: §2 and §4) are priced
# with runtime.deterministic=false, as they ran (cuDNN's attention backward).
set -euo pipefail
plan=${BUILD:-build}/slidedp-plan
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the bench job's data: random Qwen3 token ids as an llm.c v7 shard (no document starts: whole windows)
python3 - "$tmp/train.bin" <<'PY'
import random, struct, sys
n, r = 200000, random.Random(0)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240801, 7, n, *[0] * 253))
    f.write(struct.pack(f"<{n}I", *(r.randrange(151936) for _ in range(n))))
PY
B=(bench/qwen3-1.7b.ini "data.train=$tmp/train.bin")
k1="runtime.optim_procs=1 runtime.optim_threads=14"
# gpu_offload.sh's runs: every weight resident, and the bf16 copy (the only source then)
off="runtime.chunk_buffers=30 runtime.weights_source=bf16_copy runtime.deterministic=false"
g8="model.path=examples/qwen3-8b runtime.grad_dtype=bf16"
printf "%-44s %8s %9s %7s  %s\n" run measured predicted error plan
row() { # NAME MEASURED OVERRIDES...
    local name=$1 measured=$2
    shift 2
    "$plan" --host-calib examples/h200-host.json "${B[@]}" "$@" --json 2> /dev/null |
        python3 -c "
import json, sys
d = json.load(sys.stdin); p = d['plan']; t = d['predicted']['step_s']; m = float(sys.argv[2])
err = f'{100 * (t / m - 1):+6.1f}%' if m > 0 else '      -'
print(f\"{sys.argv[1]:44} {sys.argv[2]:>8} {t:9.4f} {err}  {p['weights_source']} {p['update_mode']} \"
      f\"{p['optim_procs']}x{p['optim_threads']}, {p['layers_per_chunk']} layer(s) x {p['chunk_buffers']} buffers\")
" "$name" "$measured"
}
# issue 32: Qwen3-1.7B, 8k, bf16 gradients, one call
row "issue 32: master after, 1x15, no clipping" 0.636 runtime.grad_dtype=bf16 train.grad_clip=0 \
    runtime.weights_source=master
row "issue 32: during the backward, 1x14" 0.548 runtime.grad_dtype=bf16 train.grad_clip=0 \
    runtime.update_mode=during_backward $k1
row "issue 32: auto, clipping" 0.690 runtime.grad_dtype=bf16
row "issue 32: auto, no clipping (not measured)" 0 runtime.grad_dtype=bf16 train.grad_clip=0
# §2.1 (gpu_offload.sh, 1x14, all resident, fp32 gradients)
row "§2.1 8k, clipping" 0.729 $off $k1
row "§2.1 8k, no clipping, during" 0.614 $off $k1 train.grad_clip=0 runtime.update_mode=during_backward
row "§2.1 64k (2x4096x8), clipping" 1.939 $off $k1 train.grad_accum=8
row "§2.1 64k (2x4096x8), no clipping, during" 1.854 $off $k1 train.grad_accum=8 train.grad_clip=0 \
    runtime.update_mode=during_backward
row "§2.1 64k (8x4096x2), no clipping, during" 1.587 $off $k1 train.micro_batch=8 train.grad_accum=2 \
    train.grad_clip=0 runtime.update_mode=during_backward
# §2.2 (another host, one call)
row "§2.2 8k, no clipping, fp32 gradients" 0.568 $off $k1 train.grad_clip=0 runtime.update_mode=during_backward
row "§2.2 8k, no clipping, bf16 gradients" 0.530 $off $k1 train.grad_clip=0 runtime.update_mode=during_backward \
    runtime.grad_dtype=bf16
# §2.3 Qwen3-4B in 24 GiB (gpu_offload.sh's 4 x 4 optimizer threads)
row "§2.3 Qwen3-4B, 24 GiB" 1.50 model.path=examples/qwen3-4b runtime.gpu_mem=24G runtime.weights_source=bf16_copy \
    runtime.optim_procs=4 runtime.optim_threads=4 runtime.deterministic=false
# §4.1 (gpu_planner.sh: clipping, fp32 gradients, the copy)
for mem in auto 24G; do
    for mb in 1 2 4; do
        m=$(case $mem$mb in auto1) echo 0.731 ;; auto2) echo 0.804 ;; auto4) echo 0.819 ;; 24G1) echo 0.728 ;;
            24G2) echo 0.682 ;; 24G4) echo 0.835 ;; esac)
        row "§4.1 micro-batch $mb, gpu_mem $mem" "$m" train.micro_batch=$mb runtime.gpu_mem=$mem \
            runtime.weights_source=bf16_copy runtime.deterministic=false
    done
done
c24="runtime.gpu_mem=24G runtime.weights_source=bf16_copy runtime.deterministic=false"
row "§4.1 alt: chunk_buffers = 3" 0.836 $c24 runtime.chunk_buffers=3
row "§4.1 alt: activations = recompute" 0.848 $c24 runtime.activations=recompute
row "§4.1 alt: 1x14 optimizer threads" 0.799 $c24 $k1
row "§4.1 alt: layers_per_chunk = 4" 0.850 $c24 runtime.layers_per_chunk=4
# §8 (gpu_host_state.sh, one call; bf16 gradients on 8B, fp32 on 1.7B)
row "§8 8B 8k, master, fp32 state" 2.962 $g8 runtime.weights_source=master
row "§8 8B 8k, master, bf16 state" 2.836 $g8 train.optimizer_state=bf16
row "§8 8B 8k, gpu_mem 24G, master" 3.219 $g8 runtime.gpu_mem=24G runtime.weights_source=master
row "§8 8B 64k, master, fp32 state" 8.731 $g8 train.grad_accum=8 runtime.weights_source=master
row "§8 8B 64k, master, bf16 state" 8.676 $g8 train.grad_accum=8 train.optimizer_state=bf16
row "§8 1.7B 8k, the copy (code before)" 0.675 runtime.weights_source=bf16_copy
row "§8 1.7B 8k, master, fp32 state" 0.672 runtime.weights_source=master
row "§8 1.7B 8k, master, bf16 state" 0.602 train.optimizer_state=bf16
# issue 31 (one call; the bench job as it is, auto plans, clipping, fp32 gradients; deterministic by default)
nd=runtime.deterministic=false
row "issue 31: 64k (8x4096x2)" 2.156 train.micro_batch=8 train.grad_accum=2
row "issue 31: 64k (8x4096x2), not deterministic" 1.913 train.micro_batch=8 train.grad_accum=2 $nd
row "issue 31: 64k (2x4096x8)" 2.265 train.grad_accum=8
row "issue 31: 8k (2x4096)" 0.690
row "issue 31: 8k (2x4096), not deterministic" 0.690 $nd
row "issue 31: one 32K sequence" 2.417 train.micro_batch=1 data.seq_len=32768
row "issue 31: 32K, not deterministic (1.64-1.82 s)" 1.64 train.micro_batch=1 data.seq_len=32768 $nd
row "issue 31: one 131K sequence" 32.69 train.micro_batch=1 data.seq_len=131072
