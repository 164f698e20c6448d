#!/bin/bash
# Parity and kernels on a GPU host, run from the repo root: builds with the carried .debs, runs the
# CUDA op-parity test, the HF parity test, an end-to-end `--device cuda` training run of every
# fixture against its reference losses, the attention and layer benchmarks and their PyTorch
# references, and prints one table (ours, PyTorch, ratio). Logs go to $OUT (or .gpuout/); results
# in docs/performance.md §1. Needs .gpudeps/ as bench/gpu_build.sh's header says.
. bench/gpu_build.sh

# ---- correctness ----
timeout 150 "$build/tests/test_backend_ops" > "$out/test_backend_ops.log" 2>&1
log "test_backend_ops exit $? : $(grep -E '^# [0-9]+ failures' "$out/test_backend_ops.log" | tr '\n' ' ')"
grep -E '^# (worst|cuda device|candidate)' "$out/test_backend_ops.log" | tee -a "$out/summary.log"
grep -E 'FAILED|NOT BIT|skipped|modified|guard' "$out/test_backend_ops.log" | grep -v 'broken' | head -20 | tee -a "$out/summary.log"
# the built-in attention kernels too (cuDNN's run above where it loads)
SLIDEDP_ATTENTION=builtin timeout 150 "$build/tests/test_backend_ops" > "$out/test_backend_ops_builtin.log" 2>&1
log "test_backend_ops, built-in attention, exit $? : $(grep -E '^# [0-9]+ failures' "$out/test_backend_ops_builtin.log" | tr '\n' ' ')"
grep -E '^# worst normalised error attention' "$out/test_backend_ops_builtin.log" | tee -a "$out/summary.log"
timeout 120 "$build/tests/test_parity" > "$out/test_parity.log" 2>&1
log "test_parity exit $?"

: > "$out/e2e.log"
e2e_fixtures

# ---- speed ----
: > "$out/bench.log"
timeout 100 "$build/bench/bench_attention" >> "$out/bench.log" 2>&1 || log "bench_attention failed"
timeout 100 "$build/bench/bench_layer" >> "$out/bench.log" 2>&1 || log "bench_layer failed"
timeout 150 python3 bench/torch_ops.py >> "$out/bench.log" 2>&1 || log "torch_ops.py failed"
grep -v '^RESULT' "$out/bench.log" | tee -a "$out/summary.log"

# with NCU=1 and ncu there: kernel profiles of one launch of each built-in attention kernel (B=2,
# T=4096; run with SLIDEDP_ATTENTION=builtin, else cuDNN's kernels run instead)
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$ncu" ] && [ -n "${NCU:-}" ]; then
    for k in attn_fwd_kernel attn_bwd_dkdv_kernel attn_bwd_dq_kernel; do
        timeout 120 "$ncu" --clock-control none -k "regex:$k" -c 1 --section SpeedOfLight --section Occupancy \
            --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
            "$build/bench/bench_attention" 2>&1 | grep -vE '^(attention|RESULT|device)' >> "$out/ncu.log"
    done
fi

python3 - "$out/bench.log" <<'PY' | tee -a "$out/summary.log"
import sys
r = {}
for line in open(sys.argv[1]):
    if line.startswith("RESULT "):
        _, k, v = line.split()
        r[k] = float(v)
rows = []
for B, T in ((2, 4096), (1, 32768)):
    for what in ("fwd", "fwdbwd"):
        rows.append((f"attention {what} B={B} T={T} (TFLOP/s)", r.get(f"attention_{what}_B{B}_T{T}"),
                     r.get(f"torch_attention_{what}_B{B}_T{T}"), False))
rows.append(("Qwen3-1.7B layer fwd+bwd B=2 T=4096 (ms)", r.get("layer_ms"), r.get("torch_layer_ms"), True))
print(f"| {'op/config':44} | {'ours':>9} | {'PyTorch':>9} | {'ratio':>6} |")
print(f"|{'-' * 46}|{'-' * 11}|{'-' * 11}|{'-' * 8}|")
for name, ours, ref, lower_better in rows:
    ratio = (ref / ours if lower_better else ours / ref) if ours and ref else float("nan")
    f = lambda x: f"{x:9.2f}" if x is not None else f"{'-':>9}"
    print(f"| {name:44} | {f(ours)} | {f(ref)} | {ratio:6.2f} |")
print("ratio: ours/PyTorch throughput (PyTorch time / ours for the layer)")
PY

# the k_proj.bias numerics (issue 18): our update directions and PyTorch bf16 autocast's against fp32
NO_BUILD=1 . bench/gpu_kbias.sh
