#!/usr/bin/env bash
# How long the first `quickdraft generate` takes on a fresh cache (the tokenizer, the llama.cpp
# exactness check, auto's timing): quiet, then with BUSY processes spinning beside it.
#   benchmarks/first_run.sh [BUSY]   (default 2: one per core of this project's machines)
set -euo pipefail
cd "$(dirname "$0")/.."
busy=${1:-2}
run() {
    local cache
    cache=$(mktemp -d)
    local start=$SECONDS
    XDG_CACHE_HOME=$cache .venv/bin/quickdraft generate "Write a haiku about the sea." --max-new-tokens 32 \
        --verbose 2>&1 >/dev/null | grep '^backend' || true
    echo "first generate, $1: $((SECONDS - start)) s"
    rm -rf "$cache"
}
run quiet
pids=()
for _ in $(seq "$busy"); do python3 -c "while True: pass" & pids+=($!); done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
run "$busy busy processes beside it"
