#!/bin/bash
# Bias numerics on a GPU host, from the repo root: the k_proj.bias numerics of the CUDA backend. A
# Qwen2-style model (q/k/v biases) trained by slidedp on the GPU, by PyTorch with bf16 autocast and
# by PyTorch in fp32 (the reference), from the same weights, data and AdamW: per tensor, the cosine
# of each update (final - initial) with the reference's (bench/kbias.py). Two models: the qwen2
# parity fixture (4 steps; its float64 reference too) and a bigger one (hidden 512, seq 512, 6 steps).
# Tables in $OUT/kbias_*.log and the summary. Needs .gpudeps/ as gpu_build.sh's header says, and
# PyTorch with transformers on the host. With NO_BUILD=1 it expects bench/gpu_build.sh sourced.
[ -n "${NO_BUILD:-}" ] || . bench/gpu_build.sh
w=/tmp/kbias
rm -rf "$w" && mkdir -p "$w/fixture" "$w/big"
kbias_case() { # name, job.ini, [float64 reference]
    local name=$1 ini=$2 d=$w/$1
    shift 2
    timeout 120 "$build/slidedp-launch" --device cuda "$ini" "log.dir=$d/log" "checkpoint.dir=$d/ckpt" \
        checkpoint.export_dtype=fp32 > "$out/kbias_${name}_launch.log" 2>&1
    local rc=$?
    log "kbias $name: slidedp-launch exit $rc"
    timeout 240 python3 bench/kbias.py "$ini" "$d/ckpt/final" "$@" > "$out/kbias_$name.log" 2>&1
    log "kbias $name: bench/kbias.py exit $?"
    grep -E '^\||lowest|update-direction|Error|error' "$out/kbias_$name.log" | tee -a "$out/summary.log"
}
kbias_case fixture tests/fixtures/qwen2/job.ini tests/fixtures/qwen2/ref.safetensors
python3 bench/kbias.py --make "$w/big" > "$out/kbias_make.log" 2>&1 || log "kbias: making the model failed"
kbias_case big "$w/big/job.ini"
