#!/bin/bash
# Host offload against its peer on a GPU host, from the repo root: the Qwen3-1.7B shape (random
# init, seq 4096) trained by slidedp at 8k tokens per step and at 64k (2 x 8 and 8 x 2 sequences),
# side by side with the PyTorch FSDP2 peer (CPUOffloadPolicy at 8k, GPU-resident at 64k), and the
# bounds measured in the same run (optimizer alone, PCIe alone, GPU compute alone); the Qwen3-4B
# shape in 24 GiB; the parity fixtures on CUDA against the CPU reference. Prints one table; logs in
# $OUT; results in docs/performance.md §2. Needs .gpudeps/ as bench/gpu_build.sh's header says,
# plus .gpudeps/torch_peer.py (a copy of the peer).
# ONLY="name ..." runs just those runs (names below, plus e2e, e2e_bf16 and dram: the optimizer
# benchmark beside the step's DMA traffic); NO_BOUNDS=1 skips the bounds; DEADLINE caps the call's seconds.
. bench/gpu_build.sh
peer=$deps/torch_peer.py
w=/tmp/offload
rm -rf "$w" && mkdir -p "$w"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
shm_at_least 60 100G
log "/dev/shm: $(df -h --output=size,avail /dev/shm | tail -1); cores $(nproc); $(nvidia-smi --query-gpu=name --format=csv,noheader)"

random_tokens "$w/train.bin" 2000000
# the shared job with every weight resident (30 buffers) and 4 optimizers x 4 threads; runs override these
bench_job "$w"
job_args+=(runtime.chunk_buffers=30 runtime.optim_procs=4 runtime.optim_threads=4)

# median step time of the steps after the first two, from metrics.jsonl
median() { python3 -c "import json,sys,statistics as st; x=[json.loads(l)['step_s'] for l in open(sys.argv[1])][2:]; print(f'{st.median(x):.4f}' if x else 'nan')" "$1"; }
# every run gets at most its limit and never runs past the call's deadline (DEADLINE seconds)
deadline=${DEADLINE:-570}
left() { local l=$((deadline - SECONDS)); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
# ONLY="name ..." runs just those (the bounds always run)
wanted() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }
ours() { # name, seconds, overrides...
    wanted "$1" || return 0
    local name=$1 limit=$(left $2); shift 2
    [ "$limit" -lt 20 ] && { log "$name: skipped (no time left)"; return; }
    rm -rf "$w/log" "$w/ckpt"
    timeout "$limit" "$build/slidedp-launch" "${job_args[@]}" "$@" > "$out/$name.log" 2>&1
    local rc=$?
    cp "$w/log/metrics.jsonl" "$out/$name.metrics.jsonl" 2>/dev/null
    local t=$(median "$w/log/metrics.jsonl" 2>/dev/null)
    echo "RESULT $name ${t:-nan}" >> "$out/results.log"
    log "$name: exit $rc, median step ${t:-nan} s"
    "$build/slidedp-launch" --clean "${job_args[@]}" "$@" > /dev/null 2>&1
}
peer() { # name, seconds, args...
    wanted "$1" || return 0
    local name=$1 limit=$(left $2); shift 2
    [ "$limit" -lt 20 ] && { log "$name: skipped (no time left)"; return; }
    timeout "$limit" python3 "$peer" "$@" > "$out/$name.log" 2>&1
    local t=$(peer_step "$out/$name.log")
    echo "RESULT $name ${t:-nan}" >> "$out/results.log"
    log "$name: median step ${t:-nan} s"
}
: > "$out/results.log"
k1="runtime.optim_procs=1 runtime.optim_threads=14"
ours slidedp_8k_k1 150 $k1
# as the peer trains: no clipping, so the update overlaps the backward
ours slidedp_8k_noclip 150 $k1 train.grad_clip=0 runtime.update_mode=during_backward
peer fsdp2_offload_8k 150 1.7b offload 4096 2 1 5
ours slidedp_64k 150 train.grad_accum=8 train.steps=4 $k1
peer fsdp2_gpu_64k 100 1.7b gpu 4096 2 8 4

# bounds: optimizer alone (the journaled AdamW; the faster of all cores and all but two, which is
# what the job leaves it), PCIe alone, GPU compute alone
if [ -z "${NO_BOUNDS:-}" ]; then
    : > "$out/bench_optim.log"
    for t in $(nproc) $(($(nproc) - 2)); do
        timeout $(left 40) "$build/bench_optim" 512 $t >> "$out/bench_optim.log" 2>&1
    done
    grep -v RESULT "$out/bench_optim.log" | tee -a "$out/summary.log"
    timeout $(left 40) python3 - > "$out/pcie.log" 2>&1 <<'PY'
import torch, time
n_in, n_out = 1_720_574_976 * 2, 1_720_574_976 * 4   # bf16 weights in, fp32 gradients out, per pass
h_in = torch.empty(n_in // 2, dtype=torch.bfloat16).pin_memory(); d_in = torch.empty_like(h_in, device="cuda")
h_out = torch.empty(n_out // 4, dtype=torch.float32).pin_memory(); d_out = torch.empty_like(h_out, device="cuda")
s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
for rep in range(3):
    torch.cuda.synchronize(); t = time.time()
    with torch.cuda.stream(s1): d_in.copy_(h_in, non_blocking=True)
    with torch.cuda.stream(s2): h_out.copy_(d_out, non_blocking=True)
    torch.cuda.synchronize(); both = time.time() - t
print(f"RESULT pcie_bound {both:.4f}")
print(f"H2D {n_in/1e9:.2f} GB + D2H {n_out/1e9:.2f} GB concurrently in {both:.3f} s")
PY
    cat "$out/pcie.log" | tee -a "$out/summary.log"
    timeout $(left 60) "$build/bench/bench_layer" > "$out/bench_layer.log" 2>&1
    grep -E 'RESULT|layer' "$out/bench_layer.log" | head -5 | tee -a "$out/summary.log"
fi

# The optimizer benchmark (all but two cores) while the GPU's DMA moves what one 8k step moves (bf16
# weights in, fp32 gradients out) once per 0.6 s, then back to back: host memory is shared
if wanted dram; then
    for period in 0.6 0; do
        log "bench_optim beside the step's DMA traffic, once per ${period} s (0: back to back)"
        timeout $(left 60) python3 - "$build/bench_optim" "$period" "$(($(nproc) - 2))" <<'PY' 2>&1 | tee -a "$out/summary.log"
import subprocess, sys, time, torch
n, period = 1_720_574_976, float(sys.argv[2])
h_in = torch.empty(n, dtype=torch.bfloat16).pin_memory(); d_in = torch.empty_like(h_in, device="cuda")
h_out = torch.empty(n, dtype=torch.float32).pin_memory(); d_out = torch.empty_like(h_out, device="cuda")
s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
p = subprocess.Popen([sys.argv[1], "512", sys.argv[3]], stdout=subprocess.PIPE, text=True)
passes, t0 = 0, time.time()
while p.poll() is None:
    t = time.time()
    with torch.cuda.stream(s1): d_in.copy_(h_in, non_blocking=True)
    with torch.cuda.stream(s2): h_out.copy_(d_out, non_blocking=True)
    torch.cuda.synchronize(); passes += 1
    time.sleep(max(0.0, period - (time.time() - t)))
dt = time.time() - t0
print("\n".join(l for l in p.stdout.read().splitlines() if not l.startswith("RESULT")))
print(f"DMA alongside: {passes} passes of {n*2/1e9:.2f} GB in + {n*4/1e9:.2f} GB out in {dt:.1f} s = "
      f"{passes * n * 6 / dt / 1e9:.1f} GB/s")
PY
    done
fi
# gradients crossing to the host in bf16 (runtime.grad_dtype), as the peer's mixed precision computes them
bf16="runtime.grad_dtype=bf16"
ours slidedp_8k_bf16_noclip 150 $k1 train.grad_clip=0 runtime.update_mode=during_backward $bf16
ours slidedp_8k_bf16 150 $k1 $bf16
ours slidedp_64k_mb8_bf16_noclip 150 train.micro_batch=8 train.grad_accum=2 train.steps=4 $k1 train.grad_clip=0 \
    runtime.update_mode=during_backward $bf16
ours slidedp_64k_mb8_k1 150 train.micro_batch=8 train.grad_accum=2 train.steps=4 $k1
ours slidedp_64k_noclip 150 train.grad_accum=8 train.steps=4 $k1 train.grad_clip=0 runtime.update_mode=during_backward
ours slidedp_64k_mb8_noclip 150 train.micro_batch=8 train.grad_accum=2 train.steps=4 $k1 train.grad_clip=0 \
    runtime.update_mode=during_backward

# the parity fixtures on CUDA against the CPU reference's losses (fp32, then bf16 gradients)
: > "$out/e2e.log"
wanted e2e && e2e_fixtures
wanted e2e_bf16 && e2e_fixtures $bf16

# Qwen3-4B shape in 24 GiB (fp32 and bf16 gradients): GPU memory sampled by nvidia-smi (the whole
# process, context included), host memory as the job's /dev/shm objects
for name in slidedp_4b_24g slidedp_4b_24g_bf16; do
    wanted $name || continue
    extra=""
    [ $name = slidedp_4b_24g_bf16 ] && extra=$bf16
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$out/${name}_gpu_mem.log" 2>&1 &
    smi=$!
    ( while sleep 5; do du -cb /dev/shm/slidedp.* 2>/dev/null | tail -1; done ) > "$out/${name}_shm.log" &
    shm=$!
    ours $name 240 model.path=$root/examples/qwen3-4b runtime.gpu_mem=24G runtime.chunk_buffers=0 \
        runtime.layers_per_chunk=0 train.steps=4 $extra
    kill $smi $shm
    peak=$(sort -n "$out/${name}_gpu_mem.log" | tail -1)
    shm_b=$(sort -n "$out/${name}_shm.log" | tail -1 | cut -f1)
    params=$(grep -oE '[0-9.]+M params' "$out/$name.log" | head -1)
    log "$name: peak GPU memory ${peak:-nan} MiB ($(python3 -c "print(f'{${peak:-0}/1024:.2f}')") GiB); /dev/shm ${shm_b:-nan} bytes; $params"
    echo "RESULT gpu_peak_mib_$name ${peak:-nan}" >> "$out/results.log"
    echo "RESULT shm_bytes_$name ${shm_b:-nan}" >> "$out/results.log"
done


python3 - "$out" <<'PY' | tee -a "$out/summary.log"
import sys, re
out = sys.argv[1]
r = {}
for f in ("results.log", "bench_optim.log", "pcie.log", "bench_layer.log"):
    try:
        for line in open(f"{out}/{f}"):
            if line.startswith("RESULT "):
                k, v = line.split()[1:3]
                # the optimizer's bound: the faster of its thread counts
                r[k] = max(r.get(k, 0.0), float(v)) if k.startswith("staged_") else float(v)
    except OSError:
        pass
P = 1_720_574_976
opt = P / r["staged_params_per_s"] if r.get("staged_params_per_s") else float("nan")
opt16 = P / r["staged_bf16_params_per_s"] if r.get("staged_bf16_params_per_s") else float("nan")
# 28 layers plus the LM head and cross-entropy (about 3 x 2 x 8192 x 2048 x 151936 FLOPs at ~600 TFLOP/s)
gpu = 28 * r.get("layer_ms", float("nan")) / 1e3 + 3 * 2 * 8192 * 2048 * 151936 / 600e12
pcie = r.get("pcie_bound", float("nan"))
tok = lambda k, n: n / r[k] if r.get(k) and r[k] == r[k] else float("nan")
print(f"bounds per 8k-token step: optimizer {opt:.3f} s (bf16 gradients {opt16:.3f} s), PCIe {pcie:.3f} s, "
      f"GPU compute {gpu:.3f} s")
b = max(opt, pcie, gpu)
rows = [("slidedp 8k (2 x 4096), clipping", "slidedp_8k_k1", 8192),
        ("slidedp 8k, no clipping", "slidedp_8k_noclip", 8192),
        ("FSDP2 CPUOffloadPolicy 8k", "fsdp2_offload_8k", 8192),
        ("slidedp 64k (2 x 4096 x 8)", "slidedp_64k", 65536), ("FSDP2 GPU-resident 64k", "fsdp2_gpu_64k", 65536),
        ("slidedp 64k (8 x 4096 x 2)", "slidedp_64k_mb8_k1", 65536),
        ("slidedp 64k (2 x 4096 x 8), no clipping", "slidedp_64k_noclip", 65536),
        ("slidedp 64k (8 x 4096 x 2), no clipping", "slidedp_64k_mb8_noclip", 65536),
        ("slidedp 8k, bf16 gradients, clipping", "slidedp_8k_bf16", 8192),
        ("slidedp 8k, bf16 gradients, no clipping", "slidedp_8k_bf16_noclip", 8192),
        ("slidedp 64k (8 x 4096 x 2), bf16 gradients, no clipping", "slidedp_64k_mb8_bf16_noclip", 65536)]
print(f"| {'run':40} | {'step s':>8} | {'tokens/s':>9} |")
print(f"|{'-'*42}|{'-'*10}|{'-'*11}|")
for name, k, n in rows:
    print(f"| {name:40} | {r.get(k, float('nan')):8.3f} | {tok(k, n):9.0f} |")
b16 = max(opt16, pcie, gpu)
for k, what, bb in (("slidedp_8k_k1", "clipping", b), ("slidedp_8k_noclip", "no clipping, as the peer", b),
                    ("slidedp_8k_bf16", "bf16 gradients, clipping", b16),
                    ("slidedp_8k_bf16_noclip", "bf16 gradients, no clipping", b16)):
    t = r.get(k, float('nan'))
    print(f"slidedp 8k, {what}: {t / bb:.2f}x the slowest bound ({bb:.3f} s; goal <= 1.15), "
          f"{r.get('fsdp2_offload_8k', float('nan')) / t:.2f}x FSDP2 offload's tokens/s (goal >= 4.5)")
for k in ("slidedp_64k", "slidedp_64k_noclip"):
    print(f"{k} vs FSDP2 GPU 64k: {tok(k, 65536) / tok('fsdp2_gpu_64k', 65536):.2f}x (goal >= 1.0)")
best = max(tok(k, 65536) for k in ("slidedp_64k", "slidedp_64k_mb8_k1", "slidedp_64k_noclip", "slidedp_64k_mb8_noclip",
                                   "slidedp_64k_mb8_bf16_noclip"))
print(f"slidedp best 64k vs FSDP2 GPU 64k: {best / tok('fsdp2_gpu_64k', 65536):.2f}x (goal >= 1.1)")
PY
