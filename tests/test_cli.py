#!/usr/bin/python3
"""What every program says on its command line (issue 29): each installed program (the build's
meson-info/intro-installed.json lists them) prints its full usage on stdout for --help, with the word
"usage" and --version in it, and exits 0; --version prints the version and exits 0; an unknown option
is one line on stderr and exit 2; the programs that take job.ini overrides say how their relative
paths resolve. A resumed job's header names the checkpoint its weights come from, never "random init"
(a tiny random-init job trains 2 steps, seed 1234, then 2 more from its step-2 checkpoint), and the
paths the launcher prints are shown from the current directory when they lie under it; slidedp-plan
says "does not fit" and exits 2 when no plan fits the GPU memory, and names the longest sequence that
fits (fits there, not one token beyond). The host calibration is measured once
into the cache and read from it after; $SLIDEDP_HOST_CALIB (which pins every other test's plans) replaces
it, and a file that is no calibration is one line and exit 2."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

BUILD = os.environ.get("SD_BUILD", "build")
SOURCE = os.environ.get("SD_SOURCE", ".")
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    failures += not ok


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, **kw)


def check_programs():
    installed = json.load(open(os.path.join(BUILD, "meson-info", "intro-installed.json")))
    # the CUDA backend module (libslidedp-cuda.so) is installed beside the programs, but is none
    programs = sorted(src for src, dst in installed.items() if "/bin/" in dst and not dst.endswith(".so"))
    check(len(programs) >= 7, f"{len(programs)} installed programs: {', '.join(map(os.path.basename, programs))}")
    for prog in programs:
        name = os.path.basename(prog)
        p = run([prog, "--help"])
        check(p.returncode == 0 and "usage" in p.stdout and "--version" in p.stdout and not p.stderr
              and p.stdout.count("\n") >= 4,
              f"{name} --help: exit {p.returncode}, {p.stdout.count(chr(10))} lines of usage on stdout with --version")
        p = run([prog, "--version"])
        check(p.returncode == 0 and p.stdout.startswith("slidedp ") and p.stdout.count("\n") == 1,
              f"{name} --version: exit {p.returncode}, {p.stdout.strip()!r}")
        if name in ("slidedp-worker", "slidedp-optim", "slidedp-data"):
            continue  # started by the launcher with their own arguments / a task word first
        p = run([prog, "--no-such-option"])
        check(p.returncode == 2 and p.stderr.count("\n") == 1 and "--no-such-option" in p.stderr,
              f"{name} --no-such-option: exit {p.returncode}, {p.stderr.strip()!r}")
    p = run([os.path.join(BUILD, "slidedp-data"), "tokenize", "--help"])
    check(p.returncode == 0 and "usage: slidedp-data tokenize" in p.stdout,
          f"slidedp-data tokenize --help: exit {p.returncode}")
    for name in ("slidedp-launch", "slidedp-plan", "slidedp-top", "slidedp-stat"):
        out = run([os.path.join(BUILD, name), "--help"]).stdout.replace("\n", " ")
        out = " ".join(out.split())
        check("relative path in an override starts at the current directory" in out
              or "an override's relative path starts at the current directory" in out,
              f"{name} --help says an override's relative path starts at the current directory")


def check_plan_does_not_fit(scratch):
    """slidedp-plan exits 2 saying "does not fit" when no plan fits the GPU memory (DESIGN §12)."""
    p = run([os.path.join(BUILD, "slidedp-plan"), "job.ini", "runtime.device=cuda", "runtime.gpu_mem=1M"], cwd=scratch)
    check(p.returncode == 2 and "slidedp-plan: the job does not fit the GPU memory: " in p.stderr,
          f"slidedp-plan with gpu_mem = 1M: exit {p.returncode}, {p.stderr.strip()!r}")


def check_plan_longest_seq(scratch):
    """slidedp-plan names the longest data.seq_len that fits (design §10.6): the job fits at it and
    not one token beyond, where the bound it names (GPU memory) stops it."""
    plan = [os.path.join(BUILD, "slidedp-plan"), "job.ini", "runtime.device=cuda", "runtime.gpu_mem=2G"]
    p = run(plan + ["--json"], cwd=scratch)
    longest = json.loads(p.stdout)["longest_seq"] if p.returncode == 0 else {}
    T = longest.get("seq_len", 0)
    check(longest.get("limit") == "gpu_memory" and T > 1, f"longest_seq in 2 GiB: {longest}")
    at, beyond = run(plan + [f"data.seq_len={T}"], cwd=scratch), run(plan + [f"data.seq_len={T + 1}"], cwd=scratch)
    check(at.returncode == 0 and f"longest sequence that fits: {T} tokens (data.seq_len)" in at.stdout,
          f"slidedp-plan at data.seq_len={T}: exit {at.returncode}")
    check(beyond.returncode == 2 and "does not fit the GPU memory" in beyond.stderr,
          f"slidedp-plan at data.seq_len={T + 1}: exit {beyond.returncode}, {beyond.stderr.strip()!r}")


def check_calibration(scratch):
    plan = [os.path.join(BUILD, "slidedp-plan"), "job.ini"]
    env = dict(os.environ, SLIDEDP_CACHE_DIR=os.path.join(scratch, "cache"))
    env.pop("SLIDEDP_HOST_CALIB", None)
    first = run(plan, cwd=scratch, env=env)
    cached = [f for f in os.listdir(env["SLIDEDP_CACHE_DIR"]) if f.startswith("calib-")]
    check(first.returncode == 0 and ": measured now, " in first.stdout and len(cached) == 1,
          f"an empty cache: the host is measured and cached ({cached})")
    second = run(plan, cwd=scratch, env=env)
    check(second.returncode == 0 and ": measured earlier (cache), " in second.stdout,
          "the next plan reads the cache")
    pinned_file = os.path.join(SOURCE, "tests", "fixtures", "calib-host.json")
    pinned = run(plan, cwd=scratch, env=dict(env, SLIDEDP_HOST_CALIB=pinned_file))
    memcpy = json.load(open(pinned_file))["memcpy_bw"][0][1]
    check(pinned.returncode == 0 and "(2 cpus): pinned ($SLIDEDP_HOST_CALIB), " in pinned.stdout
          and f"memcpy    1 thr {memcpy / 1e9:.1f} GB/s;" in pinned.stdout,
          f"$SLIDEDP_HOST_CALIB: its rates ({memcpy / 1e9:.1f} GB/s memcpy on 1 thread)")
    bad = run(plan, cwd=scratch, env=dict(env, SLIDEDP_HOST_CALIB=os.path.join(scratch, "job.ini")))
    check(bad.returncode == 2 and bad.stderr.count("\n") == 1 and "not a host calibration file" in bad.stderr,
          f"$SLIDEDP_HOST_CALIB naming job.ini: exit {bad.returncode}, {bad.stderr.strip()!r}")


def check_resume_header(scratch):
    data = os.path.join(scratch, "data")
    p = run([os.path.join(BUILD, "slidedp-data"), "copy", "--out", data, "--seq-len", "32", "--train", "256",
             "--val", "16", "--seed", "1"])
    assert p.returncode == 0, p.stderr
    ini = os.path.join(scratch, "job.ini")
    with open(ini, "w") as f:
        f.write(f"[model]\npath = {SOURCE}/examples/tiny-qwen3\ninit = random\n[data]\ntrain = data/train.bin\n"
                "seq_len = 32\n[train]\nmicro_batch = 2\nsteps = 2\nlr = 1e-3\nseed = 1234\n[checkpoint]\nevery = 1\n"
                "[runtime]\ndevice = cpu\ngpus = 1\n")
    launch = os.path.join(BUILD, "slidedp-launch")
    first = run([launch, "job.ini"], cwd=scratch)
    check(first.returncode == 0 and "random init" in first.stdout,
          f"a fresh run: exit {first.returncode}, its header says random init")
    # paths under the current directory are shown from it, as the user would type them
    check("logs in runs/demo\n" in first.stdout and "exported runs/demo/ckpt/final\n" in first.stdout,
          "the paths it prints are relative to the current directory (logs in runs/demo, exported "
          "runs/demo/ckpt/final)")
    second = run([launch, ini, "train.steps=4"])
    lines = second.stdout.splitlines()
    header = next((l for l in lines if l.startswith("slidedp: job ")), "")
    check(second.returncode == 0 and "resuming from checkpoint step-2" in second.stdout
          and header.endswith("weights from checkpoint step-2") and "random init" not in second.stdout,
          f"the resumed run: exit {second.returncode}, header {header!r}, no 'random init'")
    if failures:
        print(second.stdout + second.stderr)


def main():
    scratch = tempfile.mkdtemp(prefix="sd_cli_")
    try:
        check_programs()
        check_resume_header(scratch)
        check_plan_does_not_fit(scratch)
        check_plan_longest_seq(scratch)
        check_calibration(scratch)
    finally:
        shutil.rmtree(scratch)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
