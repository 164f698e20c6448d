# Sourced by the shell tests of checkpoints across faults and hosts (test_hosts_state.sh,
# test_run_identity.sh, test_sweep.sh): a scratch directory, a tiny job, one-host and mpirun runs,
# and the comparison of every checkpoint and final/ with an uninterrupted one-host run's.
set -u
B=${SD_BUILD:?}
S=${SD_SOURCE:?}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
export OMPI_MCA_rmaps_base_oversubscribe=1
T=$(mktemp -d /tmp/sd-runs.XXXXXX)
# a host killed by mpirun leaves its shm objects; a failed test removes those of its jobs
cleanup() {
    local log job
    for log in "$T"/*.log; do
        job=$(sed -n 's/^slidedp: job \([0-9a-f]\{12\}\).*/\1/p' "$log" 2>/dev/null | head -n 1)
        [ -n "$job" ] && rm -f /dev/shm/slidedp."$job".* /dev/shm/slidedp."$job"-h*
    done
    rm -rf "$T"
}
trap cleanup EXIT
cd "$T" || exit 1
fail() { echo "FAIL: $*"; exit 1; }

SEED=7
echo "# seed $SEED"
"$B/slidedp-data" copy --out data --seq-len 32 --train 2000 --val 64 --seed 1 >/dev/null || fail "slidedp-data"
# write_job STEPS EVERY: job.ini, every checkpoint kept
write_job() {
    cat >job.ini <<EOF
[model]
path = $S/examples/tiny-qwen3
init = random
[data]
train = data/train.bin
val = data/val.bin
val_every = 3
val_sequences = 16
seq_len = 32
[train]
micro_batch = 2
steps = $1
lr = 3e-3
warmup = 2
seed = $SEED
[checkpoint]
every = $2
keep = 1000
[runtime]
device = cpu
layers_per_chunk = 1
optim_procs = 2
optim_threads = 1
EOF
}

# one host: name gpus grad_accum [overrides...]; the exit code is returned, output in name.log (both
# kinds of run end after RUN_TIMEOUT seconds, 300 unless set)
run_one() {
    local name=$1 gpus=$2 accum=$3
    shift 3
    timeout "${RUN_TIMEOUT:-300}" "$B/slidedp-launch" job.ini runtime.gpus="$gpus" train.grad_accum="$accum" log.dir="$name" \
        checkpoint.dir="$name/ckpt" "$@" >>"$name.log" 2>&1
}
# two hosts: name host_state "env of host 0" "env of host 1" [overrides...] (one rank, two micro-steps each)
run_two() {
    local name=$1 mode=$2 env0=$3 env1=$4
    shift 4
    local args=(job.ini runtime.gpus=1 train.grad_accum=2 runtime.host_state="$mode" log.dir="$name"
        checkpoint.dir="$name/ckpt" "$@")
    # shellcheck disable=SC2086
    timeout "${RUN_TIMEOUT:-300}" mpirun --oversubscribe -np 1 env $env0 "$B/slidedp-launch" "${args[@]}" : \
        -np 1 env $env1 "$B/slidedp-launch" "${args[@]}" >>"$name.log" 2>&1
}
job_of() { sed -n 's/^slidedp: job \([0-9a-f]\{12\}\).*/\1/p' "$1.log" | head -n 1; }

# trainer_state.json without what names the run (run_id): the same for every run of one job
trainer_state() { grep -v '"run_id"' "$1"; }
# same_run NAME REF [DIRS]: NAME's every checkpoint, final/ and metrics are REF's, bit for bit, and no
# shm is left; prints one line. NAME holds the checkpoints REF holds, or with DIRS ("step-2 ... final")
# at least those, and any other of its checkpoints (a stop's) must be in REF too
same_run() {
    local name=$1 ref=$2 d
    local want=${3:-$(cd "$ref/ckpt" && echo step-* final)} have
    have=$(cd "$name/ckpt" 2>/dev/null && echo step-* final)
    for d in $want; do
        [[ " $have " == *" $d "* ]] || { tail -n 30 "$name.log"; fail "$name: $d missing (it has $have)"; }
    done
    [ $# = 3 ] || [ "$have" = "$want" ] || { tail -n 30 "$name.log"; fail "$name: checkpoints $have, $ref has $want"; }
    for d in $have; do
        [ "$d" = final ] && continue
        [ -d "$ref/ckpt/$d" ] || { tail -n 30 "$name.log"; fail "$name: $d is not a checkpoint of $ref"; }
        cmp -s "$ref/ckpt/$d/model.safetensors" "$name/ckpt/$d/model.safetensors" &&
            cmp -s "$ref/ckpt/$d/optimizer.safetensors" "$name/ckpt/$d/optimizer.safetensors" &&
            cmp -s <(trainer_state "$ref/ckpt/$d/trainer_state.json") <(trainer_state "$name/ckpt/$d/trainer_state.json") ||
            { tail -n 30 "$name.log"; fail "$name: $d differs from $ref's"; }
    done
    cmp -s "$ref/ckpt/final/model.safetensors" "$name/ckpt/final/model.safetensors" ||
        { tail -n 30 "$name.log"; fail "$name: final/ differs from $ref's"; }
    diff <(cut -d, -f1-4 "$ref/metrics.jsonl") <(cut -d, -f1-4 "$name/metrics.jsonl") >/dev/null ||
        fail "$name: metrics differ from $ref's"
    local job
    job=$(job_of "$name")
    ls /dev/shm | grep -q "^slidedp\.$job" && fail "$name: shared memory left in /dev/shm"
    return 0
}
