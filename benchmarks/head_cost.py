"""What a draft-head step costs on the embedded default target, next to the target pass it feeds.

Times (median of --repeats) one EAGLE proposal (commit the verified pairs, grow a tree) and one
Medusa proposal with the shipped heads, for the head in fp32 and as int8 and int4 drafting copies
(drafting uses the faster of the two here, heads/inference.py draft_kernel), over the draft
vocabulary and over the full one; then an int4 target pass of 1 + N rows at
context ~200 for the tree sizes a proposal can have. Prints a JSON summary.

    python benchmarks/head_cost.py --output bench-out/head_cost.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from datetime import date
from pathlib import Path

import torch

import quickdraft
from quickdraft.backends.backend import SeqPass
from quickdraft.drafters.drafter import DraftRequest, StepOutcome
from quickdraft.drafters.eagle import EagleDrafter
from quickdraft.drafters.medusa import MedusaDrafter
from quickdraft.heads.eagle3 import Eagle3Head
from quickdraft.heads.inference import DRAFT_KERNELS, for_drafting
from quickdraft.heads.store import load_head
from quickdraft.sampling import SamplingParams

PROMPT = "Write a Python function that checks whether a number is prime, and explain how it works."


def median_ms(run, repeats: int) -> float:
    run()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1000, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--output", type=Path, default=Path("bench-out/head_cost.json"))
    args = parser.parse_args()
    decoder = quickdraft.load(method="none", precision="int4")
    target = decoder.target
    prompt = decoder.encode(PROMPT)
    generation = decoder.start(prompt, max_new_tokens=64)
    for _ in generation:
        pass
    tokens = generation.tokens  # ~110 tokens of real context
    backend = decoder.target_backend
    cache = backend.new_cache()

    def states(taps: tuple[int, ...]) -> torch.Tensor:
        """The target's states over the context: [n, H], or an EAGLE-3 head's taps side by side [n, 3 H]."""
        cache.truncate(0)
        return backend.forward([SeqPass(cache, tokens[:-1], logits="none", hidden=True, taps=taps)])[0].hidden

    params, generator = SamplingParams(), torch.Generator()
    results: dict = {
        "date": str(date.today()),
        "machine": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "context": len(tokens),
        "draft": {},
        "target_pass": {},
    }

    for kind in ("eagle", "medusa"):
        for full in (False, True):
            if full and kind == "eagle" and isinstance(load_head(kind, target, None), Eagle3Head):
                continue  # an EAGLE-3 head has its own LM head over its draft vocabulary
            for kernel in (None, *DRAFT_KERNELS):
                head = load_head(kind, target, None, full_vocab=full)
                head = for_drafting(head, kernel) if kernel else head.eval()
                drafter = (
                    EagleDrafter(head, backend.max_length, 4, 16) if kind == "eagle" else MedusaDrafter(head, 4, 16)
                )
                depth = 5 if kind == "eagle" else 3
                hidden = states(getattr(drafter, "taps", ()))

                state = drafter.begin(tokens, hidden[:-4])  # the prompt's states (the cost counts, not the pairing)
                drafter.propose([DraftRequest(state, tokens, depth, params, generator)])

                def propose() -> None:  # one step: the states of a pass that accepted 3 drafts, then a tree
                    drafter.update(state, StepOutcome(tokens, (0, 1, 2), hidden[-4:]))
                    drafter.propose([DraftRequest(state, tokens, depth, params, generator)])

                name = f"{kind} {'full vocabulary' if full else 'draft vocabulary'} {kernel or 'fp32'}"
                results["draft"][name] = median_ms(propose, args.repeats)
                print(name, results["draft"][name], flush=True)

    for rows in (1, 4, 8, 12, 16, 24, 32):

        def target_pass() -> None:
            positions = list(range(len(tokens) - 1, len(tokens) - 1 + rows))
            backend.forward([SeqPass(cache, tokens[-rows:], positions)])
            cache.truncate(len(tokens) - 1)

        cache.truncate(len(tokens) - 1)
        results["target_pass"][rows] = median_ms(target_pass, args.repeats)
        print("target pass rows", rows, results["target_pass"][rows], flush=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
