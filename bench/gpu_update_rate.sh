#!/bin/bash
# The fp32 update's bandwidth on a GPU host, from the repo root (docs/performance.md §10, "a lead"):
# in the 32K and 64k timelines the job's update ran at 4.0-4.5 G parameters/s while the host's
# calibration measured 6.06 G/s for its flavour. On one machine: bench_optim (the optimizer's
# kernels, journaled, fp32 and bf16 gradients) in POSIX shm, locked shm and anonymous memory at the
# job's thread count, then the host calibration the planner makes, and what the host's memory
# looks like (transparent huge pages, CPUs, NUMA). THREADS (15) and N_M (parameters, millions,
# 128) change the runs. Logs in $OUT; summary in $OUT/summary.log.
. bench/gpu_build.sh
for mem in shm shm-locked anon; do
    timeout 90 "$build/bench/bench_optim" "${N_M:-128}" "${THREADS:-15}" $mem 2>&1 | grep -v '^RESULT' |
        tee -a "$out/summary.log"
done
# a fresh calibration of this machine as it is now, in a scratch cache (the host's own stays as it is)
cache=/tmp/update_rate_calib
rm -rf "$cache" && mkdir -p "$cache"
SLIDEDP_CACHE_DIR=$cache timeout 120 "$build/slidedp-plan" bench/qwen3-1.7b.ini data.train=/dev/null > "$out/plan.log" 2>&1
grep -A3 '^calibration, host' "$out/plan.log" | tee -a "$out/summary.log"
cat "$cache"/calib-*.json 2>/dev/null |
    grep -E '"(memcpy_bw|adamw_fp32_rate|adamw_bf16_rate)"' | tee -a "$out/summary.log"
{
    echo "THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled) shmem: $(cat /sys/kernel/mm/transparent_hugepage/shmem_enabled)"
    lscpu | grep -E 'Model name|Thread\(s\)|Socket|NUMA node'
    df -h /dev/shm | tail -1
} 2>&1 | tee -a "$out/summary.log"
