"""Would prompt lookup draft more with several chains? An offline bound over a bench's outputs.

Prompt lookup (and the lookup branch of head trees) proposes one chain: what followed the latest
earlier match of the longest n-gram. For each prompt of a `quickdraft bench` report folder, this
replays method none's output (the target's own tokens) as lookup would decode it, one target
pass per step, and counts tokens per pass when each step may take the best of its first M
distinct chains (longest n-gram first, then latest match first), picked knowing the answer:
what any rule choosing among M chains could at most reach.

    python benchmarks/lookup_chains.py --results docs/bench/head-vocab16k
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import quickdraft
from quickdraft.bench.prompts import default_prompt_file, load_prompts
from quickdraft.bench.report import read_results


def chains(tokens: list[int], longest: int, max_ngram: int, min_ngram: int) -> list[list[int]]:
    """The distinct continuations (up to `longest` tokens) of every earlier match of the text's
    last n tokens, n from max_ngram down, latest match first: the first is prompt lookup's own."""
    found: list[list[int]] = []
    end = len(tokens)
    for n in range(min(max_ngram, end - 1), min_ngram - 1, -1):
        suffix = tokens[end - n :]
        for start in range(end - n - 1, -1, -1):
            chain = tokens[start + n : start + n + longest]
            if tokens[start : start + n] == suffix and chain and chain not in found:
                found.append(chain)
    return found


def matched(chain: list[int], truth: list[int]) -> int:
    """How many of the chain's tokens the target wrote, in order."""
    count = 0
    for drafted, written in zip(chain, truth):
        if drafted != written:
            break
        count += 1
    return count


def passes(prompt: list[int], output: list[int], best_of: int, longest: int, max_ngram: int, min_ngram: int) -> int:
    """Target passes to write `output` after `prompt` when each step drafts the best of its first
    `best_of` chains (each pass adds the accepted tokens and one of the target's own)."""
    sequence, at, count = prompt + output, len(prompt), 0
    while at < len(sequence):
        options = chains(sequence[:at], longest, max_ngram, min_ngram)[:best_of]
        accepted = max((matched(c, sequence[at : at + longest]) for c in options), default=0)
        at += min(accepted, len(sequence) - at - 1) + 1
        count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--results",
        type=Path,
        required=True,
        help="a bench report folder (its results.json or .json.gz) of Spec-Bench prompts",
    )
    parser.add_argument("--per-category", type=int, default=5, help="the bench's --per-category")
    parser.add_argument("--best-of", type=int, nargs="*", default=[1, 2, 4, 8])
    parser.add_argument("--longest", type=int, default=16, help="a chain's most tokens (the branch's k_max)")
    parser.add_argument("--max-ngram", type=int, default=3)
    parser.add_argument("--min-ngram", type=int, default=2)
    args = parser.parse_args()
    results = read_results(args.results)["prompts"]
    prompts = load_prompts(default_prompt_file(), per_category=args.per_category)
    decoder = quickdraft.load(method="none", measure_shapes=False)  # its tokenizer and chat template
    written, counted = defaultdict(int), defaultdict(lambda: defaultdict(int))
    for prompt, result in zip(prompts, results, strict=True):
        ids, output = decoder.encode(prompt.text), result["runs"]["none"][0]["tokens"]
        if len(ids) != result["prompt_tokens"] or prompt.category != result["category"]:
            raise SystemExit(f"{args.results} was not run on these prompts (--per-category {args.per_category}?)")
        for group in (prompt.category, "overall"):
            written[group] += len(output)
            for m in args.best_of:
                counted[group][m] += passes(ids, output, m, args.longest, args.max_ngram, args.min_ngram)
    print("tokens per target pass, lookup alone, best of the first M distinct chains (picked knowing the answer)")
    print("| group | " + " | ".join(f"M = {m}" for m in args.best_of) + " |")
    print("|---|" + "---|" * len(args.best_of))
    for group in sorted(written, key=lambda g: g == "overall"):  # groups in file order, overall last
        print(f"| {group} | " + " | ".join(f"{written[group] / counted[group][m]:.2f}" for m in args.best_of) + " |")


if __name__ == "__main__":
    main()
