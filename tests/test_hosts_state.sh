#!/bin/bash
# Several hosts end to end (docs/design.md §11.3-§11.4, issue 28): every checkpoint and final/ of
# two hosts, sharded and replicated, bit-identical to one host's, also while host 0 writes slowly
# (the other host's next state must not tear them); a final export slower than the old 60 s bound
# of hosts_finalize; a finished job relaunched exits 0; hosts that do not share checkpoint.dir are
# refused; `--clean` outside mpirun removes every host's objects.
. "$SD_SOURCE/tests/runs_lib.sh"

write_job 5 1
run_one ref 1 4 || { cat ref.log; fail "reference"; }

# 1. every checkpoint of every step and final/, with no fault, and with host 0 slowed down for
# 400 ms before each checkpoint it writes (host 1, released once it sent its state, runs ahead)
for mode in sharded replicated; do
    run_two plain-$mode $mode "" "" || { cat plain-$mode.log; fail "2 hosts, $mode"; }
    same_run plain-$mode ref && echo "ok: 2 hosts $mode: step-1..5 and final/ bit-identical to one host"
    run_two slow-$mode $mode SLIDEDP_DELAY_AT=launcher_ckpt_writing:all:400 "" ||
        { cat slow-$mode.log; fail "2 hosts, $mode, host 0 slowed"; }
    same_run slow-$mode ref && echo "ok: 2 hosts $mode, host 0 400 ms late at each checkpoint: bit-identical"
done

# 5a. host 0's export takes 65 s (past the 60 s hosts_finalize used to wait): host 1 waits for it
write_job 2 0
run_one ref2 1 4 || { cat ref2.log; fail "reference 2"; }
run_two slowfinal sharded SLIDEDP_DELAY_AT=ckpt_tmp_written:1:65000 "" ||
    { cat slowfinal.log; fail "a 65 s export on host 0 failed the job"; }
cmp ref2/ckpt/final/model.safetensors slowfinal/ckpt/final/model.safetensors || fail "slowfinal: final/ differs"
echo "ok: a 65 s export on host 0: exit 0, final/ bit-identical"

# 5b. the finished job relaunched: exit 0 on every host (mpirun's 0), host 0 says "already finished"
run_two slowfinal sharded "" "" || { tail -n 5 slowfinal.log; fail "relaunch of a finished job: not exit 0"; }
grep -q 'already finished' slowfinal.log || { cat slowfinal.log; fail "no 'already finished'"; }
echo "ok: a finished 2-host job relaunched exits 0 on both hosts"

# 5c. hosts that do not share checkpoint.dir: host 1 sees an empty directory of its own there (a
# bind mount in its own mount namespace); host 0's checkpoints of a first run are step-2 and step-4,
# so the relaunch finds step-4 on host 0 and nothing on host 1: refused with one line, exit 2
write_job 4 2
mkdir -p split/ckpt private
split_run() {
    local args=(job.ini runtime.gpus=1 train.grad_accum=2 log.dir=split checkpoint.dir=split/ckpt "$@")
    timeout 300 mpirun --oversubscribe -np 1 "$B/slidedp-launch" "${args[@]}" : -np 1 unshare -m \
        bash -c 'mount --bind private split/ckpt && exec "$0" "$@"' "$B/slidedp-launch" "${args[@]}" >>split.log 2>&1
}
split_run || { cat split.log; fail "split: the first run"; }
[ -d split/ckpt/step-4 ] && [ -z "$(ls private)" ] || fail "split: the bind mount did not hide host 0's checkpoints"
split_run train.steps=6
rc=$?
[ $rc = 2 ] && grep -q 'checkpoint.dir' split.log || { cat split.log; fail "hosts seeing different checkpoints: exit $rc"; }
echo "ok: hosts seeing different checkpoints: exit 2: $(grep -m1 'checkpoint.dir' split.log)"

# 5d. --clean outside mpirun removes the objects of every host of the job: host 0 stops itself
# (SIGSTOP) at step 1, mpirun is killed, every launcher dies, their objects stay
write_job 4 0
SLIDEDP_CRASH_AT=launcher_logged:1:stop timeout 300 mpirun --oversubscribe -np 2 "$B/slidedp-launch" job.ini \
    runtime.gpus=1 train.grad_accum=2 log.dir=clean checkpoint.dir=clean/ckpt >clean.log 2>&1 &
mp=$!
for ((i = 0; i < 600; i++)); do
    job=$(job_of clean)
    [ -n "$job" ] && [ -e "/dev/shm/slidedp.$job-h1.ctl" ] && [ -e "/dev/shm/slidedp.$job-h0.ctl" ] &&
        grep -q 'stopped' "/proc/$(od -An -t d4 -j 88 -N 4 "/dev/shm/slidedp.$job-h0.ctl" | tr -d ' ')/status" 2>/dev/null &&
        break
    sleep 0.1
done
pids=$(for h in 0 1; do od -An -t d4 -j 88 -N 4 "/dev/shm/slidedp.$job-h$h.ctl"; done)
# shellcheck disable=SC2086
kill -9 $pids
wait $mp
for pid in $pids; do
    for ((i = 0; i < 300; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
done
ls /dev/shm/slidedp."$job"-h1.* >/dev/null 2>&1 || fail "clean: host 1 left no objects to remove"
"$B/slidedp-launch" --clean job.ini log.dir=clean checkpoint.dir=clean/ckpt >>clean.log 2>&1 || fail "--clean"
left=$(ls /dev/shm | grep -c "^slidedp\.$job")
[ "$left" = 0 ] || { ls /dev/shm | grep "$job"; fail "--clean left $left objects"; }
echo "ok: --clean outside mpirun removed both hosts' objects"
echo "PASS"
