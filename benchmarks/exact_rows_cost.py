"""What decoding in parts of a file's exact size costs on the llama.cpp backend: verify passes of n
rows decoded in parts of `exact_rows` (exact) against one decode (what the backend did before,
not exact on such files), timed interleaved in one run, and greedy prompt lookup end to end
under each against plain decoding.

    .venv/bin/python benchmarks/exact_rows_cost.py --target gemma-3-270m-q4_k_m.gguf

Prints milliseconds per pass and the ratios; nothing here is a test (the machine is noisy:
compare only ratios from one run).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from datetime import date

import quickdraft
from quickdraft.backends.backend import SeqPass
from quickdraft.backends.llama_cpp import ROW_INVARIANT_ROWS
from quickdraft.bench.prompts import default_prompt_file, read_prompt_file


def pass_ms(backend, rows: int, cached: int = 200) -> float:
    """One pass of `rows` tokens after `cached` ones, in milliseconds (benchmarks/real_sizes.py too)."""
    context = [(7 + 13 * i) % backend.vocab_size for i in range(cached + rows)]
    cache = backend.new_cache()
    backend.forward([SeqPass(cache, context[:cached], logits="none")])
    start = time.perf_counter()
    backend.forward([SeqPass(cache, context[cached:])])
    elapsed = (time.perf_counter() - start) * 1000
    cache.truncate(0)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=None)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    plain = quickdraft.load(args.target, method="none", backend="llama.cpp")
    backend = plain.target_backend
    exact = backend.exact_rows
    print(
        f"{date.today()} · {platform.processor() or platform.machine()} · {plain.target.name} on llama.cpp · "
        f"exact_rows {exact} · {backend.threads} threads"
    )
    sizes = (1, 2, 3, 4, 6, 9, 12, 17)
    times: dict[tuple[int, int], list[float]] = {(n, step): [] for n in sizes for step in (exact, ROW_INVARIANT_ROWS)}
    for _ in range(args.rounds):
        for n in sizes:
            for step in (exact, ROW_INVARIANT_ROWS):
                backend.exact_rows = step
                times[n, step].append(pass_ms(backend, n))
    backend.exact_rows = exact
    print(f"{'rows':>5} {'parts of ' + str(exact) + ' ms':>14} {'one decode ms':>14} {'ratio':>6}")
    for n in sizes:
        ours, before = statistics.median(times[n, exact]), statistics.median(times[n, ROW_INVARIANT_ROWS])
        print(f"{n:>5} {ours:>14.1f} {before:>14.1f} {ours / before:>6.2f}")

    path = default_prompt_file()
    records = read_prompt_file(path) if path else []
    step = max(1, len(records) // max(args.prompts, 1))
    prompts = [p.text for p in records[::step][: args.prompts]] or ["Write a Python function that checks primes."]
    lookup = plain.with_method("prompt-lookup:draft_length=fixed")
    seconds = {"plain": 0.0, f"lookup, parts of {exact}": 0.0, "lookup, one decode": 0.0}
    tokens = dict.fromkeys(seconds, 0)
    for text in prompts:  # interleaved per prompt
        for label, decoder, rows in (
            ("plain", plain, exact),
            (f"lookup, parts of {exact}", lookup, exact),
            ("lookup, one decode", lookup, ROW_INVARIANT_ROWS),
        ):
            backend.exact_rows = rows
            start = time.perf_counter()
            out = decoder.generate(text, max_new_tokens=args.max_new_tokens, temperature=0)
            seconds[label] += time.perf_counter() - start
            tokens[label] += len(out.token_ids)
    backend.exact_rows = exact
    print(f"greedy, {len(prompts)} Spec-Bench prompts, {args.max_new_tokens} new tokens:")
    for label, value in seconds.items():
        rate = tokens[label] / value
        print(f"  {label:24} {rate:6.1f} tok/s  {rate / (tokens['plain'] / seconds['plain']):5.2f}x plain")


if __name__ == "__main__":
    main()
