#!/bin/bash
# Long context on a GPU host (issue 31), from the repo root: one sequence of the Qwen3-1.7B shape
# (the bench job, random init, default settings: deterministic, auto plans) for each RUNS entry
# TOKENS:STEPS (default "131072:3 524288:1": 524K took 325.5 s a step on an H100), each with
# runtime.gpu_mem=$GPU_MEM (default 80G, the issue's, which an H200 runs with room; an H100 has
# less than 80 GiB free after the worker's context and its worker refuses that budget: GPU_MEM=79G
# there). Per run: exit status, the plan's lines (524K offloads its layer inputs to host memory),
# the median step time of the steps after the first (the only one when there is one), the
# prediction, peak GPU memory (nvidia-smi every 0.2 s). Logs in $OUT (gpu_build.sh); the summary in
# $OUT/summary.log. One call of 600 s does not hold both: RUNS=524288:1 alone.
. bench/gpu_build.sh
w=/tmp/longctx
rm -rf "$w" && mkdir -p "$w"
shm_at_least 60 100G
random_tokens "$w/train.bin" 1100000
bench_job "$w"
log "$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader); $(free -g | grep Mem)"
for run in ${RUNS:-131072:3 524288:1}; do
    T=${run%%:*} steps=${run##*:}
    rm -rf "$w/log" "$w/ckpt"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$out/gpu_$T.log" 2>&1 &
    smi=$!
    timeout "${LIMIT:-560}" "$build/slidedp-launch" "${job_args[@]}" train.micro_batch=1 data.seq_len=$T \
        train.steps=$steps runtime.gpu_mem=${GPU_MEM:-80G} > "$out/longctx_$T.log" 2>&1
    rc=$?
    kill $smi 2>/dev/null
    grep -E '^plan: ' "$out/longctx_$T.log" | tee -a "$out/summary.log"
    python3 - "$w/log/metrics.jsonl" "$out/gpu_$T.log" "$T" "$rc" <<'PY' | tee -a "$out/summary.log"
import json, statistics, sys
path, gpu, T, rc = sys.argv[1:]
try:
    rows = [json.loads(l) for l in open(path)]
except OSError:
    rows = []
mib = [int(x) for x in open(gpu).read().split() if x.isdigit()]
steps = [r["step_s"] for r in rows]
step = statistics.median(steps[1:] if len(steps) > 1 else steps) if steps else float("nan")
pred = rows[0]["predicted_step_s"] if rows else float("nan")
print(f"one {T}-token sequence: exit {rc}, {len(rows)} step(s), step {step:.2f} s, predicted {pred:.2f} s "
      f"({100 * (pred / step - 1):+.1f}%), peak GPU memory {max(mib) / 1024 if mib else float('nan'):.2f} GiB")
PY
    "$build/slidedp-launch" --clean "${job_args[@]}" train.micro_batch=1 data.seq_len=$T > /dev/null 2>&1
done
