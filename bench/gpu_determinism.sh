#!/bin/bash
# Determinism on one H200, from the repo root: is the default CUDA path deterministic? The Qwen3-1.7B
# shape (random init, seq 4096, 2 sequences per step, clipping, 8 steps), with the default settings
# (runtime.deterministic = true): two uninterrupted runs, one whose first worker is killed (kill -9)
# once step 3 is logged, one whose first optimizer is; their fp32 exports are compared bitwise
# (sha256) and their grad_norms line by line. Then runtime.deterministic = false (cuDNN's attention
# backward, which sums dQ with atomics) twice, and the median step time of each path. Prints one
# table; logs in $OUT. Needs .gpudeps/ as gpu_build.sh's header says (pass it in carry). With
# NO_BUILD=1 it expects the caller to have sourced bench/gpu_build.sh already; ONLY="name ..." runs
# just those runs (det_a nondet_a nondet_b det_b det_kill_worker det_kill_optim); DEADLINE caps the
# call's seconds (560); EXTRA="overrides" changes the job (issue 31's deterministic 64k run:
# EXTRA="train.micro_batch=8 train.grad_accum=2"); TIMELINE=1 samples det_a's phases with
# bench/timeline.py (timeline.log). Each exporting run writes about 34 GB (removed after it).
[ -n "${NO_BUILD:-}" ] || . bench/gpu_build.sh
w=/tmp/determinism
rm -rf "$w" && mkdir -p "$w"
shm_at_least 60 100G
log "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); cuDNN from ${cudnn_lib:-the loader path}"
random_tokens "$w/train.bin" 2000000
bench_job "$w"
job_args+=(train.steps=8 ${EXTRA:-})
deadline=${DEADLINE:-560}
: > "$out/determinism.results"

# run NAME KILL [overrides...]: KILL is none, worker or optim; exports fp32 weights unless the
# overrides say otherwise; one JSON line into determinism.results
run() {
    local name=$1 kill=$2 d=$w/$1 limit=$((deadline - SECONDS))
    shift 2
    [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $name "* ]] || return 0
    [ "$limit" -gt 200 ] && limit=200
    [ "$limit" -lt 40 ] && { log "$name: skipped (no time left)"; return; }
    rm -rf "$d" && mkdir -p "$d"
    timeout "$limit" "$build/slidedp-launch" "${job_args[@]}" "log.dir=$d/log" "checkpoint.dir=$d/ckpt" \
        checkpoint.save_final=true checkpoint.export_dtype=fp32 "$@" > "$out/det_$name.log" 2>&1 &
    local pid=$! killed=""
    [ -n "${TIMELINE:-}" ] && [ "$name" = det_a ] &&
        timeout "$limit" python3 bench/timeline.py "$build/slidedp-stat" 3 > "$out/timeline.log" 2>&1 &
    if [ "$kill" != none ]; then
        local prog=slidedp-worker
        [ "$kill" = optim ] && prog=slidedp-optim
        for _ in $(seq 1 4000); do
            [ "$(cat "$d/log/metrics.jsonl" 2>/dev/null | wc -l)" -ge 3 ] && break
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.05
        done
        local job=$(job_id_of "$out/det_$name.log")
        local victim=$(pgrep -f "$prog --job $job" | head -1)
        if [ -n "$job" ] && [ -n "$victim" ] && kill -9 "$victim"; then
            killed="$prog pid $victim after step $(cat "$d/log/metrics.jsonl" | wc -l)"
        else
            killed="nothing (job ${job:-?}, no $prog found)"
        fi
    fi
    wait "$pid"
    local rc=$?
    local hash=-
    ls "$d"/ckpt/final/*.safetensors > /dev/null 2>&1 && hash=$(cat "$d"/ckpt/final/*.safetensors | sha256sum | cut -c1-16)
    python3 - "$d/log/metrics.jsonl" "$name" "$rc" "$hash" "$killed" "$*" <<'PY' | tee -a "$out/determinism.results"
import json, sys, statistics as st
path, name, rc, h, killed, args = sys.argv[1:]
try:
    rows = [json.loads(l) for l in open(path)]
except OSError:
    rows = []
x = [r["step_s"] for r in rows][2:]
print(json.dumps({"name": name, "rc": int(rc), "hash": h, "killed": killed, "args": args,
                  "norms": [r["grad_norm"] for r in rows], "step_s": st.median(x) if x else None}))
PY
    grep -E 'restarting|died' "$out/det_$name.log" | head -3 | sed "s/^/$name: /" | tee -a "$out/summary.log"
    rm -rf "$d/ckpt" # 30 GB of checkpoint and export per run
}

run det_a none
run nondet_a none runtime.deterministic=false checkpoint.save_final=false
run nondet_b none runtime.deterministic=false checkpoint.save_final=false
run det_b none
run det_kill_worker worker
run det_kill_optim optim

python3 - "$out/determinism.results" <<'PY' | tee -a "$out/summary.log"
import json, sys
rows = {r["name"]: r for r in (json.loads(l) for l in open(sys.argv[1]) if l.startswith("{"))}
print(f"| {'run':16} | {'exit':>4} | {'weights sha256':16} | {'step 1 grad_norm':>16} | {'median step s':>13} | killed")
print(f"|{'-'*18}|{'-'*6}|{'-'*18}|{'-'*18}|{'-'*15}|------")
for r in rows.values():
    n1 = f"{r['norms'][0]:.6f}" if r["norms"] else "-"
    t = f"{r['step_s']:.4f}" if r["step_s"] else "-"
    print(f"| {r['name']:16} | {r['rc']:4} | {r['hash']:16} | {n1:>16} | {t:>13} | {r['killed']}")
det = [rows[k] for k in ("det_a", "det_b", "det_kill_worker", "det_kill_optim") if k in rows]
same_w = len(det) >= 2 and len({r["hash"] for r in det}) == 1 and det[0]["hash"] != "-"
same_n = len(det) >= 2 and len(det[0]["norms"]) > 0 and all(r["norms"] == det[0]["norms"] for r in det)
print(f"default (deterministic) runs ({', '.join(r['name'] for r in det)}): weights bit-identical: {same_w}; "
      f"every step's grad_norm identical: {same_n}")
nd = [rows[k] for k in ("nondet_a", "nondet_b") if k in rows]
if len(nd) == 2:
    print(f"runtime.deterministic = false, two uninterrupted runs: grad_norms identical: {nd[0]['norms'] == nd[1]['norms']}"
          f" ({nd[0]['norms'][:2]} vs {nd[1]['norms'][:2]})")
if det and nd and det[0]["step_s"] and nd[0]["step_s"]:
    a, b = det[0]["step_s"], nd[0]["step_s"]
    print(f"median step: deterministic {a:.4f} s, cuDNN attention backward {b:.4f} s: {100 * (a / b - 1):+.1f}%")
PY
