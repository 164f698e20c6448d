#!/bin/bash
# Lean host state on a GPU host, from the repo root: the Qwen3-8B shape (random init, seq 4096, bf16
# gradients, clipping) at 8k and 64k tokens per step in exact mode (fp32 optimizer state, streaming
# the master, and at 8k also the bf16 copy) and in bf16-state mode, once in gpu_mem = 24G; the
# FSDP2 offload peer at 8B; Qwen3-1.7B at 8k with weights_source = bf16_copy and = master, and
# with bf16 state.
# Per run: exit status, median step time, the planner's prediction, the weights source, peak host
# memory (the job's /dev/shm objects plus its processes' private RSS, sampled every 0.5 s), peak GPU
# memory (nvidia-smi, the whole process), and host bytes per parameter. Prints one table; logs in $OUT.
# Needs .gpudeps/ as gpu_build.sh's header says, plus .gpudeps/torch_peer.py (a copy of the peer).
# ONLY="name ..." runs just those runs; DEADLINE caps the call's seconds (runs that would not fit are
# skipped, most important first); BASE_LAUNCH=path runs the 1.7B exact-mode job also with that
# slidedp-launch (older code to compare with, e.g. built from 82a625b, before weights_source);
# ROUNDS_17=N repeats the 1.7B runs. With NO_BUILD=1 it expects the caller to have sourced
# bench/gpu_build.sh already. What auto would choose for the 8B exact-mode job on this host is
# logged from slidedp-plan.
[ -n "${NO_BUILD:-}" ] || . bench/gpu_build.sh
peer=$deps/torch_peer.py
w=/tmp/issue19
rm -rf "$w" && mkdir -p "$w"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
shm_at_least 120 126G
log "/dev/shm: $(df -h --output=size,avail /dev/shm | tail -1); $(free -g | grep Mem); cores $(nproc); $(nvidia-smi --query-gpu=name --format=csv,noheader)"
random_tokens "$w/train.bin" 2000000
job() { host_job "$w" "$@"; }
deadline=${DEADLINE:-570}
left() { local l=$((deadline - SECONDS)); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
wanted() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" ${1%_r[0-9]*} "* ]]; }
: > "$out/issue19.results"
# ours NAME SECONDS LAUNCH OVERRIDES...: one job, sampled; a line of JSON in issue19.results
ours() {
    wanted "$1" || return 0
    local name=$1 limit=$(left $2) launch=$3
    shift 3
    [ "$limit" -lt 30 ] && { log "$name: skipped (no time left)"; return; }
    rm -rf "$w/log" "$w/ckpt"
    "$build/slidedp-plan" "$w/job.ini" "$@" --json > "$out/$name.plan.json" 2> "$out/$name.plan.err"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$out/${name}_gpu.log" 2>&1 &
    local smi=$!
    timeout "$limit" "$launch" "$w/job.ini" "$@" > "$out/$name.log" 2>&1 &
    local pid=$!
    ( while kill -0 $pid 2>/dev/null; do host_bytes $pid "$out/$name.log"; sleep 0.5; done ) > "$out/${name}_host.log" &
    local sampler=$!
    wait $pid
    local rc=$?
    kill $smi 2>/dev/null
    wait $smi $sampler 2>/dev/null
    cp "$w/log/metrics.jsonl" "$out/$name.metrics.jsonl" 2>/dev/null
    python3 - "$name" "$rc" "$out" "$*" <<'PY' | tee -a "$out/issue19.results"
import json, sys, statistics as st
name, rc, out, args = sys.argv[1:]
def lines(path):
    try:
        return [l for l in open(path) if l.strip()]
    except OSError:
        return []
rows = [json.loads(l) for l in lines(f"{out}/{name}.metrics.jsonl")]
x = [r["step_s"] for r in rows][2:]
gpu = [int(l) for l in lines(f"{out}/{name}_gpu.log") if l.strip().isdigit()]
host = [int(l) for l in lines(f"{out}/{name}_host.log") if l.strip().isdigit()]
try:
    plan = json.load(open(f"{out}/{name}.plan.json"))
    params, planned = plan["job"]["params"], plan["host_memory"]["total"]
    source = plan["plan"]["weights_source"]
    largest = {k: v["largest_model"]["layers"] for k, v in plan["host_memory"]["modes"].items()}
except (OSError, ValueError, KeyError):
    params, planned, largest, source = float("nan"), float("nan"), {}, "-"
err = [l.strip() for l in lines(f"{out}/{name}.log") if "slidedp-launch:" in l][:1]
print(json.dumps({"name": name, "rc": int(rc), "measured": st.median(x) if x else float("nan"),
                  "predicted": rows[0]["predicted_step_s"] if rows else float("nan"),
                  "peak_host": max(host) if host else float("nan"), "peak_gpu_mib": max(gpu) if gpu else float("nan"),
                  "params": params, "planned_host": planned, "largest_layers": largest, "source": source, "args": args,
                  "error": err[0] if err else ""}))
PY
    "$build/slidedp-launch" --clean "$w/job.ini" "$@" > /dev/null 2>&1
}
peer_run() { # NAME SECONDS ARGS...
    wanted "$1" || return 0
    local name=$1 limit=$(left $2)
    shift 2
    [ "$limit" -lt 30 ] && { log "$name: skipped (no time left)"; return; }
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$out/${name}_gpu.log" 2>&1 &
    local smi=$!
    timeout "$limit" python3 "$peer" "$@" > "$out/$name.log" 2>&1
    local rc=$?
    kill $smi 2>/dev/null
    local t=$(peer_step "$out/$name.log")
    log "$name: exit $rc, step ${t:-nan} s, peak GPU $(sort -n "$out/${name}_gpu.log" | tail -1) MiB; last lines:"
    tail -3 "$out/$name.log" | tee -a "$out/summary.log"
}
bf16g="runtime.grad_dtype=bf16"
# most important first: a run that would pass the deadline is skipped
job qwen3-8b 5
"$build/slidedp-plan" "$w/job.ini" $bf16g --json > "$out/q8_8k_auto.plan.json" 2>&1
log "8B, 8k, exact, weights_source = auto: $(python3 -c "import json,sys; p=json.load(open(sys.argv[1])); \
print(p['plan']['weights_source'], p['host_memory']['total'] / p['job']['params'], 'B/param;', \
p['host_memory']['weights_source']['reason'])" "$out/q8_8k_auto.plan.json" 2>&1)"
ours q8_8k_exact 110 "$build/slidedp-launch" $bf16g runtime.weights_source=master
ours q8_8k_copy 110 "$build/slidedp-launch" $bf16g runtime.weights_source=bf16_copy
ours q8_8k_bf16 100 "$build/slidedp-launch" $bf16g train.optimizer_state=bf16
# 1.7B: steps within a few percent of each other, so 16 steps (medians of 14), and ROUNDS_17 rounds
# of the runs interleaved (names _r2, _r3, ... after the first)
job qwen3-1.7b 16
for round in $(seq "${ROUNDS_17:-1}"); do
    r=$([ "$round" -gt 1 ] && echo "_r$round")
    ours q17_8k_copy$r 60 "$build/slidedp-launch" runtime.weights_source=bf16_copy
    [ -n "${BASE_LAUNCH:-}" ] && ours q17_8k_main$r 60 "$BASE_LAUNCH"
    ours q17_8k_master$r 60 "$build/slidedp-launch" runtime.weights_source=master
    ours q17_8k_bf16$r 60 "$build/slidedp-launch" train.optimizer_state=bf16
done
job qwen3-8b 3
ours q8_64k_exact 100 "$build/slidedp-launch" $bf16g train.grad_accum=8 runtime.weights_source=master
ours q8_64k_bf16 100 "$build/slidedp-launch" $bf16g train.grad_accum=8 train.optimizer_state=bf16
job qwen3-8b 5
ours q8_8k_exact_24g 100 "$build/slidedp-launch" $bf16g runtime.gpu_mem=24G runtime.weights_source=master
peer_run fsdp2_offload_8b_8k 120 8b offload 4096 2 1 3
python3 - "$out/issue19.results" <<'PY' | tee -a "$out/summary.log"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
G = 1024 ** 3
print(f"| {'run':18} | {'exit':>4} | {'source':9} | {'step s':>7} | {'predicted':>9} | {'error':>7} | {'host GiB':>8} | "
      f"{'B/param':>7} | {'GPU GiB':>7} | largest layers fp32/bf16 |")
print(f"|{'-'*20}|{'-'*6}|{'-'*11}|{'-'*9}|{'-'*11}|{'-'*9}|{'-'*10}|{'-'*9}|{'-'*9}|{'-'*26}|")
for r in rows:
    m, p = r["measured"], r["predicted"]
    err = 100 * (p - m) / m if m == m and m else float("nan")
    ll = r["largest_layers"]
    print(f"| {r['name']:18} | {r['rc']:4} | {r['source']:9} | {m:7.3f} | {p:9.3f} | {err:+6.1f}% | {r['peak_host'] / G:8.2f} | "
          f"{r['peak_host'] / r['params']:7.2f} | {r['peak_gpu_mib'] / 1024:7.2f} | "
          f"{ll.get('fp32', '-')}/{ll.get('bf16', '-')} |")
for r in rows:
    print(f"{r['name']}: {r['args']}; planned host {r['planned_host'] / G:.2f} GiB"
          f" ({r['planned_host'] / r['params']:.2f} B/param){'; ' + r['error'] if r['error'] else ''}")
PY
