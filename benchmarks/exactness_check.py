"""Greedy speculative decoding against plain decoding of the same target on real prompts: how many
outputs are equal token for token, and where the others first differ (none should).

    .venv/bin/python benchmarks/exactness_check.py --target gemma-3-270m-q4_k_m.gguf \
        --draft SmolLM2-135M-Instruct.Q4_1.gguf --method draft --prompts 20 --max-new-tokens 48

--target/--draft: what `quickdraft generate` takes (default target: the embedded default). Prompts:
every n-th line of Spec-Bench's question.jsonl (../shared/data), so every category is in, plus
any --prompt given.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from datetime import date

from tqdm import tqdm

import quickdraft
from quickdraft.bench.prompts import default_prompt_file, read_prompt_file


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (None: equal)."""
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=None)
    parser.add_argument("--draft", default=None)
    parser.add_argument("--method", default="prompt-lookup:draft_length=fixed")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--prompts", type=int, default=20, help="Spec-Bench prompts, spread over the file")
    parser.add_argument("--prompt", action="append", default=[], help="a prompt of your own (repeatable)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args()

    path = default_prompt_file()
    records = read_prompt_file(path) if path and args.prompts else []
    step = max(1, len(records) // args.prompts) if records else 1
    prompts = [(p.category, p.text) for p in records[::step][: args.prompts]] + [("own", p) for p in args.prompt]
    plain = quickdraft.load(args.target, method="none", backend=args.backend)
    fast = (
        quickdraft.load(args.target, args.draft, method=args.method, backend=args.backend)
        if args.draft
        else plain.with_method(args.method)
    )
    print(
        f"{date.today()} · {platform.processor() or platform.machine()} · target {plain.target.name} "
        f"on {plain.backend_kind} · {fast.config.label()} on {fast.backend_kind}"
        f"{f' · draft {fast.draft.name}' if fast.draft else ''}",
        file=sys.stderr,
    )
    equal, accepted, passes, tokens, seconds = 0, 0, 0, 0, [0.0, 0.0]
    for category, text in tqdm(prompts, desc="prompts", file=sys.stderr):
        start = time.perf_counter()
        want = plain.generate(text, max_new_tokens=args.max_new_tokens, temperature=0)
        middle = time.perf_counter()
        got = fast.generate(text, max_new_tokens=args.max_new_tokens, temperature=0)
        seconds[0], seconds[1] = seconds[0] + middle - start, seconds[1] + time.perf_counter() - middle
        where = first_difference(want.token_ids, got.token_ids)
        equal += where is None
        accepted += sum(step.accepted for step in got.steps)
        passes, tokens = passes + got.stats.target_passes, tokens + len(got.token_ids)
        tqdm.write(
            f"{category:14} {len(plain.encode(text)):5} prompt tokens  "
            f"{'equal' if where is None else f'DIFFERS at token {where}'}",
            file=sys.stderr,
        )
    print(
        f"equal: {equal}/{len(prompts)}  drafted tokens accepted: {accepted}  tokens per target pass: "
        f"{tokens / max(passes, 1):.2f}  seconds plain/speculative: {seconds[0]:.1f}/{seconds[1]:.1f}"
    )


if __name__ == "__main__":
    main()
