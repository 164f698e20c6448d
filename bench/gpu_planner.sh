#!/bin/bash
# The planner on a GPU host, from the repo root: its predicted step time against the measured one
# for the Qwen3-1.7B shape (random init, seq 4096) at 3 micro-batch sizes and 2 GPU memory budgets,
# and its plan against hand-written alternatives at one of them. Prints one table; logs in $OUT;
# results in docs/performance.md §4. Needs .gpudeps/ as bench/gpu_build.sh's header says. With
# NO_BUILD=1 it expects the caller to have sourced bench/gpu_build.sh already. ISSUE31=1 runs issue 31's
# rows instead (docs/performance.md §10), ISSUE31_MODES="true" only the deterministic ones, and
# ISSUE31_COMPARE=1 adds 64k 8 x 2 and 32K with the deterministic backward on the built-in kernels;
# ISSUE31_ROWS picks rows, PEERS=1 adds the FSDP2 peer rows (see below).
[ -n "${NO_BUILD:-}" ] || . bench/gpu_build.sh
w=/tmp/planner
rm -rf "$w" && mkdir -p "$w"
shm_at_least 60 100G
random_tokens "$w/train.bin" 2000000
bench_job "$w"
deadline=${DEADLINE:-560}
: > "$out/planner.results"
run() { # name, overrides...
    local name=$1 limit=$((deadline - SECONDS))
    shift
    [ "$limit" -gt 150 ] && limit=150
    [ "$limit" -lt 25 ] && { log "$name: skipped (no time left)"; return; }
    rm -rf "$w/log" "$w/ckpt"
    timeout "$limit" "$build/slidedp-launch" "${job_args[@]}" "$@" > "$out/planner_$name.log" 2>&1
    local rc=$?
    local plan=$(grep -E '^plan: ' "$out/planner_$name.log" | head -2 | tr '\n' ' ' | sed 's/plan: //g')
    python3 - "$w/log/metrics.jsonl" "$name" "$rc" "$plan" "$*" <<'PY' | tee -a "$out/planner.results"
import json, sys, statistics as st
path, name, rc, plan, args = sys.argv[1:]
try:
    rows = [json.loads(l) for l in open(path)]
except OSError:
    rows = []
x = [r["step_s"] for r in rows][2:]
m = st.median(x) if x else float("nan")
p = rows[0]["predicted_step_s"] if rows else float("nan")
print(json.dumps({"name": name, "rc": int(rc), "measured": m, "predicted": p, "args": args, "plan": plan}))
PY
    "$build/slidedp-launch" --clean "${job_args[@]}" "$@" > /dev/null 2>&1
}
if [ -n "${ISSUE31:-}" ]; then
    # issue 31's rows instead (docs/performance.md §10): auto plans, deterministic (the default) and
    # not; the 131K steps take 20-35 s each, so they run 3 steps (the median is the third)
    # ISSUE31_ROWS="64k_8x2 32k ..." runs only those; PEERS=1 adds the FSDP2 peer beside 64k 8 x 2
    # (GPU-resident) and 32K (with activation checkpointing), from .gpudeps/torch_peer.py; the 64k
    # peer takes 2 sequences x 8 micro-steps (8 x 4096 x 2 fits neither an H100 nor, per README's
    # table, an H200), or PEER_64K=BxA
    row() { [ -z "${ISSUE31_ROWS:-}" ] || [[ " $ISSUE31_ROWS " == *" $1 "* ]]; }
    peer() { # name, torch_peer.py arguments
        local name=$1 limit=$((deadline - SECONDS)) script=${GPUDEPS:-.gpudeps}/torch_peer.py
        shift
        [ -f "$script" ] || { log "$name: skipped: no $script (copy ../shared/bench/torch_peer.py there)"; return; }
        [ "$limit" -gt 150 ] && limit=150
        [ "$limit" -lt 40 ] && { log "$name: skipped (no time left)"; return; }
        timeout "$limit" python3 "$script" "$@" > "$out/peer_$name.log" 2>&1
        local t=$(peer_step "$out/peer_$name.log")
        log "peer $name ($*): median step ${t:-nan} s"
    }
    peer64=${PEER_64K:-2x8}
    for det in ${ISSUE31_MODES:-true false}; do
        d=runtime.deterministic=$det
        row 64k_8x2 && run "64k_8x2_$det" train.micro_batch=8 train.grad_accum=2 train.steps=5 $d
        [ -n "${PEERS:-}" ] && row 64k_8x2 && [ $det = true ] &&
            peer "fsdp2_gpu_64k_$peer64" 1.7b gpu 4096 ${peer64/x/ } 4
        row 32k && run "32k_$det" train.micro_batch=1 data.seq_len=32768 train.steps=5 $d
        [ -n "${PEERS:-}" ] && row 32k && [ $det = true ] && peer fsdp2_gpu_ckpt_32k 1.7b gpu 32768 1 1 4 --ckpt
        row 8k && run "8k_$det" $d
        row 64k_2x8 && run "64k_2x8_$det" train.grad_accum=8 train.steps=5 $d
        row 131k && run "131k_$det" train.micro_batch=1 data.seq_len=131072 train.steps=3 $d
    done
    if [ -n "${ISSUE31_COMPARE:-}" ]; then # the deterministic backward on the built-in kernels, as before
        SLIDEDP_ATTENTION=det-builtin run 64k_8x2_det_builtin train.micro_batch=8 train.grad_accum=2 train.steps=5
        SLIDEDP_ATTENTION=det-builtin run 32k_det_builtin train.micro_batch=1 data.seq_len=32768 train.steps=5
    fi
else
    for mem in auto 24G; do
        for mb in 1 2 4; do
            run "mb${mb}_$mem" train.micro_batch=$mb runtime.gpu_mem=$mem
        done
    done
fi
# hand-written alternatives to the planner's choice at micro_batch 2, gpu_mem 24G (NO_ALTS=1: none)
if [ -z "${NO_ALTS:-}${ISSUE31:-}" ]; then
    run alt_stream3 train.micro_batch=2 runtime.gpu_mem=24G runtime.chunk_buffers=3
    run alt_recompute train.micro_batch=2 runtime.gpu_mem=24G runtime.activations=recompute
    run alt_optim1x14 train.micro_batch=2 runtime.gpu_mem=24G runtime.optim_procs=1 runtime.optim_threads=14
    run alt_lpc4 train.micro_batch=2 runtime.gpu_mem=24G runtime.layers_per_chunk=4
fi
python3 - "$out/planner.results" <<'PY' | tee -a "$out/summary.log"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print(f"| {'run':16} | {'exit':>4} | {'predicted s':>11} | {'measured s':>10} | {'error':>7} |")
print(f"|{'-'*18}|{'-'*6}|{'-'*13}|{'-'*12}|{'-'*9}|")
for r in rows:
    err = (r["predicted"] - r["measured"]) / r["measured"] if r["measured"] == r["measured"] and r["measured"] else float("nan")
    print(f"| {r['name']:16} | {r['rc']:4} | {r['predicted']:11.3f} | {r['measured']:10.3f} | {100*err:+6.1f}% |")
for r in rows:
    print(f"{r['name']}: {r['args']} -> {r['plan']}")
PY
# the calibration the predictions came from
cat "${SLIDEDP_CACHE_DIR:-$HOME/.cache/slidedp}"/calib-*.json 2>/dev/null | grep -E '"(ncpu|memcpy_bw|adamw_rate|adamw_fp32_rate)"' | tee -a "$out/summary.log"
