#!/bin/bash
# Issue 31 in one GPU-host call, from the repo root: the deterministic attention backward (op parity
# and `bench_attention backward tilings`, as bench/gpu_detattn.sh), then the step rows of
# bench/gpu_planner.sh's ISSUE31 mode (deterministic, auto plans, predicted against measured) with the
# FSDP2 peer beside 64k 8 x 2 and 32K. ROWS picks the step rows (default "64k_8x2 32k 8k 64k_2x8
# 131k"); DEADLINE caps the call's seconds; SKIP_OPS=1 skips the op parity test, SKIP_BWD=1 the
# backward table. Logs under $OUT (or .gpuout/), summary in summary.log.
. bench/gpu_build.sh

if [ -z "${SKIP_OPS:-}" ]; then # SKIP_OPS=1: the caller ran the op parity test already
    timeout ${OPS_S:-150} stdbuf -oL "$build/tests/test_backend_ops" > "$out/backend_ops.log" 2>&1
    log "test_backend_ops exit $? : $(grep -E '^# [0-9]+ failures|^# cuda' "$out/backend_ops.log" | tr '\n' ' ')"
    grep -E 'NOT BIT|non-finite|has no .*plan|cuDNN deterministic|execute' "$out/backend_ops.log" | sort | uniq -c |
        head -20 | tee -a "$out/summary.log"
fi
if [ -z "${SKIP_BWD:-}" ]; then
    SLIDEDP_VERBOSE_ATTENTION=1 timeout ${BWD_S:-150} stdbuf -oL "$build/bench/bench_attention" backward tilings \
        > "$out/bench_backward.log" 2>&1
    log "bench_attention backward tilings exit $?"
    grep -E '^attention backward|has no|deterministic tile|cuDNN' "$out/bench_backward.log" | sort | uniq -c |
        tee -a "$out/summary.log"
fi

NO_BUILD=1 ISSUE31=1 ISSUE31_MODES=true ISSUE31_ROWS=${ROWS:-64k_8x2 32k 8k 64k_2x8 131k} PEERS=1 NO_ALTS=1 \
    DEADLINE=${DEADLINE:-575} . bench/gpu_planner.sh
