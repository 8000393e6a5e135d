#!/usr/bin/env bash
# The GPU check in one command (docs/gpu.md): (a) the CUDA tests, (b) target pass costs against the
# rows scored and plain decoding against transformers' generate (benchmarks/gpu_passes.py), (c) the
# default target's methods on Spec-Bench prompts (quickdraft bench, report and plots).
# Within 8 minutes on one H200 (each part has its own time limit); nothing to download.
#
# On a GPU machine: the default GGUF and the pinned wheels come in parts (benchmarks/gpu_stage.py
# pack, here); each call carries .gpu-stage/manifest.json and one part, and this script keeps them
# under --stage until all have come (it exits 0 after naming the part to carry next).
#   bash benchmarks/gpu_check.sh [--out DIR] [--stage DIR]
# Dry run on a CPU (tiny shapes, the static backend without graphs; the test suite runs it):
#   bash benchmarks/gpu_check.sh --dry-run --out DIR
set -uo pipefail
cd "$(dirname "$0")/.."

dry=0
out="${OUT:-gpu-check-out}"  # a device machine sets OUT: what is written there comes back
stage=/tmp/quickdraft-stage
python="${PYTHON:-python3}"
while (($#)); do
  case "$1" in
    --dry-run) dry=1 ;;
    --out) out="$2"; shift ;;
    --stage) stage="$2"; shift ;;
    *) echo "gpu_check: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"
status=0
part() {  # part NAME SECONDS COMMAND...: run one part under its own limit; a failure is reported, the rest go on
  local name="$1" seconds="$2"; shift 2
  echo "== gpu_check: $name (limit ${seconds}s)"
  local start=$SECONDS
  timeout "$seconds" "$@" 2>&1 | tee -a "$out/check.log"  # one log: a device call returns 8 files at most
  local rc=${PIPESTATUS[0]}
  echo "== gpu_check: $name: exit $rc after $((SECONDS - start))s"
  ((rc == 0)) || status=1
}

if ((dry)); then
  prompts="$out/prompts.jsonl"
  printf '%s\n' '{"category": "qa", "turns": ["What is the capital of France?"]}' \
    '{"category": "summarization", "turns": ["Summarize: the cat sat on the mat because the mat was warm."]}' >"$prompts"
  part tests 300 "$python" -m pytest -q -p no:cacheprovider tests/test_static_backend.py \
    -k "same_bits or window_keys or tree_rows or cuts"
  part passes 300 "$python" benchmarks/gpu_passes.py --dry-run --out "$out"
  part bench 600 "$python" -m quickdraft.cli bench --backend static --device cpu --methods prompt-lookup \
    --data "$prompts" --per-category 1 --max-new-tokens 8 --no-peers --output "$out/bench"
  exit $status
fi

source benchmarks/stage_ready.sh
stage_ready
case $? in
  0) ;;
  3) exit 0 ;;  # more parts to come: the message above names the next
  *) exit 1 ;;
esac
gguf=$(ls "$stage"/files/*.gguf | head -1)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$out/check.log"
# (a) The CUDA tests: every device-parametrized test on cuda (two of the sampling ones: 2,000 runs
# each), the graph tests, and the static backend's own.
part tests 200 "$python" -m pytest -q -p no:cacheprovider -m "not integration" tests \
  -k "(cuda or static) and not (sampled and cuda and not (params0 or params6))"
# (b) Pass costs against rows; plain decoding against transformers' generate.
part passes 150 "$python" benchmarks/gpu_passes.py --target "$gguf" --out "$out"
# (c) The default target's methods on Spec-Bench (no draft model fits a 135M target: none is smaller).
part bench 150 "$python" -m quickdraft.cli bench --target "$gguf" --device cuda \
  --methods prompt-lookup eagle medusa lookahead --data "$stage/files/question.jsonl" \
  --per-category 3 --max-new-tokens 128 --peers transformers --output "$out/bench"
exit $status
