#!/bin/bash
# A run's identity (docs/design.md §8.9, issue 28): checkpoint.resume = never over an older run
# moves that run's checkpoints and final/ aside, so pruning and a later resume see the new run only
# (its checkpoints bit-identical to the same run in an empty directory); resume = auto refuses a
# checkpoint of another configuration naming the keys; a changed job.ini against the live state a
# dead launcher left is refused naming the keys and what --clean would discard; training on under a
# larger train.steps says how the lr schedule moved, and a resume under the same says nothing.
. "$SD_SOURCE/tests/runs_lib.sh"
write_job 4 2
sed -i 's/^keep = 1000$/keep = 2/' job.ini

# run A: step-2, step-4 and final/
run_one id 1 2 || { cat id.log; fail "run A"; }
idA=$(sed -n 's/.*"run_id": "\([0-9a-f]*\)".*/\1/p' id/ckpt/step-4/trainer_state.json)
[ -n "$idA" ] || fail "step-4 records no run_id"
grep -q '"train.lr": "0.003"' id/ckpt/step-4/trainer_state.json || fail "step-4 records no train.lr"

# run B over it, resume = never, another lr, 3 steps, a checkpoint each step (keep = 2)
RUN_B=(checkpoint.resume=never train.steps=3 checkpoint.every=1 train.lr=1e-3)
run_one id 1 2 "${RUN_B[@]}" || { cat id.log; fail "run B"; }
grep -q "moved from .* to .*/run-$idA" id.log || { cat id.log; fail "run B: no message that run A was moved"; }
[ "$(cd id/ckpt && echo *)" = "final run-$idA step-2 step-3" ] || fail "run B: checkpoint.dir holds $(cd id/ckpt && echo *)"
[ "$(cd id/ckpt/run-"$idA" && echo *)" = "final step-2 step-4" ] || fail "run A's checkpoints were not kept whole"
run_one idref 1 2 "${RUN_B[@]}" || { cat idref.log; fail "run B in an empty directory"; }
for d in step-2 step-3 final; do
    cmp -s id/ckpt/$d/model.safetensors idref/ckpt/$d/model.safetensors || fail "run B's $d differs from the same run's"
done
echo "ok: resume = never moved run $idA aside (step-2 step-4 final/); run B's step-2 step-3 final/ are its own"

# resume = auto with yet another lr: B's step-3 is of another configuration, refused naming the key
run_one id 1 2 train.steps=3 train.lr=2e-3
rc=$?
[ $rc = 2 ] && grep -q 'train.lr = 0.001 there, 0.002 here' id.log ||
    { tail -n 3 id.log; fail "resume under another lr: exit $rc"; }
echo "ok: resume = auto under another lr: exit 2: $(tail -n 1 id.log)"

# a changed job.ini against live state: the launcher dies (kill -9) after logging step 3; its
# children leave; the relaunch with another lr is refused naming the key and what --clean discards
SLIDEDP_CRASH_AT=launcher_logged:3 run_one live 1 2 checkpoint.every=0 train.steps=6
run_one live 1 2 checkpoint.every=0 train.steps=6 train.lr=2e-3
rc=$?
[ $rc = 2 ] && grep -q 'train.lr = 0.003 there, 0.002 here' live.log &&
    grep -q 'trained step(s) not on disk (the newest checkpoint: none), which --clean discards' live.log ||
    { tail -n 3 live.log; fail "a changed job.ini against live state: exit $rc"; }
echo "ok: a changed job.ini against live state: exit 2: $(tail -n 1 live.log)"
"$B/slidedp-launch" --clean job.ini log.dir=live checkpoint.dir=live/ckpt >>live.log 2>&1 || fail "--clean"
grep -q 'discarding [1-9][0-9]* trained step(s) not in a checkpoint on disk' live.log || fail "--clean did not say what it discarded"
# training on: a resume under a larger train.steps stretches the cosine schedule over the new span;
# the launcher says so with the lr of the last trained step and of the next, as metrics.jsonl logs them
run_one on 1 2 train.steps=4 || { cat on.log; fail "4 steps"; }
grep -q '"train_steps": 4,' on/ckpt/step-4/trainer_state.json || fail "step-4 records no train_steps"
run_one on 1 2 train.steps=6 || { cat on.log; fail "on to 6 steps"; }
lr_of() { sed -n "s/^{\"step\":$1,.*\"lr\":\([^,]*\),.*/\1/p" on/metrics.jsonl | awk '{printf "%.3e", $1}'; }
want="train.steps is 6, step-4 was trained toward 4: the cosine schedule now spans 6 steps, so the lr goes from $(lr_of 4) (step 4, the last trained) to $(lr_of 5) (step 5)"
grep -qF "$want" on.log || { grep train.steps on.log; fail "no schedule line: $want"; }
echo "ok: training on from 4 to 6 steps: $want"
# a resume under the span it was trained toward says nothing: an 8-step run whose launcher dies
# after logging step 5, its live state removed, resumes from step-4
SLIDEDP_CRASH_AT=launcher_logged:5 run_one same 1 2 train.steps=8 checkpoint.every=2
"$B/slidedp-launch" --clean job.ini log.dir=same checkpoint.dir=same/ckpt >>same.log 2>&1 || fail "--clean"
: >same.log
run_one same 1 2 train.steps=8 checkpoint.every=2 || { cat same.log; fail "resume of 8 steps"; }
grep -q "resuming from checkpoint step-4" same.log || { cat same.log; fail "did not resume from step-4"; }
! grep -q "schedule now spans" same.log || fail "a resume under its own train.steps spoke of its schedule"
echo "ok: resuming step-4 of 8 steps under 8 steps says nothing of the schedule"
echo "PASS"
