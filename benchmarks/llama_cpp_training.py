"""EAGLE-3 on the llama.cpp backend: what its taps cost a pass, and how fast `quickdraft train`
distils answers and extracts features there against the native backend (docs/llama-cpp.md, "Taps").

Three measurements on the embedded default target, side by side in one process:
- taps: one backend that records the inputs of layers 2, 15 and 27 (the shipped EAGLE-3 head's)
  and one that never did, each a pass of 1, 4 and 8 rows after 128 cached tokens, interleaved
  rounds, medians;
- distillation: the target's greedy answers (up to --tokens) to the same --prompts prompts,
  through `regenerate` as `quickdraft train --distill` runs it, on llama.cpp (its default batch,
  16) and on native fp32 (the default before, batch 64);
- features: teacher-forced passes over --examples GSM8K training examples, one example a pass (the
  CPU default), the inputs of those three layers and the greedy choices, on both backends.

Run:  .venv/bin/python benchmarks/llama_cpp_training.py --out bench-out/llama-cpp-training.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from quickdraft.backends.backend import SeqPass
from quickdraft.backends.llama_cpp import LlamaCppBackend
from quickdraft.models import default_gguf_path
from quickdraft.models.loading import load_model
from quickdraft.training.data import read_examples
from quickdraft.training.distill import regenerate
from quickdraft.training.features import encode_example, target_features
from quickdraft.training.train_command import LLAMA_CPP_DISTILL_BATCH, feature_decoder

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "data" / "general-prompts.jsonl"
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k" / "train.jsonl"
TAPS = (2, 15, 27)


def tap_costs(rounds: int, threads: int) -> dict[int, tuple[float, float]]:
    """rows -> (ms without taps, ms with), medians of interleaved rounds on two contexts of one file."""
    plain, tapped = (LlamaCppBackend(default_gguf_path(), "smollm2", threads=threads) for _ in range(2))
    generator = torch.Generator().manual_seed(0)
    context = torch.randint(1000, 30000, (128,), generator=generator).tolist()
    new = torch.randint(1000, 30000, (8,), generator=generator).tolist()
    caches = [b.new_cache() for b in (plain, tapped)]
    for backend, cache in zip((plain, tapped), caches):
        backend.forward([SeqPass(cache, context, logits="none")])
        assert backend.exact_rows >= 8  # the exactness check, once, before timing
    costs = {}
    for rows in (1, 4, 8):
        times: list[list[float]] = [[], []]
        for _ in range(rounds):
            for side, (backend, cache) in enumerate(zip((plain, tapped), caches)):
                taps = TAPS if side else ()
                start = time.perf_counter()
                backend.forward([SeqPass(cache, new[:rows], hidden=bool(taps), taps=taps)])
                times[side].append((time.perf_counter() - start) * 1e3)
                cache.truncate(len(context))
        costs[rows] = (statistics.median(times[0]), statistics.median(times[1]))
    return costs


def distill_rate(prompts: int, tokens: int, precision: str | None, batch: int) -> float:
    """Answer tokens a second of `quickdraft train --distill` on the backend feature_decoder picks."""
    loaded = load_model(None)
    decoder = feature_decoder(loaded, precision=precision, cells=batch * 640)
    examples = read_examples(PROMPTS)[:prompts]
    sequences = [encode_example(loaded.tokenizer, e, 512) for e in examples]
    start = time.perf_counter()
    answers = regenerate(decoder, sequences, tokens, batch_size=batch, progress=False)
    elapsed = time.perf_counter() - start
    return sum(len(ids) - first for ids, first in answers) / elapsed


def feature_rate(examples: int, precision: str | None) -> float:
    """Tokens a second of teacher-forced EAGLE-3 features, one example a pass."""
    loaded = load_model(None)
    backend = feature_decoder(loaded, precision=precision).target_backend
    sequences = [encode_example(loaded.tokenizer, e, 512) for e in read_examples(GSM8K)[:examples]]
    target_features(backend, sequences[:1], TAPS)  # first-use work (exactness check, timings) before the clock
    start = time.perf_counter()
    for sequence in sequences:
        target_features(backend, [sequence], TAPS)
    return sum(len(ids) for ids, _ in sequences) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--examples", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    taps = tap_costs(args.rounds, args.threads)
    distill = {
        "llama.cpp": distill_rate(args.prompts, args.tokens, None, LLAMA_CPP_DISTILL_BATCH),
        "native fp32": distill_rate(args.prompts, args.tokens, "fp32", 64),
    }
    features = {"llama.cpp": feature_rate(args.examples, None), "native fp32": feature_rate(args.examples, "fp32")}
    print("| rows | pass without taps (ms) | with taps (ms) | ratio |\n|---|---|---|---|")
    for rows, (without, with_taps) in taps.items():
        print(f"| {rows} | {without:.1f} | {with_taps:.1f} | {with_taps / without:.2f}x |")
    print("\n| job | llama.cpp (tok/s) | native fp32 (tok/s) | llama.cpp / native |\n|---|---|---|---|")
    for job, rates in (("distillation", distill), ("features", features)):
        print(
            f"| {job} | {rates['llama.cpp']:.0f} | {rates['native fp32']:.0f} | "
            f"{rates['llama.cpp'] / rates['native fp32']:.2f}x |"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {"taps_ms": taps, "distill_tok_s": distill, "features_tok_s": features, "settings": vars(args)}
        args.out.write_text(json.dumps(record, indent=1, default=str))


if __name__ == "__main__":
    main()
