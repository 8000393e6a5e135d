"""Does the pass-cost arithmetic predict a measured speedup? On a real model (the embedded default,
SmolLM2-135M; or --target) and each backend asked for: the cost of a pass of 1..K+1 rows, measured
on its own (shapes.measure_pass_costs' timing); then plain decoding and greedy prompt lookup at a
fixed K, prompt by prompt, interleaved. The prediction replays the run's own steps (rows drafted,
tokens yielded) at the measured pass costs (analysis.speedup_from_steps); the measured speedup is
plain decode time per token over prompt lookup's (prefill left out of both). Their ratio says how
far real_sizes.py's predictions at 1B-8B, made the same way, can be trusted.

    .venv/bin/python benchmarks/prediction_check.py [--backends native:int4 native:bf16 llama.cpp] \
        [--k 4] [--prompts 12]
        [--max-new-tokens 96] [--steps-out bench-out/prompt_lookup_steps.json]

--steps-out keeps the prompt-lookup steps of the first backend (drafted, tokens per pass), which
real_sizes.py --steps replays at each shape's pass costs. Nothing here is a test; compare only
numbers from one run.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from datetime import date
from pathlib import Path

import quickdraft
from quickdraft.analysis import speedup_from_steps
from quickdraft.backends.kernel_timing import measure_pass_costs
from quickdraft.bench.prompts import default_prompt_file, read_prompt_file


def spread_prompts(count: int) -> list[str]:
    """`count` Spec-Bench prompts taken round-robin over its task groups (every group alike)."""
    path = default_prompt_file()
    if path is None:
        raise SystemExit("no prompt file: ../shared/data/spec_bench/question.jsonl")
    groups: dict[str, list[str]] = {}
    for prompt in read_prompt_file(path):
        groups.setdefault(prompt.category, []).append(prompt.text)
    ordered = [texts[i] for i in range(max(map(len, groups.values()))) for texts in groups.values() if i < len(texts)]
    return ordered[:count]


def decode_seconds(output: quickdraft.GenerationOutput) -> float:
    return output.stats.wall_time - output.stats.prefill_time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    parser.add_argument(
        "--backends",
        nargs="+",
        default=["native:int4", "native:bf16", "llama.cpp"],
        help="BACKEND or BACKEND:PRECISION",
    )
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--steps-out", type=Path, default=None)
    args = parser.parse_args()
    prompts = spread_prompts(args.prompts)
    grid = tuple(range(1, args.k + 2))
    print(
        f"{date.today()} · {platform.processor() or platform.machine()} · {len(prompts)} Spec-Bench prompts, "
        f"{args.max_new_tokens} new tokens, greedy · prompt lookup at K = {args.k} (fixed)"
    )
    print(
        "| target | backend | pass ms, 1 / K+1 rows | plain tok/s | prompt lookup tok/s | tokens per pass | "
        "predicted speedup | measured speedup | predicted / measured |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for number, choice in enumerate(args.backends):
        backend, _, precision = choice.partition(":")
        plain = quickdraft.load(args.target, method="none", backend=backend, precision=precision or None)
        lookup = plain.with_method("prompt-lookup", args.k, draft_length="fixed")
        costs = measure_pass_costs(plain.target_backend, None, grid=grid)  # not cached: measured in this run
        plain_s = lookup_s = 0.0
        plain_tokens = lookup_tokens = 0
        steps: list[tuple[int, int]] = []
        for prompt in prompts:
            plain.generate(prompt, max_new_tokens=4)  # the same warm caches for both
            base = plain.generate(prompt, max_new_tokens=args.max_new_tokens)
            looked_up = lookup.generate(prompt, max_new_tokens=args.max_new_tokens)
            if looked_up.token_ids != base.token_ids:
                raise SystemExit(f"greedy prompt lookup parted from plain decoding on {backend}: {prompt[:60]!r}")
            plain_s, plain_tokens = plain_s + decode_seconds(base), plain_tokens + len(base.token_ids)
            lookup_s, lookup_tokens = lookup_s + decode_seconds(looked_up), lookup_tokens + len(looked_up.token_ids)
            steps += [(len(step.draft_tokens), len(step.emitted)) for step in looked_up.steps]
        predicted = speedup_from_steps(steps, costs)
        measured = (plain_s / plain_tokens) / (lookup_s / lookup_tokens)
        print(
            f"| {plain.target.name} | {plain.backend_kind} {plain.precision} | {costs[1]:.1f} / "
            f"{costs[args.k + 1]:.1f} | {plain_tokens / plain_s:.1f} | {lookup_tokens / lookup_s:.1f} | "
            f"{lookup_tokens / len(steps):.2f} | {predicted:.2f}x | {measured:.2f}x | {predicted / measured:.2f} |",
            flush=True,
        )
        print(
            f"  plain decoding: {1000 * plain_s / plain_tokens:.1f} ms per token against a measured 1-row pass "
            f"of {costs[1]:.1f} ms; median tokens per pass {statistics.median(t for _, t in steps):.0f}"
        )
        if number == 0 and args.steps_out is not None:
            args.steps_out.parent.mkdir(parents=True, exist_ok=True)
            args.steps_out.write_text(json.dumps({"target": plain.target.name, "k": args.k, "steps": steps}))
            print(f"  steps kept in {args.steps_out}")


if __name__ == "__main__":
    main()
