#!/bin/bash
# Routes on a GPU host with one GPU, from the repo root: `--gpus 2` puts both workers on the same
# GPU, so the exchange runs through CUDA IPC for real (each worker maps the other's window). The
# Qwen3 fixture of the parity work and a Qwen3-1.7B-shape job train with every route combination
# and are compared with `--gpus 1` at grad_accum x 2 (losses and final weights, bf16 tolerance).
# A correctness check of the IPC plumbing, not a speed test. Logs in $OUT; results in
# docs/performance.md §3; needs .gpudeps/ as bench/gpu_build.sh's header says.
. bench/gpu_build.sh
w=/tmp/routes
rm -rf "$w" && mkdir -p "$w"

# run NAME INI GPUS GRAD_ACCUM PARAM_ROUTE GRAD_ROUTE [overrides...]
run() {
    local name=$1 ini=$2 gpus=$3 a=$4 pr=$5 gr=$6
    shift 6
    timeout 240 "$build/slidedp-launch" --device cuda --gpus "$gpus" "$ini" "log.dir=$w/$name/log" \
        "checkpoint.dir=$w/$name/ckpt" "train.grad_accum=$a" "runtime.param_route=$pr" \
        "runtime.grad_route=$gr" runtime.accumulate_on_device=false checkpoint.export_dtype=fp32 "$@" \
        > "$out/$name.log" 2>&1
    local rc=$?
    log "$name: exit $rc; $(grep -E '^plan: activations' "$out/$name.log" | sed 's/.*; //')"
    [ $rc -eq 0 ] || tail -5 "$out/$name.log" | tee -a "$out/summary.log"
}

compare() { # reference, runs...
    python3 - "$w" "$@" <<'PY' | tee -a "$out/summary.log"
import json, sys, torch
from safetensors.torch import load_file
w, ref, *runs = sys.argv[1:]
def losses(n): return [json.loads(l)["loss"] for l in open(f"{w}/{n}/log/metrics.jsonl")]
def peer(n): return sum(sum(json.loads(l)["peer_bytes"]) for l in open(f"{w}/{n}/log/metrics.jsonl"))
def h2d(n): return sum(sum(json.loads(l)["h2d_bytes"]) for l in open(f"{w}/{n}/log/metrics.jsonl"))
def weights(n): return load_file(f"{w}/{n}/ckpt/final/model.safetensors")
rl, rw = losses(ref), weights(ref)
print(f"| {'run':34} | {'worst loss rel':>14} | {'weights rel (worst tensor)':>36} | {'bit-identical':>13} | {'H2D MB':>8} | {'peer MB':>8} |")
for n in [ref] + runs:
    try:
        l, wt = losses(n), weights(n)
    except Exception as e:
        print(f"| {n:34} | missing: {e}"); continue
    lr = max(abs(a - b) / abs(b) for a, b in zip(l, rl)) if len(l) == len(rl) else float("inf")
    worst, name, same = 0.0, "", True
    for k, t in rw.items():
        d = (wt[k].double() - t.double()).norm() / t.double().norm().clamp_min(1e-30)
        same &= torch.equal(wt[k], t)
        if d > worst: worst, name = float(d), k
    print(f"| {n:34} | {lr:14.2e} | {worst:10.2e} {name[-25:]:>25} | {str(same):>13} | {h2d(n)/1e6:8.1f} | {peer(n)/1e6:8.1f} |")
PY
}

fx=tests/fixtures/qwen3_tied/job.ini
run fx_g1 $fx 1 4 replicated cpu
for pr in replicated sharded; do
    for gr in cpu gpu; do
        run fx_g2_${pr}_$gr $fx 2 2 $pr $gr
    done
done
log "Qwen3 fixture (tied, 4 steps), --device cuda, --gpus 2 on one GPU vs --gpus 1 with grad_accum x 2:"
compare fx_g1 fx_g2_replicated_cpu fx_g2_replicated_gpu fx_g2_sharded_cpu fx_g2_sharded_gpu

# The Qwen3-1.7B shape: bigger chunks through the windows (the embedding chunk is 311M elements).
random_tokens "$w/train.bin" 400000
# the shared job at seq 2048, 1 sequence per micro-step, 3 steps, the final weights exported (run
# gives each its own log and checkpoint folders)
big=("data.train=$w/train.bin" data.seq_len=2048 train.micro_batch=1 train.steps=3 train.lr=1e-4 train.warmup=1
    train.weight_decay=0 checkpoint.save_final=true runtime.gpu_mem=60G runtime.optim_procs=4 runtime.optim_threads=3)
run big_g1 "$bench_ini" 1 2 replicated cpu "${big[@]}"
run big_g2_sharded_gpu "$bench_ini" 2 1 sharded gpu "${big[@]}"
run big_g2_replicated_cpu "$bench_ini" 2 1 replicated cpu "${big[@]}"
log "Qwen3-1.7B shape (3 steps, seq 2048), --gpus 2 on one GPU vs --gpus 1 with grad_accum x 2:"
compare big_g1 big_g2_replicated_cpu big_g2_sharded_gpu
