#!/bin/bash
# The deterministic attention backward (issue 31) on a GPU host, from the repo root: builds
# (bench/gpu_build.sh), then the CUDA op parity test (its deterministic tables take cuDNN's
# deterministic engine, whole and cut small: common/attn_tiles.h) and `bench_attention backward`
# (deterministic, built-in and fused backward at 4K, 32K, 128K with TFLOP/s, and whether two
# deterministic runs give the same bits). Logs under $OUT (or .gpuout/), summary in summary.log.
. bench/gpu_build.sh

timeout ${OPS_S:-200} stdbuf -oL "$build/tests/test_backend_ops" > "$out/backend_ops.log" 2>&1
log "test_backend_ops exit $? : $(grep -E '^# [0-9]+ failures|^# cuda' "$out/backend_ops.log" | tr '\n' ' ')"
grep -E 'FAILED|NOT BIT|non-finite|has no .*plan|cuDNN deterministic' "$out/backend_ops.log" | grep -v broken |
    sort | uniq -c | head -20 | tee -a "$out/summary.log"
SLIDEDP_VERBOSE_ATTENTION=1 timeout ${BWD_S:-330} stdbuf -oL "$build/bench/bench_attention" backward > "$out/bench_backward.log" 2>&1
log "bench_attention backward exit $?"
grep -E '^attention backward|has no|deterministic tile|cuDNN' "$out/bench_backward.log" | sort | uniq -c |
    tee -a "$out/summary.log"
# then, with what time is left, the kernels of docs/performance.md §1 and §11 (dense and document
# attention in both modes; deterministic dense now takes the deterministic engine)
timeout ${REST_S:-150} stdbuf -oL "$build/bench/bench_attention" > "$out/bench_attention.log" 2>&1
log "bench_attention exit $?"
grep -E '^attention ' "$out/bench_attention.log" | tee -a "$out/summary.log"
