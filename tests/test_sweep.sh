#!/bin/bash
# Kill-point and delay-point sweeps (issue 28): every named point (common/fault.c fault_points) in
# every process that passes it, on one host and on two hosts (mpirun -np 2) in both host_state
# modes. A clean run of each setup counts the passes (SLIDEDP_FAULT_COUNT); then each (point,
# process) is killed (SLIDEDP_CRASH_AT) or stalled for 1 s (SLIDEDP_DELAY_AT) at its middle pass, in
# a job of its own (a killed launcher: after a relaunch), and every checkpoint, final/ and the
# metrics must be bit-identical to an uninterrupted one-host run's.
# Usage: test_sweep.sh bounded|full. `bounded` (make test) takes the targets at the positions
# 5*(2*setup + action) (mod 32) of each setup's sorted target list, so that kills and delays land on
# launcher, relay, worker and optimizer points alike; `full` (make test-long) takes all.
# SWEEP_SETUPS="one replicated sharded" (the default) names the setups to run.
. "$SD_SOURCE/tests/runs_lib.sh"
SWEEP=${1:-bounded}
RUN_TIMEOUT=150
write_job 5 2
# the reference checkpoints every step: a stop's checkpoint (a lost host, replicated) is compared too
run_one ref 1 4 checkpoint.every=1 || { cat ref.log; fail "reference"; }
EXPECTED="step-2 step-4 step-5 final"
POINTS=$(sed -n '/^const char \*const fault_points\[\] = {/,/NULL};/p' "$S/common/fault.c" | grep -o '"[a-z0-9_]*"' |
    tr -d '"')
echo "# $(echo "$POINTS" | wc -l) named points; sweep: $SWEEP"
[ "$SWEEP" = bounded ] && echo "# bounded rule: setup s (0 one host, 1 two hosts replicated, 2 two hosts sharded)," \
    "action a (0 kill, 1 delay): the targets at positions p of the setup's list (points in fault_points order, then" \
    "host, then process) with p % 32 == 5*(2*s + a)"

# runs setup SETUP as job NAME with the environment ENV on host HOST (0 for one host)
run_setup() {
    local setup=$1 name=$2 host=$3 env=$4
    case $setup in
    one) (
        [ -n "$env" ] && export "${env?}"
        run_one "$name" 1 4
    ) ;;
    replicated | sharded)
        if [ "$host" = 0 ]; then run_two "$name" "$setup" "$env" ""; else run_two "$name" "$setup" "" "$env"; fi ;;
    esac
}

# one target: runs setup $1 as job $2 with the rule $6 on host $3 for process $4 (action $5: 0 kill,
# 1 delay), relaunches after a killed launcher, and compares with the reference
sweep_one() {
    local setup=$1 name=$2 h=$3 proc=$4 a=$5 env=$6 rc
    run_setup "$setup" "$name" "$h" "$env"
    rc=$?
    if [ $a = 0 ] && [ "${proc%%[0-9]*}" = launcher ]; then
        [ $rc != 0 ] || { tail -n 20 "$name.log"; fail "$name: $env: the launcher survived"; }
        run_setup "$setup" "$name" 0 "" || { tail -n 30 "$name.log"; fail "$name: the relaunch after $env"; }
    elif [ $rc != 0 ]; then
        tail -n 30 "$name.log"
        fail "$name: $env: exit $rc"
    elif [ $a = 0 ]; then
        grep -q "died from signal 9" "$name.log" || { tail -n 20 "$name.log"; fail "$name: $env killed nothing"; }
    fi
    same_run "$name" ref "$EXPECTED"
    same_run "$name" ref "$EXPECTED"
}

passes=0 runs=0 failed=()
declare -A tally
for setup in ${SWEEP_SETUPS:-one replicated sharded}; do
    hosts=1 s=0
    [ $setup = one ] || hosts=2
    [ $setup = replicated ] && s=1
    [ $setup = sharded ] && s=2
    # the clean run's passes: counts/<setup>-h<host>/<role><index>.<pid> files of "point n" lines
    for ((h = 0; h < hosts; h++)); do mkdir -p counts/$setup-h$h; done
    if [ $setup = one ]; then
        SLIDEDP_FAULT_COUNT=$T/counts/one-h0 run_one count-$setup 1 4 || { cat count-$setup.log; fail "count $setup"; }
    else
        run_two count-$setup $setup SLIDEDP_FAULT_COUNT=$T/counts/$setup-h0 SLIDEDP_FAULT_COUNT=$T/counts/$setup-h1 ||
            { cat count-$setup.log; fail "count $setup"; }
    fi
    same_run count-$setup ref "$EXPECTED"
    # the targets: point host role index passes, in a fixed order
    targets=()
    for point in $POINTS; do
        for ((h = 0; h < hosts; h++)); do
            for f in $(cd counts/$setup-h$h && ls | sort); do
                n=$(awk -v p="$point" '$1 == p {print $2}' counts/$setup-h$h/"$f")
                [ -n "$n" ] && targets+=("$point $h ${f%%.*} $n")
            done
        done
    done
    for ((a = 0; a < 2; a++)); do
        for ((p = 0; p < ${#targets[@]}; p++)); do
            [ "$SWEEP" = bounded ] && [ $((p % 32)) != $((5 * (2 * s + a))) ] && continue
            read -r point h proc n <<<"${targets[$p]}"
            idx=${proc//[a-z]/}
            k=$(((n + 1) / 2))
            name=$setup-$a-$point-h$h-$proc
            if [ $a = 0 ]; then env="SLIDEDP_CRASH_AT=$point:$k:r$idx"; else env="SLIDEDP_DELAY_AT=$point:$k:1000:r$idx"; fi
            runs=$((runs + 1))
            # a run that fails is reported and the sweep goes on (fail leaves the subshell only)
            if ! (sweep_one "$setup" "$name" "$h" "$proc" "$a" "$env"); then
                failed+=("$name $env")
                continue
            fi
            echo "ok: $setup host $h $proc $env"
            passes=$((passes + 1))
            tally[$setup-$a]=$((${tally[$setup-$a]:-0} + 1))
        done
    done
    unpassed=$(for point in $POINTS; do grep -qs "^$point " counts/$setup-h*/* || echo -n "$point "; done)
    echo "# $setup: ${#targets[@]} targets (point x process passed), kill ${tally[$setup-0]:-0} and delay" \
        "${tally[$setup-1]:-0} bit-identical; points no process passed here: ${unpassed:-none}"
done
echo "# $passes of $runs runs bit-identical to one uninterrupted host"
[ ${#failed[@]} = 0 ] || fail "${#failed[@]} run(s) failed: $(printf '%s; ' "${failed[@]}")"
echo "PASS"
