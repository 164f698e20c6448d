# Sourced by the GPU-host scripts (bench/gpu_*.sh), from the repo root: builds with the carried
# .debs (the host lacks libuv, CMocka, inih, cJSON, Oniguruma, utf8proc, Open MPI) and sets PATH, LD_LIBRARY_PATH, SD_BUILD and
# SD_SOURCE. Sets $build and $out; exits 1 when the build fails. Defines random_tokens and bench_job
# for the scripts' jobs, and e2e_fixtures.
# Prepare .gpudeps/ once where Debian's registry is reachable (it is git-ignored; carry it along):
#   mkdir -p .gpudeps/extra, and copy the GPU host kit's build.sh and fetch-debs.sh (they come with the host) into .gpudeps/
#   sh .gpudeps/fetch-debs.sh .gpudeps
#   (cd .gpudeps && apt-get download libonig5 libonig-dev libutf8proc2 libutf8proc-dev)   # slidedp-data tokenize
#   (cd .gpudeps && apt-get download libopenmpi-dev libopenmpi3 openmpi-common libpmix2 libpmix-dev libhwloc15 \
#       libhwloc-dev libevent-core-2.1-7 libevent-pthreads-2.1-7 libevent-2.1-7 libevent-extra-2.1-7 \
#       libevent-openssl-2.1-7 libevent-dev libfabric1 libucx0 libibverbs1 librdmacm1 libpsm2-2 libpsm-infinipath1 \
#       libnl-3-200 libnl-route-3-200 libnuma1 libmunge2 libltdl7 libxnvctrl0 libpciaccess0 libibverbs-dev \
#       libnuma-dev libltdl-dev)   # Open MPI: slidedp-launch links it (several hosts)
#   (cd .gpudeps/extra && apt-get download pkgconf pkgconf-bin libpkgconf3 libopenblas0-pthread \
#       libopenblas-pthread-dev libopenblas0 libopenblas-dev libgfortran5)   # used only if the host lacks them
#   cp ../shared/bench/torch_peer.py .gpudeps/   # the FSDP2 peer, for the scripts that run it beside us
#   mkdir -p .gpudeps/cudnn/include && cp /usr/local/cuda/include/cudnn*.h .gpudeps/cudnn/include/
#       # cuDNN's header, used if the host lacks it (the library comes with PyTorch there)
set -u
root=$(pwd)
out=${OUT:-$root/.gpuout}
deps=${GPUDEPS:-$root/.gpudeps}
build=${BUILD:-build-gpu}
sysroot=/tmp/sysroot
mkdir -p "$out" "$sysroot"
export PATH=/usr/local/cuda/bin:$PATH
log() { echo "$*" | tee -a "$out/summary.log"; }
: > "$out/summary.log"
# The device tool brings back at most 8 files from $OUT: on exit the script's logs go into one
# archive, logs-<script>.tar.gz, and the summaries stay beside it.
pack_logs() {
    (cd "$out" && ls | grep -v -e '^summary' -e '\.tar\.gz$' | tar czf "logs-$(basename "$0" .sh).tar.gz" -T - --remove-files)
}
trap pack_logs EXIT

# ---- build ----
{
    nvidia-smi
    nvcc --version | tail -2
    export LD_LIBRARY_PATH=$sysroot/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    if ! command -v meson >/dev/null 2>&1; then
        mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m mesonbuild.mesonmain "$@"\n' > /tmp/bin/meson
        chmod +x /tmp/bin/meson && export PATH=/tmp/bin:$PATH
    fi
    if ! command -v pkg-config >/dev/null 2>&1 || ! pkg-config --exists openblas; then
        echo "host lacks pkg-config or OpenBLAS: unpacking $deps/extra"
        for f in "$deps"/extra/*.deb; do dpkg -x "$f" "$sysroot"; done
        export PATH=$sysroot/usr/bin:$PATH
        pc=$sysroot/usr/lib/x86_64-linux-gnu/pkgconfig
        mkdir -p "$pc"
        [ -f "$pc/openblas.pc" ] || printf '%s\n' 'libdir=/usr/lib/x86_64-linux-gnu/openblas-pthread' \
            'includedir=/usr/include/x86_64-linux-gnu/openblas-pthread' 'Name: openblas' 'Description: OpenBLAS' \
            'Version: 0.3' 'Libs: -L${libdir} -lopenblas' 'Cflags: -I${includedir}' > "$pc/openblas.pc"
    fi
    # cuDNN's header from .gpudeps/cudnn/include (a copy of this machine's) when the host has none
    [ -f /usr/local/cuda/include/cudnn_graph.h ] || [ ! -d "$deps/cudnn/include" ] ||
        export CPATH=$deps/cudnn/include${CPATH:+:$CPATH}
    sh "$deps/build.sh" "$deps" "$build"
} > "$out/build.log" 2>&1
if [ ! -x "$build/slidedp-launch" ] || [ ! -x "$build/bench/bench_attention" ]; then
    log "BUILD FAILED"; tail -40 "$out/build.log"; exit 1
fi
export PATH=$sysroot/usr/bin:$PATH
export LD_LIBRARY_PATH=$sysroot/usr/lib/x86_64-linux-gnu:$sysroot/usr/lib/x86_64-linux-gnu/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export SD_BUILD=$root/$build SD_SOURCE=$root OPENBLAS_NUM_THREADS=1
# cuDNN (attention): the library PyTorch installed, when there is no system one
cudnn_lib=$(python3 -c "import nvidia.cudnn as m, os; print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null)
[ -n "$cudnn_lib" ] && export LD_LIBRARY_PATH=$cudnn_lib:$LD_LIBRARY_PATH
log "built $build ($(grep -c . "$out/build.log") log lines)"


# descendants PID: every process under PID. host_bytes PID LOG: host bytes now of the job under PID
# logging to LOG: its shm objects (named in the launcher's "shared state" line) plus its processes'
# private and file-backed RSS (shm pages count once).
descendants() { local p; for p in $(pgrep -P "$1"); do echo "$p"; descendants "$p"; done; }
host_bytes() {
    local objs shm rss
    objs=$(grep -o '/dev/shm/slidedp\.[0-9a-f]*\.' "$2" 2>/dev/null | head -1)
    shm=$([ -n "$objs" ] && du -cb "$objs"* 2>/dev/null | tail -1 | cut -f1)
    rss=$(for p in $(descendants "$1"); do
        awk '/^Rss(Anon|File):/ {s += $2} END {print s}' /proc/$p/status 2>/dev/null; done |
        awk '{s += $1} END {printf "%d", s * 1024}')
    echo $((${shm:-0} + ${rss:-0}))
}

# host_job DIR MODEL STEPS: DIR/job.ini for examples/MODEL on DIR/train.bin, 2 sequences of 4096 per
# micro-step, clipping, every runtime choice left to the planner; logs and checkpoints in DIR.
host_job() {
    cat > "$1/job.ini" <<EOF
[model]
path = $root/examples/$2
init = random
[data]
train = $1/train.bin
seq_len = 4096
[train]
micro_batch = 2
steps = $3
lr = 1e-5
weight_decay = 0.1
grad_clip = 1.0
[checkpoint]
dir = $1/ckpt
save_final = false
[runtime]
device = cuda
[log]
dir = $1/log
EOF
}

# job_id_of LOG: the job name a launcher's log announces ("slidedp: job NAME, ..."), empty before it.
job_id_of() {
    grep -o 'slidedp: job [0-9a-f]*' "$1" 2>/dev/null | head -1 | cut -d' ' -f3
}

# random_tokens FILE N: N random token ids of the Qwen3 vocabulary as an llm.c v7 token file.
random_tokens() {
    python3 - "$1" "$2" <<'PY'
import sys, numpy as np
path, n = sys.argv[1], int(sys.argv[2])
h = np.zeros(256, dtype=np.int32); h[:3] = (20240801, 7, n)
t = np.random.default_rng(0).integers(0, 151936, size=n, dtype=np.uint32)
open(path, "wb").write(h.tobytes() + t.tobytes())
PY
}

# bench_job DIR: sets job_args to the shared job ($bench_ini) with its token data
# (DIR/train.bin), logs and checkpoints in DIR; a script adds its own overrides after them.
bench_ini=$root/bench/qwen3-1.7b.ini
# shm_at_least GIB SIZE: remounts /dev/shm at SIZE (e.g. 100G) when less than GIB GiB of it is free.
shm_at_least() {
    local free
    free=$(df -BG --output=avail /dev/shm | tail -1 | tr -dc 0-9)
    [ "${free:-0}" -ge "$1" ] || mount -o remount,size="$2" /dev/shm
}

# peer_step LOG: the median step seconds torch_peer.py (the PyTorch FSDP2 peer) printed in LOG, its
# RESULT line; empty when it printed none (it failed, or ran out of time).
peer_step() {
    grep '^RESULT' "$1" | python3 -c "import json,sys; print(json.loads(sys.stdin.read()[7:])['step_s'])" 2>/dev/null
}

bench_job() {
    job_args=("$bench_ini" "data.train=$1/train.bin" "log.dir=$1/log" "checkpoint.dir=$1/ckpt")
}

# e2e_fixtures [OVERRIDES...]: `slidedp-launch --device cuda` on each parity fixture (with the
# overrides), its losses against the CPU reference's (tests/fixtures/*/ref.json); one line each in
# $out/e2e.log and the summary.
e2e_fixtures() {
    for fx in qwen3_tied qwen3_untied_gqa8 qwen2 llama3; do
        local d=/tmp/e2e_$fx
        rm -rf "$d"
        timeout 60 "$build/slidedp-launch" --device cuda "tests/fixtures/$fx/job.ini" "log.dir=$d/log" \
            "checkpoint.dir=$d/ckpt" "$@" >> "$out/e2e.log" 2>&1
        local rc=$?
        python3 - "$d/log/metrics.jsonl" "tests/fixtures/$fx/ref.json" "$fx${1:+ $*}" "$rc" <<'PY' | tee -a "$out/e2e.log" "$out/summary.log"
import json, sys
path, ref, name, rc = sys.argv[1:]
try:
    got = [json.loads(l)["loss"] for l in open(path) if l.strip()]
except OSError:
    got = []
want = json.load(open(ref))["losses"]
rel = [abs(a - b) / b for a, b in zip(got, want)]
ok = rc == "0" and len(got) == len(want) and max(rel) < 2e-2
print(f"e2e cuda {name}: exit {rc}, losses {' '.join(f'{x:.5f}' for x in got)} vs ref "
      f"{' '.join(f'{x:.5f}' for x in want)}, worst rel {max(rel) if rel else float('nan'):.2e}: {'OK' if ok else 'FAIL'}")
PY
    done
}
