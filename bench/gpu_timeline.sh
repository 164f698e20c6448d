#!/bin/bash
# Where the Qwen3-1.7B-shape step's time goes on a GPU host (from the repo root): each
# configuration trains 10 steps while bench/timeline.py samples the processes' phases. Logs in
# $OUT. Needs .gpudeps/ as bench/gpu_build.sh's header says. CONFIGS="overrides;overrides" replaces the
# two configurations below; NO_TOPOLOGY=1 skips the topology probe at the end.
. bench/gpu_build.sh
w=/tmp/timeline
rm -rf "$w" && mkdir -p "$w"
random_tokens "$w/train.bin" 2000000
bench_job "$w"
job_args+=(train.steps=10)
IFS=';' read -r -a configs <<< "${CONFIGS:-train.micro_batch=2;train.micro_batch=2 runtime.optim_procs=4 runtime.optim_threads=4 runtime.chunk_buffers=30}"
for cfg in "${configs[@]}"; do
    log "== $cfg"
    rm -rf "$w/log" "$w/ckpt"
    nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 100 > "$out/tl_util.log" 2>&1 &
    smi=$!
    timeout 150 "$build/slidedp-launch" "${job_args[@]}" $cfg > "$out/tl_run.log" 2>&1 &
    launch=$!
    timeout 160 python3 bench/timeline.py "$build/slidedp-stat" 3 2>&1 | tee -a "$out/summary.log"
    wait $launch; kill $smi; wait $smi
    # the GPU's busy share (nvidia-smi: a kernel ran in the sample) over the run's second half
    awk '/^[0-9]+$/ {u[n++] = $1} END {for (i = int(n / 2); i < n; i++) s += u[i];
        if (n) printf "GPU busy %.0f%% of %d samples (second half of the run)\n", s / (n - int(n / 2)), n - int(n / 2)}' \
        "$out/tl_util.log" | tee -a "$out/summary.log"
    grep -E "^plan: predicted|^step +(5|6|7|8)/" "$out/tl_run.log" | tee -a "$out/summary.log"
done

# the topology as probed on this host, and what the planner and the launcher make of it
[ -n "${NO_TOPOLOGY:-}" ] && exit 0
{
    echo "== slidedp-worker --probe-topology"; "$build/slidedp-worker" --probe-topology
    echo "== --gpus 2"; "$build/slidedp-worker" --probe-topology --gpus 2
    echo "== fixture, --device cuda --gpus 2, routes auto"
    timeout 60 "$build/slidedp-launch" --device cuda --gpus 2 tests/fixtures/qwen3_tied/job.ini "log.dir=$w/fx/log" \
        "checkpoint.dir=$w/fx/ckpt" 2>&1 | grep -E "^slidedp: GPU|^plan|^step|exported"
} 2>&1 | tee -a "$out/summary.log"
