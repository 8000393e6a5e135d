"""How much of a bench's plain output a draft vocabulary can draft at all.

A head scores only its draft vocabulary; a token outside it is never drafted, however well the
head knows the text. For a `quickdraft bench` report folder, prints the share of method none's
output tokens (the target's own) inside each head's draft vocabulary and inside the N most
frequent tokens of an answers file (what `train --vocab N` would keep), by group and overall.

    python benchmarks/vocab_coverage.py --results docs/bench/head-vocab16k \
        --head quickdraft/heads/shipped/SmolLM2-135M-Instruct/eagle --answers data/answers/answers-*.jsonl \
        --sizes 8192 16384 24576 32768
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from safetensors import safe_open

from quickdraft.bench.report import read_results
from quickdraft.heads.format import HEADS_FILE
from quickdraft.training.distill import read_answers


def plain_outputs(results: Path) -> dict[str, list[int]]:
    """group -> the tokens method none wrote for its prompts (the first repeat)."""
    groups: dict[str, list[int]] = defaultdict(list)
    for prompt in read_results(results)["prompts"]:
        groups[prompt["category"]] += prompt["runs"]["none"][0]["tokens"]
    return groups


def by_frequency(answers: list[Path]) -> list[int]:
    """Every id of the answers files' answers, most often seen first (ties: the lower id)."""
    counts: dict[int, int] = defaultdict(int)
    for path in answers:
        for ids in read_answers(path).values():
            for token in ids:
                counts[token] += 1
    return sorted(counts, key=lambda t: (-counts[t], t))


def coverage_row(groups: dict[str, list[int]], vocab: set[int]) -> dict[str, float]:
    """group (and "overall") -> the share of its tokens inside `vocab`."""
    row = {group: sum(t in vocab for t in tokens) / len(tokens) for group, tokens in groups.items()}
    every = [t for tokens in groups.values() for t in tokens]
    return {**row, "overall": sum(t in vocab for t in every) / len(every)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--results",
        type=Path,
        required=True,
        help="a bench report folder (its results.json or .json.gz) with method none",
    )
    parser.add_argument("--head", type=Path, nargs="*", default=[], help="head folders (their draft vocabularies)")
    parser.add_argument("--answers", type=Path, nargs="*", default=[], help="answers files (train --distill)")
    parser.add_argument("--sizes", type=int, nargs="*", default=[8192, 16384, 24576, 32768])
    args = parser.parse_args()
    groups = plain_outputs(args.results)
    rows = {}
    for folder in args.head:
        with safe_open(str(folder / HEADS_FILE), "pt") as file:
            rows[f"head {folder}"] = coverage_row(groups, set(file.get_tensor("vocab").tolist()))
    ranked = by_frequency(args.answers)  # read once, cut at each size
    for size in args.sizes if args.answers else []:
        rows[f"top {size} of the answers"] = coverage_row(groups, set(ranked[:size]))
    names = [*groups, "overall"]
    print(f"tokens: {sum(len(t) for t in groups.values())} of method none in {args.results}")
    print("| vocabulary | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for label, row in rows.items():
        print(f"| {label} | " + " | ".join(f"{row[name]:.1%}" for name in names) + " |")


if __name__ == "__main__":
    main()
