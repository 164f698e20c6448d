#!/bin/bash
# Document attention (issue 30) on a GPU host, run from the repo root: builds (bench/gpu_build.sh),
# then
#   1. the CUDA op parity test, document cases included (cuDNN where it loads, then the built-in
#      kernels alone), and tests/test_docattn.c's fixtures (tests/fixtures/*_docs) on CUDA,
#      deterministic and not;
#   2. the attention kernels alone at Qwen3-1.7B's shape (B=2 T=4096, 16 query heads, 8 kv, D=128),
#      document attention (cuDNN over the document table, and the built-in kernels alone) against
#      dense causal attention for several length mixes (bench_attention);
#   3. step time of the Qwen3-1.7B job (seq 4096, 2 sequences per micro-step, 8 micro-steps) on one
#      packed SFT shard of documents of lognormal lengths (mean ~600, median ~400, tail clipped at
#      4096), with [data] attention = document against window, side by side, in each mode of
#      runtime.deterministic (true, the default, then false).
# PARTS="2 3" (say) runs only those parts (default "1 2 3"). Part 3: DOC_MU lists the lognormal's mu
# of each length mix (default 6.0; 4.6 gives mean ~150, median 100), DOC_MODES the deterministic
# settings (default "true false"), DOC_ROUNDS how many times each pair runs (default 1), DOC_STEPS
# the steps of each run (default 12; the median is of steps 4 on).
# Logs under $OUT (or .gpuout/); the summary in $OUT/summary.log.
. bench/gpu_build.sh

part() { [[ " ${PARTS:-1 2 3} " == *" $1 "* ]]; }

# ---- 1. correctness ----
if part 1; then
    timeout 200 "$build/tests/test_backend_ops" > "$out/backend_ops.log" 2>&1
    log "test_backend_ops exit $? : $(grep -E '^# [0-9]+ failures' "$out/backend_ops.log" | tr '\n' ' ')"
    SLIDEDP_ATTENTION=builtin timeout 200 "$build/tests/test_backend_ops" > "$out/backend_ops_builtin.log" 2>&1
    log "test_backend_ops, built-in attention, exit $?"
    grep -E 'FAILED|NOT BIT|non-finite' "$out/backend_ops.log" "$out/backend_ops_builtin.log" | grep -v broken | head -20 |
        tee -a "$out/summary.log"
    # cuDNN's document plans (attention_cudnn.c): any shape it refused, with its reason
    grep -h 'has no .*plan' "$out/backend_ops.log" | sort | uniq -c | head -10 | tee -a "$out/summary.log"
    for det in 1 0; do
        SLIDEDP_DOCATTN_CUDA=1 SLIDEDP_DOCATTN_DETERMINISTIC=$det timeout 300 "$build/tests/test_docattn_fixtures" fixtures \
            > "$out/docattn_cuda_det$det.log" 2>&1
        log "test_docattn on CUDA, deterministic $det: exit $?"
        grep -E '^# |FAILED' "$out/docattn_cuda_det$det.log" | grep -v 'step\|final weights' | tee -a "$out/summary.log"
    done
fi

# ---- 2. the kernels alone ----
if part 2; then
    for impl in default builtin; do
        if [ $impl = builtin ]; then export SLIDEDP_ATTENTION=builtin; else unset SLIDEDP_ATTENTION; fi
        timeout 200 "$build/bench/bench_attention" > "$out/bench_attention_$impl.log" 2>&1 || log "bench_attention failed"
        log "attention kernels ($impl dense path):"
        grep -E '^attention .* documents|has no .*plan' "$out/bench_attention_$impl.log" | tee -a "$out/summary.log"
    done
    unset SLIDEDP_ATTENTION
fi

# ---- 3. step time, document against window attention ----
if part 3; then
d=/tmp/docattn_bench
rm -rf "$d" && mkdir -p "$d"
rounds=${DOC_ROUNDS:-1}
for mu in ${DOC_MU:-6.0}; do
python3 - "$d/train-$mu.bin" "$mu" <<'PY'
# An SFT shard of packed 4096-token windows: documents of lognormal lengths exp(N(mu, 0.9)) (mu 6.0:
# mean ~605, median ~403) clipped at 4096, laid greedily; every token but a document's first is a
# target.
import sys, numpy as np
rng = np.random.default_rng(30)
T, windows = 4096, 2 * 8 * 12
toks, flags = [], []
for _ in range(windows):
    used = 0
    while True:
        n = int(min(T, np.ceil(np.exp(rng.normal(float(sys.argv[2]), 0.9)))))
        if used + n > T:
            break
        toks.append(rng.integers(0, 151936, size=n, dtype=np.uint32))
        f = np.ones(n, dtype=np.uint8)
        f[0] = 3
        flags.append(f)
        used += n
    if used < T:
        toks.append(np.zeros(T - used, dtype=np.uint32))
        flags.append(np.zeros(T - used, dtype=np.uint8))
toks.append(np.zeros(1, dtype=np.uint32)); flags.append(np.zeros(1, dtype=np.uint8))
t, f = np.concatenate(toks), np.concatenate(flags)
h = np.zeros(256, dtype=np.int32); h[:3] = (20261202, 1, len(t))
open(sys.argv[1], "wb").write(h.tobytes() + t.astype("<u4").tobytes() + f.tobytes())
docs = int(((f & 2) != 0).sum())
print(f"docattn shard: {windows} windows, {docs} documents, mean length {len(t) / docs:.0f} tokens (padding included)")
PY
bench_job "$d"
for det in ${DOC_MODES:-true false}; do
    for round in $(seq "$rounds"); do
        # the two settings alternate which runs first, round by round, so that a drift of the host
        # weighs on both
        order="document window"
        [ $((round % 2)) = 0 ] && order="window document"
        for att in $order; do
            run=$mu-$att-$det-$round
            SLIDEDP_VERBOSE_ATTENTION=1 timeout 500 "$build/slidedp-launch" --device cuda "${job_args[@]}" \
                "data.train=$d/train-$mu.bin" "log.dir=$d/$run/log" "checkpoint.dir=$d/$run/ckpt" train.grad_accum=8 \
                train.steps=${DOC_STEPS:-12} data.attention=$att runtime.deterministic=$det > "$out/step_$run.log" 2>&1
            log "train mu $mu, $att attention, deterministic $det, round $round: exit $?"
            grep -E '^plan: ' "$out/step_$run.log" | head -2 | sed 's/^/  /' | tee -a "$out/summary.log"
            # cuDNN plans built during the run (one per new shape; a document plan per table bucket)
            grep -o 'cuDNN .*plan B=.* built in [0-9]* ms' "$out/step_$run.log" |
                awk '{n++; ms += $(NF-1)} END {printf "  %d cuDNN plans built, %d ms in all\n", n, ms}' | tee -a "$out/summary.log"
        done
    done
done
python3 - "$d" "${DOC_MODES:-true false}" "$mu" "$rounds" "${DOC_STEPS:-12}" <<'PY' | tee -a "$out/summary.log"
import json, statistics, sys
d, modes, mu, rounds, last = sys.argv[1], sys.argv[2].split(), sys.argv[3], int(sys.argv[4]), sys.argv[5]
for det in modes:
    r = {}
    for att in ("document", "window"):
        pooled = []
        for k in range(1, rounds + 1):
            try:
                steps = [json.loads(l)["step_s"] for l in open(f"{d}/{mu}-{att}-{det}-{k}/log/metrics.jsonl") if l.strip()]
            except (OSError, ValueError, KeyError):
                steps = []
            pooled += steps[3:]
            print(f"  {att}, deterministic {det}, round {k}, every step: {' '.join(f'{x:.2f}' for x in steps)}")
        r[att] = statistics.median(pooled) if pooled else float("nan")
    print(f"Qwen3-1.7B, seq 4096, 2 x 8 sequences per step, lognormal documents (mu {float(mu):.1f}), deterministic {det}: "
          f"median step (steps 4-{last} of {rounds} round(s)) document {r['document']:.3f} s, window {r['window']:.3f} s, "
          f"window/document {r['window'] / r['document']:.2f}")
PY
done
fi
