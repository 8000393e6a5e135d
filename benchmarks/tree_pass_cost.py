"""What a token-tree verify pass costs against a chain of the same size and a one-token pass, on
the native backend (row-invariant attention below fp32), for the embedded default target.

For n = 2..8 tokens per pass after --context cached tokens it times a chain pass and a tree pass
(the root, then nodes under it in EAGLE's shape: two children per expanded node, the first
child expanded), the tree both ways the backend can read it (each row gathering its own keys,
and read in place where this machine's kernel allows: models/row_attention.py), the median of
--repeats interleaved rounds, cache rolled back after each.

    python benchmarks/tree_pass_cost.py --precision int4 --context 300
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from datetime import date

import torch
from tqdm import tqdm

import quickdraft
from quickdraft.backends.backend import SeqPass
from quickdraft.backends.select import make_backend
from quickdraft.tree import depths, tree_mask


def bushy_parents(nodes: int) -> list[int]:
    """Nodes under the root: each expanded node gets two children, the first child expands next."""
    parents, expand = [], -1
    while len(parents) < nodes:
        parents.append(expand)
        if len(parents) < nodes:
            parents.append(expand)
        expand = len(parents) - 2  # the first of the two children just added
    return parents[:nodes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="int4")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = quickdraft.load(method="none", backend="native", precision=args.precision).target
    backend = make_backend(target, "native", args.precision)
    cache = backend.new_cache()
    context = [1 + (7 * i) % 500 for i in range(args.context)]
    backend.forward([SeqPass(cache, context, logits="none")])
    sizes = range(2, 9)

    def chain(n: int) -> SeqPass:
        return SeqPass(cache, [7] * n)

    def tree(n: int) -> SeqPass:
        parents = bushy_parents(n - 1)
        mask = torch.cat([torch.ones(n, args.context, dtype=torch.bool), tree_mask(parents)], dim=1)
        return SeqPass(cache, [7] * n, positions=[args.context + d for d in [0, *depths(parents)]], mask=mask)

    in_place = backend.in_place_trees  # what this machine's check allowed (backends/kernel_timing.py)
    kinds = [("chain", chain, False), ("tree", tree, False)] + ([("tree in place", tree, True)] if in_place else [])
    cases = [("one", 1, lambda n: SeqPass(cache, [7]), False)] + [
        (kind, n, make, place) for n in sizes for kind, make, place in kinds
    ]
    times: dict[tuple[str, int], list[float]] = {(kind, n): [] for kind, n, _, _ in cases}
    for _ in tqdm(range(args.repeats), desc="rounds", unit="round"):
        for kind, n, make, place in cases:
            backend.in_place_trees = place
            p = make(n)
            start = time.perf_counter()
            backend.forward([p])
            times[(kind, n)].append(1000 * (time.perf_counter() - start))
            cache.truncate(args.context)
    ms = {key: statistics.median(t) for key, t in times.items()}
    one = ms[("one", 1)]
    cpu = platform.processor() or platform.machine()
    print(
        f"native {args.precision}, {args.context} cached tokens, {args.threads} threads, {cpu}, "
        f"torch {torch.__version__}, {date.today()}; one-token pass {one:.1f} ms; trees read in place: "
        f"{'allowed' if in_place else 'not exact with this kernel'}"
    )
    print(
        "| tokens in the pass | chain ms | x one token | tree ms (gathered) | x one token | tree / chain |"
        + (" tree ms (in place) | x one token | tree / chain |" if in_place else "")
    )
    print("|---|---|---|---|---|---|" + ("---|---|---|" if in_place else ""))
    for n in sizes:
        c, t = ms[("chain", n)], ms[("tree", n)]
        line = f"| {n} | {c:.1f} | {c / one:.2f}x | {t:.1f} | {t / one:.2f}x | {t / c:.2f}x |"
        if in_place:
            r = ms[("tree in place", n)]
            line += f" {r:.1f} | {r / one:.2f}x | {r / c:.2f}x |"
        print(line)


if __name__ == "__main__":
    main()
