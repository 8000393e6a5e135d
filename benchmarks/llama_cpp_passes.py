"""What a verify pass costs on the llama.cpp backend: chains of n tokens, and token trees of n nodes
(view sequence ids, docs/llama-cpp.md) against a chain of the same size, in one run.

The cost model starts from these costs (backends/kernel_timing.py measure_pass_costs times the chains
once per machine); the tree rows show what the views cost on top of the same number of tokens.

Run:  .venv/bin/python benchmarks/llama_cpp_passes.py [--context 128] [--rounds 15]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
from tqdm import tqdm

from quickdraft.backends.backend import SeqPass
from quickdraft.backends.llama_cpp import LlamaCppBackend
from quickdraft.models import default_gguf_path
from quickdraft.tree import pass_layout

SIZES = (1, 2, 4, 8, 16, 32)


def wide_tree(nodes: int) -> list[int]:
    """Parents of a tree of `nodes` nodes, 4 children per expanded node, breadth first (an EAGLE-2 shape)."""
    parents = []
    for i in range(nodes):
        parents.append(-1 if i < 4 else (i - 4) // 4)
    return parents


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--context", type=int, default=128, help="cached tokens before each timed pass")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    backend = LlamaCppBackend(default_gguf_path(), "SmolLM2-135M-Instruct", threads=args.threads)
    context = [(7 + 13 * i) % backend.vocab_size for i in range(args.context)]
    cache = backend.new_cache()
    backend.forward([SeqPass(cache, context, logits="none")])

    def chain(n: int) -> None:
        backend.forward([SeqPass(cache, context[:n])])
        cache.truncate(args.context)

    def tree(n: int) -> None:
        mask, offsets = pass_layout(wide_tree(n - 1), [], None)  # the root and n - 1 nodes
        full = torch.cat([torch.ones(n, args.context, dtype=torch.bool), mask], dim=1)
        backend.forward([SeqPass(cache, context[:n], [args.context + o for o in offsets], full)])
        cache.truncate(args.context)

    cases = [("chain", n) for n in SIZES] + [("tree", n) for n in SIZES if n > 2]
    runs = {"chain": chain, "tree": tree}
    times: dict[tuple[str, int], list[float]] = {case: [] for case in cases}
    chain(1)
    for _ in tqdm(range(args.rounds), desc="rounds (every case, interleaved)", unit="round"):
        for kind, n in cases:
            start = time.perf_counter()
            runs[kind](n)
            times[(kind, n)].append(1000 * (time.perf_counter() - start))
    one = statistics.median(times[("chain", 1)])
    print(
        f"llama.cpp backend, SmolLM2-135M-Instruct Q4_1, {args.threads} threads, {args.context} cached tokens, "
        f"median of {args.rounds}; {time.strftime('%Y-%m-%d')}, {platform.machine()}"
    )
    print("| tokens in the pass | chain ms | x one token | tree ms (views) | tree / chain |")
    print("|---|---|---|---|---|")
    for n in SIZES:
        ms = statistics.median(times[("chain", n)])
        tree_ms = statistics.median(times[("tree", n)]) if ("tree", n) in times else None
        tree_cells = f"{tree_ms:.1f} | {tree_ms / ms:.2f}x" if tree_ms is not None else "| "
        print(f"| {n} | {ms:.1f} | {ms / one:.2f}x | {tree_cells} |")


if __name__ == "__main__":
    main()
