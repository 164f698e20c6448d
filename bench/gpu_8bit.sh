#!/bin/bash
# 8-bit optimizer state on a GPU host (issue 32), from the repo root, in one call under 9 minutes:
# the host calibrated anew (its adamw_8bit_rate curve, which examples/h200-host.json predates) and
# bench_optim's rates per state (over anonymous memory, POSIX shm and locked shm); the Qwen3-14B
# shape (random init, seq 4096, 8k tokens per step, clipping, bf16 gradients) in 8-bit state,
# uninterrupted and with its first worker killed (kill -9) after step 2, whose step losses and
# norms must equal the uninterrupted run's; Qwen3-8B and
# Qwen3-1.7B at 8k in fp32, bf16 and 8-bit state. Runs that would pass the deadline are skipped and
# say so: run them in a second call with ONLY="name ...".
# Per run: exit status, median step time, the planner's prediction, peak host memory (the job's
# /dev/shm objects plus its processes' RSS, summed every 0.5 s: host_bytes in gpu_build.sh), peak
# GPU memory (nvidia-smi), bytes per parameter, and the prediction again from a calibration at the
# end of the call (a fresh machine's first one can read low). Prints one table; logs in $OUT
# (gpu_build.sh).
# Needs .gpudeps/ as gpu_build.sh's header says. ONLY="name ..." runs just those runs; DEADLINE
# caps the call's seconds (default 530; runs that would not fit are skipped, most important first).
# With NO_BUILD=1 it expects the caller to have sourced bench/gpu_build.sh already.
# GRID=17 or GRID=8 runs instead the plan grid of Qwen3-1.7B or Qwen3-8B at 8k (one call each, after
# the calibration): without and with clipping, the auto plan beside each update mode x weights
# source x optimizer processes and threads the engine accepts; the summary gives, per group, the
# fastest measured plan and how far auto is from it (goal: within 5%), and every plan's prediction
# from this host's calibration and from examples/h200-host.json against its step (goal: within 15%).
# GRID_CLIP=nc or GRID_CLIP=c runs one half of a grid (without or with clipping). GRID_REPEAT=N runs
# every plan of a group N times, every other pass in reverse order, and pools each plan's steps (with
# GRID_ROUNDS=0 the reruns of auto and the fastest are left out). A group's named
# plan that auto chose is not run again (auto's run measures it). The 1.7B grid (11 runs of about
# 22 s, 4 more with GRID_ROUNDS=1) fits one call with the calibrations; the 8B one (4 runs of about
# 70 s with GRID_ROUNDS=0, 4 more with 1) fits one call without its reruns, or a call for each half.
[ -n "${NO_BUILD:-}" ] || . bench/gpu_build.sh
w=/tmp/issue32
rm -rf "$w" && mkdir -p "$w"
shm_at_least 120 126G
log "/dev/shm: $(df -h --output=size,avail /dev/shm | tail -1); $(free -g | grep Mem); cores $(nproc); $(nvidia-smi --query-gpu=name --format=csv,noheader)"
log "cpu: $(lscpu | sed -n 's/^Model name: *//p'); $(grep -o -w -e vaes -e avx512f -e aes /proc/cpuinfo | sort -u | tr '\n' ' ')"
random_tokens "$w/train.bin" 2000000
deadline=${DEADLINE:-530}
left() { local l=$((deadline - SECONDS)); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
# with GRID set, the calibration and that grid's runs (g17_*, g8_*) unless ONLY names others
[ -n "${GRID:-}" ] && : "${ONLY:=calibrate}"
wanted() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]] || [[ -n "${GRID:-}" && "$1" == g${GRID}_* ]]; }

# job MODEL STEPS (gpu_build.sh host_job); the runs add bf16 gradients
job() { host_job "$w" "$@"; }
bf16g=runtime.grad_dtype=bf16

# The host's calibration, fresh: the planner's 8-bit rate is measured, not the fallback estimate.
if wanted calibrate && [ "$(left 90)" -ge 60 ]; then
    job qwen3-1.7b 1
    timeout "$(left 90)" "$build/slidedp-plan" "$w/job.ini" --recalibrate --json > "$out/calibration.json" 2>&1
    log "calibrated (threads: G units/s): $(python3 -c "import json,sys; c=json.load(open(sys.argv[1]))['calibration']['host']; \
print('; '.join(k + ' ' + ' '.join(f\"{p['threads']}:{p['value'] / 1e9:.2f}\" for p in c[k]) for k in \
('memcpy_bw', 'adamw_fp32_rate', 'adamw_bf16_rate', 'adamw_8bit_rate', 'sumsq_bf16_rate')))" "$out/calibration.json" 2>&1)"
fi

# the update's rate per state on this host's threads (the optimizer's cores: all but one), its
# arrays in anonymous memory (as the calibration's), in POSIX shm (as the job's m and v) and in shm
# locked (as the master and gradients the workers register): after the runs and the calibration at
# the end, or with GRID before
# the grid (ONLY="calibrate bench_optim" adds it there)
bench_optim_runs() {
    for mem in anon shm shm-locked; do
        if wanted bench_optim && [ "$(left 40)" -ge 30 ]; then
            timeout "$(left 40)" "$build/bench_optim" 128 "$(($(nproc) - 1))" $mem > "$out/bench_optim_$mem.log" 2>&1
            grep -E 'RESULT staged|isa' "$out/bench_optim_$mem.log" | tee -a "$out/summary.log"
        fi
    done
}
[ -n "${GRID:-}" ] && bench_optim_runs

: > "$out/issue32.results"
vmstat_keys='^(pgscan_kswapd|pgscan_direct|pgsteal_kswapd|pgsteal_direct|compact_stall|compact_fail|thp_fault_fallback|pgmajfault|allocstall_normal|kswapd_low_wmark_hit_quickly|kswapd_high_wmark_hit_quickly) '
# run NAME SECONDS KILL OVERRIDES...: one job (KILL: none, or worker to kill -9 the first worker
# after step 2), sampled; a line of JSON in issue32.results
run() {
    wanted "$1" || return 0
    local name=$1 limit=$(left $2) kill=$3
    shift 3
    [ "$limit" -lt 30 ] && { log "$name: skipped (no time left)"; return; }
    rm -rf "$w/log" "$w/ckpt"
    cp "$w/job.ini" "$w/$name.ini" # the job as this run took it, for the predictions at the end
    "$build/slidedp-plan" "$w/job.ini" $bf16g "$@" --json > "$out/$name.plan.json" 2> "$out/$name.plan.err"
    "$build/slidedp-plan" "$w/job.ini" $bf16g "$@" --json --host-calib examples/h200-host.json \
        > "$out/$name.plan_file.json" 2> /dev/null
    # the kernel's reclaim and compaction counters around the run: stop 44's 14B job, at 111 of 125
    # GiB, updated 15-25% slower than the 8B one; on stop 45's host it did not, and none moved
    grep -E "$vmstat_keys" /proc/vmstat > "$out/${name}_vmstat0.log"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$out/${name}_gpu.log" 2>&1 &
    local smi=$!
    "$build/slidedp-launch" "$w/job.ini" $bf16g "$@" > "$out/$name.log" 2>&1 &
    local pid=$!
    # at the deadline the job's processes are killed (-9) and its state removed below (--clean): a
    # SIGTERM would have it write a checkpoint of its last step first, even after a second signal
    # (an 8B job's fp32 state is 115 GB, more than the host's disk)
    ( sleep "$limit"
      local job_id=$(job_id_of "$out/$name.log")
      kill -9 $pid 2>/dev/null && [ -n "$job_id" ] && pkill -9 -f "slidedp-(worker|optim) --job $job_id" ) &
    local guard=$!
    # every 0.5 s: the host bytes, and the optimizers' busy seconds (slidedp-stat, with the time)
    ( while kill -0 $pid 2>/dev/null; do
        host_bytes $pid "$out/$name.log"
        echo "$(date +%s.%N) $("$build/slidedp-stat" --json 2>/dev/null | tr -d '\n')" >> "$out/${name}_stat.log"
        sleep 0.5
    done ) > "$out/${name}_host.log" &
    local sampler=$! killed=""
    if [ "$kill" = worker ]; then
        while kill -0 $pid 2>/dev/null && [ "$(cat "$w/log/metrics.jsonl" 2>/dev/null | wc -l)" -lt 2 ]; do sleep 0.05; done
        local jobname=$(job_id_of "$out/$name.log")
        local victim=$(pgrep -f "slidedp-worker --job $jobname" | head -1)
        if [ -n "$jobname" ] && [ -n "$victim" ] && kill -9 "$victim"; then
            killed="worker pid $victim after step $(cat "$w/log/metrics.jsonl" | wc -l)"
        else
            killed="nothing (job ${jobname:-?}, no worker found)"
        fi
    fi
    wait $pid
    local rc=$?
    kill $guard $smi 2>/dev/null
    wait $smi $sampler 2>/dev/null
    cp "$w/log/metrics.jsonl" "$out/$name.metrics.jsonl" 2>/dev/null
    grep -E "$vmstat_keys" /proc/vmstat > "$out/${name}_vmstat1.log"
    python3 - "$name" "$rc" "$out" "$killed" "$*" "${WARM_STEPS:-2}" <<'PY' | tee -a "$out/issue32.results"
import json, sys, statistics as st
name, rc, out, killed, args, warm = sys.argv[1:]
def lines(path):
    try:
        return [l for l in open(path) if l.strip()]
    except OSError:
        return []
rows = [json.loads(l) for l in lines(f"{out}/{name}.metrics.jsonl")]
x = [r["step_s"] for r in rows][int(warm):]
gpu = [int(l) for l in lines(f"{out}/{name}_gpu.log") if l.strip().isdigit()]
host = [int(l) for l in lines(f"{out}/{name}_host.log") if l.strip().isdigit()]
try:
    plan = json.load(open(f"{out}/{name}.plan.json"))
    params, planned = plan["job"]["params"], plan["host_memory"]["total"]
    largest = {k: v["largest_model"]["layers"] for k, v in plan["host_memory"]["modes"].items()}
    fits = "does not fit" not in open(f"{out}/{name}.plan.err").read()
    chosen = plan["plan"]
    chosen = f"{chosen['weights_source']} {chosen['update_mode']} {chosen['optim_procs']}x{chosen['optim_threads']}"
except (OSError, ValueError, KeyError):
    params, planned, largest, fits, chosen = float("nan"), float("nan"), {}, False, ""
try:
    predicted_file = json.load(open(f"{out}/{name}.plan_file.json"))["predicted"]["step_s"]
    predicted_optim = json.load(open(f"{out}/{name}.plan.json"))["predicted"]["optim_s"]
except (OSError, ValueError, KeyError):
    predicted_file = predicted_optim = float("nan")
# the optimizers' busy and updating seconds, sampled with the job's step (beside the planner's optim_s)
stat = []
for l in lines(f"{out}/{name}_stat.log"):
    t, _, j = l.partition(" ")
    try:
        j = json.loads(j)
        stat.append((float(t), j["step"], [o["busy_s"] for o in j["optimizers"]],
                     [o["update_s"] for o in j["optimizers"]], [o["lane_wait_s"] for o in j["optimizers"]]))
    except (ValueError, KeyError, TypeError):
        pass
# the counters where the job's reported step first reaches each value: from step `warm` on, the
# busiest optimizer's busy seconds per step and its updating part of them (between step changes only:
# a window to the last sample took in the job's teardown and read an 8B step's busy time 30% low)
firsts = {}
for x_ in stat:
    if len(x_[2]) == len(stat[-1][2]):
        firsts.setdefault(x_[1], x_)
steps_seen = sorted(s_ for s_ in firsts if s_ >= int(warm))
optim_busy = optim_update = optim_lane_wait = float("nan")
if len(steps_seen) >= 2:
    a, b = firsts[steps_seen[0]], firsts[steps_seen[-1]]
    n_steps = steps_seen[-1] - steps_seen[0]
    busiest = max(range(len(a[2])), key=lambda k: b[2][k] - a[2][k])
    optim_busy = (b[2][busiest] - a[2][busiest]) / n_steps
    optim_update = (b[3][busiest] - a[3][busiest]) / n_steps
    optim_lane_wait = (b[4][busiest] - a[4][busiest]) / n_steps
err = [l.strip() for l in lines(f"{out}/{name}.log") if "slidedp-launch:" in l][:1]
vm = [dict((k, int(v)) for k, v in (l.split() for l in lines(f"{out}/{name}_vmstat{i}.log"))) for i in (0, 1)]
vmstat = {k: vm[1][k] - vm[0].get(k, 0) for k in vm[1] if vm[1][k] != vm[0].get(k, 0)}
print(json.dumps({"name": name, "rc": int(rc), "measured": st.median(x) if x else float("nan"), "steps": x,
                  "predicted": rows[0]["predicted_step_s"] if rows else float("nan"),
                  "predicted_file": predicted_file, "plan": chosen, "optim_busy": optim_busy,
                  "optim_update": optim_update, "optim_lane_wait": optim_lane_wait,
                  "predicted_optim": predicted_optim,
                  "peak_host": max(host) if host else float("nan"), "peak_gpu_mib": max(gpu) if gpu else float("nan"),
                  "params": params, "planned_host": planned, "plan_fits": fits, "largest_layers": largest,
                  "losses": [r["loss"] for r in rows], "norms": [r["grad_norm"] for r in rows], "killed": killed,
                  "args": args, "vmstat": vmstat, "error": err[0] if err else ""}))
PY
    grep -E 'restarting|died' "$out/$name.log" | head -3 | sed "s/^/$name: /" | tee -a "$out/summary.log"
    "$build/slidedp-launch" --clean "$w/job.ini" $bf16g "$@" > /dev/null 2>&1
}

# most important first: a run that would pass the deadline is skipped
job qwen3-14b 5
run q14_8bit 170 none train.optimizer_state=8bit
run q14_8bit_kill 170 worker train.optimizer_state=8bit
# 100 s a run: on stop 45's H200 host the fp32 run took 81 s, its teardown of 107 GiB included.
# 6 steps: 4 measured after the 2 warm-up steps (with 4 steps, 2 measured did not separate the 8-bit
# and fp32 steps: 2.691, 2.718 against 2.639, 2.807 s)
job qwen3-8b 6
for st in 8bit bf16 fp32; do run q8_$st 100 none train.optimizer_state=$st; done
job qwen3-1.7b 12
for st in 8bit bf16 fp32; do run q17_$st 30 none train.optimizer_state=$st; done
# The plan grid (GRID=17 or GRID=8): per group (model, clipping), auto and every combination of
# weights source x update mode x optimizer processes and threads (1 x 15, 2 x 7, and 1 x 14 where
# the update runs during the backward: the issue's hand-picked plan) the engine accepts (the update
# during the backward needs the bf16 copy and no clipping). The copy of the 8B shape needs more
# host memory than the host has, so its grid streams the master. Steps of one run vary by about
# 5% and identical plans by as much from run to run, so each group then runs auto and its fastest
# plan again, GRID_ROUNDS more times each (default 1), alternating which goes first, and the summary
# pools each plan's steps over its runs. The first WARM_STEPS steps of a run are left out.
grid() { # TAG STEPS SECONDS
    local tag=$1 steps=$2 secs=$3 clip src mode kt round
    job "$( [ "$tag" = 17 ] && echo qwen3-1.7b || echo qwen3-8b)" "$steps"
    for clip in ${GRID_CLIP:-nc c}; do
        local ca=$([ $clip = nc ] && echo train.grad_clip=0)
        run g${tag}_${clip}_auto "$secs" none $ca
        # auto's run measures its own plan: the named run of that plan is left out (one run fewer a
        # group, so that both halves of the 8B grid fit one call)
        local auto_plan
        auto_plan=$(python3 -c "import json,sys
rs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
print(next((r['plan'] for r in reversed(rs) if r['name'] == sys.argv[2] and r['rc'] == 0 and r['steps']), ''))" \
            "$out/issue32.results" "g${tag}_${clip}_auto")
        # the group's named plans ("NAME OVERRIDES..."), run GRID_REPEAT times in all (default 1), every
        # other pass in reverse order, auto's run included (NAME_p2, ...): pooled, their steps show
        # what a plan costs on a host whose runs of one plan differ by 17-22% (stop 45's H200)
        local named=()
        for src in master bf16_copy; do
            [ "$tag" = 8 ] && [ $src = bf16_copy ] && continue
            for mode in after_backward during_backward; do
                [ $mode = during_backward ] && { [ $clip = c ] || [ $src = master ]; } && continue
                for kt in 1x15 2x7 $([ $mode = during_backward ] && echo 1x14); do
                    if [ "$src $mode $kt" = "$auto_plan" ]; then
                        log "g${tag}_${clip}_${src%%_*}_${mode%%_*}_$kt: auto's plan, measured by g${tag}_${clip}_auto"
                        continue
                    fi
                    named+=("g${tag}_${clip}_${src%%_*}_${mode%%_*}_$kt $ca runtime.weights_source=$src \
runtime.update_mode=$mode runtime.optim_procs=${kt%x*} runtime.optim_threads=${kt#*x}")
                done
            done
        done
        local pass i
        for pass in $(seq 1 "${GRID_REPEAT:-1}"); do
            local suffix=$([ "$pass" -gt 1 ] && echo "_p$pass")
            [ "$pass" -gt 1 ] && [ $((pass % 2)) = 1 ] && run g${tag}_${clip}_auto$suffix "$secs" none $ca
            for i in $(if [ $((pass % 2)) = 1 ]; then seq 0 $((${#named[@]} - 1)); else seq $((${#named[@]} - 1)) -1 0; fi); do
                local plan=${named[$i]}
                # shellcheck disable=SC2086 # the overrides split into words
                run ${plan%% *}$suffix "$secs" none ${plan#* }
            done
            [ $((pass % 2)) = 0 ] && run g${tag}_${clip}_auto$suffix "$secs" none $ca
        done
        # the group's fastest plan but auto's own (its name and overrides as the run took them)
        local best
        best=$(python3 - "$out/issue32.results" "g${tag}_${clip}_" <<'PY'
import json, re, sys
rs = [r for r in (json.loads(l) for l in open(sys.argv[1]) if l.startswith("{"))
      if r["name"].startswith(sys.argv[2]) and r["rc"] == 0 and r["measured"] == r["measured"]]
auto = [r["plan"] for r in rs if r["name"].endswith("_auto")]
rs = [r for r in rs if r["plan"] not in auto]
best = min(rs, key=lambda r: r["measured"]) if rs else None
print(f"{re.sub(r'_[rp][0-9]+$', '', best['name'])} {best['args']}" if best else "")
PY
)
        for round in $(seq 2 $((1 + ${GRID_ROUNDS:-1}))); do
            local first=auto
            [ $((round % 2)) = 0 ] && [ -n "$best" ] && first=best
            for which in $first $([ $first = auto ] && echo best || echo auto); do
                if [ $which = auto ]; then
                    run g${tag}_${clip}_auto_r$round "$secs" none $ca
                elif [ -n "$best" ]; then
                    # shellcheck disable=SC2086 # the overrides split into words
                    run ${best%% *}_r$round "$secs" none ${best#* }
                fi
            done
        done
    done
}
if [ -n "${GRID:-}" ]; then
    export WARM_STEPS=${WARM_STEPS:-4}
    [ "$GRID" = 17 ] && grid 17 16 34
    [ "$GRID" = 8 ] && grid 8 6 90
fi

# The host calibrated again at the end (RECALIBRATE_END=0 skips it), and every run predicted again
# from it ("predicted_end"): stop 44's first calibration of a fresh machine read its memory and
# updates 25-35% low against one minutes later, and so did the call's predictions
# (docs/performance.md §12.4). The two calibrations' 15-thread rates go to the summary.
if [ "${RECALIBRATE_END:-1}" = 1 ] && [ "$(left 90)" -ge 70 ] && [ -s "$out/issue32.results" ]; then
    job qwen3-1.7b 1
    timeout "$(left 90)" "$build/slidedp-plan" "$w/job.ini" --recalibrate --json > "$out/calibration_end.json" 2>&1
    log "calibrated again at the end (15 threads, G units/s): $(python3 -c "import json,sys
def at15(f):
    c = json.load(open(f), strict=False)['calibration']['host']
    return ' '.join(f\"{k} {next((p['value'] for p in c[k] if p['threads'] == 15), float('nan')) / 1e9:.2f}\" for k in
                    ('memcpy_bw', 'adamw_fp32_rate', 'adamw_bf16_rate', 'adamw_8bit_rate'))
print(at15(sys.argv[2]), '; at the start:', at15(sys.argv[1]))" "$out/calibration.json" "$out/calibration_end.json" 2>&1)"
    # each run's plan again, from the new calibration, for the job as the run took it
    while IFS=$'\t' read -r name args; do
        # shellcheck disable=SC2086 # the run's overrides split into words
        "$build/slidedp-plan" "$w/$name.ini" $bf16g $args --json > "$w/$name.replan.json" 2> /dev/null
    done < <(python3 -c "import json,sys
for l in open(sys.argv[1]):
    if l.startswith('{'):
        r = json.loads(l)
        print(r['name'] + '\t' + r['args'])" "$out/issue32.results")
    python3 - "$out/issue32.results" "$w" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
for r in rows:
    try:
        r["predicted_end"] = json.load(open(f"{sys.argv[2]}/{r['name']}.replan.json"))["predicted"]["step_s"]
    except (OSError, ValueError, KeyError):
        r["predicted_end"] = float("nan")
with open(sys.argv[1], "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
PY
fi

# bench_optim's rates after the calibration at the end, which matters more (stop 45's H200 call had
# time for neither)
[ -z "${GRID:-}" ] && bench_optim_runs

python3 - "$out/issue32.results" <<'PY' | tee -a "$out/summary.log"
import json, sys
rows = {r["name"]: r for r in (json.loads(l) for l in open(sys.argv[1]) if l.startswith("{"))}
G = 1024 ** 3
print(f"| {'run':28} | {'exit':>4} | {'step s':>7} | {'predicted':>9} | {'error':>7} | {'at end':>7} | {'host GiB':>8} | "
      f"{'B/param':>7} | {'planned':>7} | {'GPU GiB':>7} | largest layers fp32/bf16/8bit |")
print(f"|{'-'*30}|{'-'*6}|{'-'*9}|{'-'*11}|{'-'*9}|{'-'*9}|{'-'*10}|{'-'*9}|{'-'*9}|{'-'*9}|{'-'*32}|")
for r in rows.values():
    m, p, pe = r["measured"], r["predicted"], r.get("predicted_end", float("nan"))
    err = 100 * (p - m) / m if m == m and m else float("nan")
    err_end = 100 * (pe - m) / m if m == m and m else float("nan")
    ll = r["largest_layers"]
    print(f"| {r['name']:28} | {r['rc']:4} | {m:7.3f} | {p:9.3f} | {err:+6.1f}% | {err_end:+6.1f}% | {r['peak_host'] / G:8.2f} | "
          f"{r['peak_host'] / r['params']:7.2f} | {r['planned_host'] / r['params']:7.2f} | {r['peak_gpu_mib'] / 1024:7.2f} | "
          f"{ll.get('fp32', '-')}/{ll.get('bf16', '-')}/{ll.get('8bit', '-')} |")
for r in rows.values():
    if r["error"]:
        print(f"{r['name']}: {r['error']}")
    if r.get("vmstat"):
        print(f"{r['name']}: /proc/vmstat over the run: " + " ".join(f"{k} {v}" for k, v in r["vmstat"].items()))
for model in ("q8", "q17"):
    a, b = rows.get(f"{model}_8bit"), rows.get(f"{model}_fp32")
    if a and b:
        print(f"{model}: 8-bit step {a['measured']:.3f} s vs fp32 state {b['measured']:.3f} s: "
              f"{'faster' if a['measured'] < b['measured'] else 'NOT faster'}; plans {a['plan']} / {b['plan']}")
    for r in (rows.get(f"{model}_{mode}") for mode in ("8bit", "bf16", "fp32")):
        if r:
            print(f"  {r['name']}: busiest optimizer {r.get('optim_busy', float('nan')):.3f} s a step, updating "
                  f"{r.get('optim_update', float('nan')):.3f}, its threads waiting for the slowest "
                  f"{r.get('optim_lane_wait', float('nan')):.3f}; predicted {r.get('predicted_optim', float('nan')):.3f}")
a, b = rows.get("q14_8bit"), rows.get("q14_8bit_kill")
if a and b:
    same = a["losses"] == b["losses"] and a["norms"] == b["norms"] and len(a["losses"]) == len(b["losses"]) > 0
    print(f"q14 kill -9 ({b['killed']}): exit {b['rc']}, {len(b['losses'])} steps; losses and norms "
          f"{'EQUAL' if same else 'DIFFER'} to the uninterrupted run's")
    for s, (x, y) in enumerate(zip(a["losses"], b["losses"]), 1):
        print(f"  step {s}: {x!r} {y!r}{'' if x == y else '  <-- differs'}")
    print(f"q14 plan: fits {a['plan_fits']}, host {a['planned_host'] / a['params']:.3f} B/param planned")
# the plan grid: per group, each plan's steps pooled over its runs (auto's with those of the grid
# plan it chose, and reruns NAME_r2 ...), auto against the fastest, and every prediction (this
# host's calibration; h200-host.json's for reference)
import re, statistics
plans = {}
for r in rows.values():
    if r["name"].startswith("g") and r["rc"] == 0 and r.get("steps"):
        group = "_".join(r["name"].split("_")[:2])
        p = plans.setdefault((group, r["plan"]), dict(r, name="", steps=[], runs=0))
        base = re.sub(r"_[rp][0-9]+$", "", r["name"])
        if base.endswith("_auto") or not p["name"]:
            p["name"] = base
        p["steps"] += r["steps"]
        p["runs"] += 1
        for k in ("optim_busy", "optim_update", "optim_lane_wait"):
            p.setdefault(k + "_runs", []).append(r.get(k, float("nan")))
groups = {}
for (group, _), p in plans.items():
    p["measured"] = statistics.median(p["steps"])
    for k in ("optim_busy", "optim_update", "optim_lane_wait"): # the runs' mean
        p[k] = statistics.fmean(p[k + "_runs"])
    groups.setdefault(group, []).append(p)
for g, rs in sorted(groups.items()):
    best = min(rs, key=lambda r: r["measured"])
    print(f"grid {g}: fastest {best['name']} {best['measured']:.3f} s ({best['plan']}; {best['runs']} run(s))")
    for r in (r for r in rs if r["name"].endswith("_auto")):
        print(f"  auto ({r['plan']}; {r['runs']} run(s)) {r['measured']:.3f} s: "
              f"{100 * (r['measured'] / best['measured'] - 1):+.1f}% from the fastest (goal within 5%)")
    for r in sorted(rs, key=lambda r: r["measured"]):
        e, f = (100 * (r[k] / r["measured"] - 1) for k in ("predicted", "predicted_file"))
        print(f"  {r['name']:28} {r['measured']:.3f} s ({r['runs']} run(s), {len(r['steps'])} steps)  predicted "
              f"{r['predicted']:.3f} ({e:+.1f}%){'  <-- over 15%' if abs(e) > 15 else ''}  "
              f"h200-host.json {r['predicted_file']:.3f} ({f:+.1f}%)  busiest optimizer "
              f"{r.get('optim_busy', float('nan')):.3f} s a step (updating {r.get('optim_update', float('nan')):.3f}, "
              f"lanes waiting {r.get('optim_lane_wait', float('nan')):.3f}), "
              f"predicted {r.get('predicted_optim', float('nan')):.3f}")
PY
