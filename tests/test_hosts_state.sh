#!/bin/bash
# Several hosts end to end (docs/design.md §11.3-§11.4, issue 28): every checkpoint and final/ of
# two hosts, sharded and replicated, bit-identical to one host's, also while host 0 writes slowly
# (the other host's next state must not tear them).
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

echo "PASS"
