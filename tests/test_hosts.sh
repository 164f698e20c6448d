#!/bin/bash
# Several hosts on this machine (mpirun --oversubscribe, CPU backend, docs/design.md §11): the final
# weights of H hosts x G ranks x A micro-steps are bit-identical to one host with H*A micro-steps,
# in both host_state modes, also when a worker of host 1 is killed, and after host 1's launcher is
# killed (every host stops, a relaunch resumes from the checkpoint), also host 1's optimizers; the
# shm per host of both modes; host 0 alone prints the steps.
. "$SD_SOURCE/tests/runs_lib.sh"
write_job 8 2

# one host: name gpus grad_accum
run_ref() {
    "$B/slidedp-launch" job.ini runtime.gpus="$2" train.grad_accum="$3" log.dir="$1" checkpoint.dir="$1/ckpt" \
        >"$1.log" 2>&1 || { cat "$1.log"; fail "reference $1"; }
}
# several hosts: name hosts gpus grad_accum host_state [env assignments for every host...]
run_hosts() {
    local name=$1 hosts=$2 gpus=$3 accum=$4 mode=$5
    shift 5
    env "$@" timeout 120 mpirun --oversubscribe -np "$hosts" "$B/slidedp-launch" job.ini runtime.gpus="$gpus" \
        train.grad_accum="$accum" runtime.host_state="$mode" log.dir="$name" checkpoint.dir="$name/ckpt" \
        >>"$name.log" 2>&1
}
# final weights bit for bit, and every step's loss and gradient norm as one host logged them
same() {
    cmp "$1/ckpt/final/model.safetensors" "$2/ckpt/final/model.safetensors" ||
        { cat "$1.log"; fail "$1: final weights differ from $2's"; }
    diff <(cut -d, -f1-4 "$2/metrics.jsonl") <(cut -d, -f1-4 "$1/metrics.jsonl") ||
        fail "$1: metrics differ from $2's"
    ls /dev/shm | grep -q "^slidedp\.$(job_of "$1")" && fail "$1: shared memory left in /dev/shm"
    echo "ok: $1 bit-identical to $2"
}

run_ref ref2 1 4
run_ref ref3 2 3
for mode in replicated sharded; do
    run_hosts h2-$mode 2 1 2 $mode || { cat h2-$mode.log; fail "2 hosts, $mode"; }
    same h2-$mode ref2
    # host 0 alone prints the header and the steps; the others only their own problems
    [ "$(grep -c '^step ' h2-$mode.log)" = "$(grep -c '^step ' ref2.log)" ] &&
        [ "$(grep -c '^slidedp: job ' h2-$mode.log)" = 1 ] && [ "$(grep -c '^done (host' h2-$mode.log)" = 0 ] ||
        { cat h2-$mode.log; fail "h2-$mode: other hosts print step lines"; }
    echo "ok: h2-$mode prints $(grep -c '^step ' h2-$mode.log) step lines, as one host does"
    run_hosts h3-$mode 3 2 1 $mode || { cat h3-$mode.log; fail "3 hosts, $mode"; }
    same h3-$mode ref3
done

# kill -9 a worker of host 1 (global rank 1) after it pushed its 9th gradient: restarted there
run_hosts kw 2 1 2 sharded SLIDEDP_CRASH_AT=worker_pushed:9:r1 || { cat kw.log; fail "worker kill"; }
grep -q "worker 1 died from signal 9" kw.log || { cat kw.log; fail "the worker of host 1 was not killed"; }
same kw ref2

# kill -9 host 1's optimizers (only host 1's environment names the points): restarted there
for mode in replicated sharded; do
    args=(job.ini runtime.gpus=1 train.grad_accum=2 runtime.host_state=$mode log.dir=ko-$mode checkpoint.dir=ko-$mode/ckpt)
    timeout 120 mpirun --oversubscribe -np 1 "$B/slidedp-launch" "${args[@]}" : \
        -np 1 env SLIDEDP_CRASH_AT=optim_reduced:7,optim_updated:5:r1 "$B/slidedp-launch" "${args[@]}" \
        >ko-$mode.log 2>&1 || { cat ko-$mode.log; fail "optimizer kill, $mode"; }
    grep -q "optimizer 1 died from signal 9" ko-$mode.log || { cat ko-$mode.log; fail "no optimizer of host 1 killed"; }
    same ko-$mode ref2
done

# kill -9 host 1's launcher when it logs step 5 (host 0 has written step-2 by then: its step-3
# update waits for it; replicated, it also writes the committed step when it stops): every host
# stops with a message naming the lost one, a relaunch resumes from a checkpoint
for mode in replicated sharded; do
    run_hosts kl-$mode 2 1 2 $mode SLIDEDP_CRASH_AT=launcher_logged:5:r1 && { cat kl-$mode.log; fail "survived"; }
    grep -q "exited on signal 9" kl-$mode.log || { cat kl-$mode.log; fail "no message names the lost host"; }
    grep -q "host 0: SIGTERM received" kl-$mode.log || { cat kl-$mode.log; fail "host 0 did not stop"; }
    run_hosts kl-$mode 2 1 2 $mode || { cat kl-$mode.log; fail "resume after a lost host ($mode)"; }
    grep -q "resuming from checkpoint step-[2-7]" kl-$mode.log || { cat kl-$mode.log; fail "did not resume"; }
    same kl-$mode ref2
done

# shm per host, replicated against sharded: host 0's launcher stops itself (SIGSTOP) when it logs
# step 3, which holds every host still; du counts the pages the objects hold
shm_kib() {
    local name=$1 mode=$2
    SLIDEDP_CRASH_AT=launcher_logged:3:r0:stop timeout 120 mpirun --oversubscribe -np 2 "$B/slidedp-launch" job.ini \
        runtime.gpus=1 train.grad_accum=2 runtime.host_state="$mode" log.dir="$name" checkpoint.dir="$name/ckpt" \
        >"$name.log" 2>&1 &
    local mpirun=$! pid="" i job=""
    # the launcher's pid from its ctl object (ctl_header.launcher_pid, at byte 88), then its state
    for ((i = 0; i < 1200; i++)); do
        [ -n "$pid" ] && break
        job=$(job_of "$name")
        local ctl=/dev/shm/slidedp.$job-h0.ctl p=""
        [ -n "$job" ] && [ -e "$ctl" ] && p=$(od -An -t d4 -j 88 -N 4 "$ctl" | tr -d ' ')
        [ -n "$p" ] && [ "$(awk '{print $3}' /proc/"$p"/stat 2>/dev/null)" = T ] && pid=$p
        sleep 0.1
    done
    [ -n "$pid" ] || { cat "$name.log"; fail "$name: host 0 never stopped at step 3"; }
    for h in 0 1; do
        echo "# $mode host $h: $(du -k /dev/shm/slidedp."$job"-h$h.* | awk '{printf "%s %s KiB  ", $2, $1}')"
        eval "${mode}_h$h=\$(du -kc /dev/shm/slidedp.$job-h$h.master | tail -n 1 | cut -f1)"
    done
    kill -CONT "$pid"
    wait "$mpirun" || { cat "$name.log"; fail "$name after the measurement"; }
    same "$name" ref2
}
shm_kib shm-replicated replicated
shm_kib shm-sharded sharded
echo "# master region per host (KiB): replicated $replicated_h0 $replicated_h1, sharded $sharded_h0 $sharded_h1"
# the model's chunks split about evenly: each sharded host holds a bit over half the fp32 state
for h in 0 1; do
    eval "rep=\$replicated_h$h shard=\$sharded_h$h"
    [ "$shard" -lt $((rep * 3 / 4)) ] || fail "host $h: sharded master region $shard KiB is not below 3/4 of $rep KiB"
done
echo "PASS"
