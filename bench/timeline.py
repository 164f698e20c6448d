#!/usr/bin/env python3
"""Where a step's time goes: samples `slidedp-stat --json` of the only running job as fast as it
answers until the job ends, then prints, for the steady steps, the share of samples each worker
and optimizer process spent in each phase, and two steps' timeline (phase and chunk changes with
times).
usage: timeline.py SLIDEDP_STAT_BINARY [FIRST_STEADY_STEP]"""
import collections, json, subprocess, sys, time

stat, first = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
samples, t0, seen = [], time.time(), False
while True:
    r = subprocess.run([stat, "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        if seen or time.time() - t0 > 120:
            break
        time.sleep(0.05)
        continue
    seen = True
    try:
        j = json.loads(r.stdout)
    except ValueError:
        continue
    samples.append((time.time(), [(w["phase"], w.get("step"), w.get("chunk")) for w in j["workers"]],
                    [(o["phase"], o.get("step"), o.get("chunk")) for o in j["optimizers"]]))
if not samples:
    sys.exit("no job seen")
dt = (samples[-1][0] - samples[0][0]) / max(1, len(samples) - 1)
print(f"{len(samples)} samples, one per {1e3 * dt:.1f} ms")
steady = [s for s in samples if s[1] and s[1][0][1] is not None and s[1][0][1] > first and
          all(w[0] != "done" for w in s[1])]
for who, idx in (("worker", 1), ("optimizer", 2)):
    for p in range(len(steady[0][idx]) if steady else 0):
        c = collections.Counter(s[idx][p][0] for s in steady)
        n = sum(c.values())
        print(f"{who} {p}: " + ", ".join(f"{k} {100 * v / n:.0f}%" for k, v in c.most_common()))
# two steady steps of worker 0 (one full period of every process): phase changes of worker 0 and
# of every optimizer, with the chunk each works on
step = first + 2
prev, t_start = None, None
for t, ws, os_ in samples:
    if not ws or ws[0][1] is None or not step <= ws[0][1] <= step + 1:
        continue
    t_start = t_start or t
    key = (ws[0][0], ws[0][2], tuple((o[0], o[2]) for o in os_))
    if key != prev:
        print(f"{1e3 * (t - t_start):8.1f} ms  worker0 step {ws[0][1]} {ws[0][0]:12} chunk {ws[0][2]!s:>3}  optim " +
              " ".join(f"{o[0]}@{o[1]} chunk {o[2]}" for o in os_))
        prev = key
