#!/bin/sh
# Checks which programs link CUDA, read from their ELF files: `--none P...` must need no CUDA library
# and hold no CUDA symbol (slidedp-launch and slidedp-plan: the launcher never initialises CUDA,
# docs/design.md §1.2); `--some P...` must (the CUDA backend module of a CUDA build: it shows the
# check sees CUDA).
set -u
mode=
status=0
for arg in "$@"; do
    case $arg in
    --none | --some) mode=$arg; continue ;;
    esac
    cuda=$(readelf -d -Ws "$arg" | grep -Ei '(lib(cuda|cublas|cudnn)|[[:space:]](cuda|cublas|cudnn)[A-Za-z_])') ||
        true
    readelf -h "$arg" >/dev/null || { echo "cannot read $arg"; exit 1; }
    n=$(printf '%s' "$cuda" | grep -c .)
    echo "$arg: $n CUDA libraries and symbols"
    if [ "$mode" = --none ] && [ "$n" -gt 0 ]; then
        printf '%s\n' "$cuda" | head -5
        status=1
    elif [ "$mode" = --some ] && [ "$n" -eq 0 ]; then
        echo "$arg: expected CUDA, found none"
        status=1
    fi
done
exit $status
