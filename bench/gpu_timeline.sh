#!/bin/bash
# Where the Qwen3-1.7B-shape step's time goes on a GPU host (from the repo root): each
# configuration trains 10 steps while bench/timeline.py samples the processes' phases. Logs in
# $OUT. Needs .gpudeps/ as gpu_issue4.sh's header says.
. bench/gpu_build.sh
w=/tmp/timeline
rm -rf "$w" && mkdir -p "$w"
python3 - "$w/train.bin" <<'PY'
import sys, numpy as np
n = 2_000_000
h = np.zeros(256, dtype=np.int32); h[:3] = (20240801, 7, n)
t = np.random.default_rng(0).integers(0, 151936, size=n, dtype=np.uint32)
open(sys.argv[1], "wb").write(h.tobytes() + t.tobytes())
PY
cat > "$w/job.ini" <<EOT
[model]
path = $root/examples/qwen3-1.7b
init = random
[data]
train = $w/train.bin
seq_len = 4096
[train]
micro_batch = 2
steps = 10
lr = 1e-5
weight_decay = 0.1
grad_clip = 1.0
[checkpoint]
dir = $w/ckpt
save_final = false
[runtime]
device = cuda
[log]
dir = $w/log
EOT
for cfg in "train.micro_batch=2" "train.micro_batch=2 runtime.optim_procs=4 runtime.optim_threads=4 runtime.chunk_buffers=30"; do
    log "== $cfg"
    rm -rf "$w/log" "$w/ckpt"
    timeout 150 "$build/slidedp-launch" "$w/job.ini" $cfg > "$out/tl_run.log" 2>&1 &
    timeout 160 python3 bench/timeline.py "$build/slidedp-stat" 3 2>&1 | tee -a "$out/summary.log"
    wait
    grep -E "^plan: predicted|^step +(5|6|7|8)/" "$out/tl_run.log" | tee -a "$out/summary.log"
done

# the topology as probed on this host, and what the planner and the launcher make of it
{
    echo "== slidedp-worker --probe-topology"; "$build/slidedp-worker" --probe-topology
    echo "== --gpus 2"; "$build/slidedp-worker" --probe-topology --gpus 2
    echo "== fixture, --device cuda --gpus 2, routes auto"
    timeout 60 "$build/slidedp-launch" --device cuda --gpus 2 tests/fixtures/qwen3_tied/job.ini "log.dir=$w/fx/log" \
        "checkpoint.dir=$w/fx/ckpt" 2>&1 | grep -E "^slidedp: GPU|^plan|^step|exported"
} 2>&1 | tee -a "$out/summary.log"
