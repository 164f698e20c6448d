#!/bin/bash
# Issue 18's flake check, by hand (not part of make test): `make test` N times in a row on a clean
# clone of this repository, with a CPU-heavy busy loop beside it the whole time. One line per run:
# exit status, wall seconds, meson's counts; each run's log in DIR/run<i>.log.
# usage: tests/under_load.sh [N=5] [DIR=/tmp/sd-under-load]
n=${1:-5}
dir=${2:-/tmp/sd-under-load}
repo=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$dir" && git clone -q "$repo" "$dir/clone" && cd "$dir/clone" || exit 1
echo "commit $(git rev-parse --short HEAD)"
(while :; do :; done) &
hog=$!
trap 'kill $hog' EXIT
for i in $(seq 1 "$n"); do
    rm -rf build
    start=$(date +%s)
    make test > "$dir/run$i.log" 2>&1
    rc=$?
    echo "run $i rc=$rc wall=$(($(date +%s) - start))s $(grep -E '^(Ok|Fail|Timeout):' "$dir/run$i.log" | tr -s ' ' | tr '\n' ' ')"
done
