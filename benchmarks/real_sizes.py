"""Verify-pass costs at real model sizes on the llama.cpp or native backend: random weights at 1B and 3B
(and, asked for, 8B) shapes with the default target's vocabulary, quantized by llama.cpp's own
quantizer, made here and never shipped. For each file: its load time, the exact decode size the
backend measures, what a pass of n rows costs in parts of that size (exact) and in one decode,
and the bound that puts on any speculative method: with every drafted token accepted, an n-row
pass yields n tokens for cost(n), so no method beats max over n of n * cost(1) / cost(n). Then the
speedup the default target (SmolLM2-135M, same tokenizer) is predicted to give as the draft
model of each file at acceptance rates 0.5 / 0.6 / 0.7 / 0.8, at its best K: quickdraft.analysis's
arithmetic over the measured costs (the 135M model's one-token pass on the same backend, timed in
the same run). A prediction, not a measured run.

    .venv/bin/python benchmarks/real_sizes.py [--shapes 1b 3b] [--types Q4_0 Q8_0 Q4_K_M] [--work DIR]
        [--backend llama.cpp | native:int4 | native:int8 | native:bf16] [--steps bench-out/prompt_lookup_steps.json]
        [--threads 1 2 [--extrapolate 16]]

A type "Q4_0-direct" is random 4-bit blocks written straight into the file (seconds, no F16 file
first: what real_sizes_footprint.py uses); the others are quantized from a random F16 file.
--backend native:int4, native:int8 or native:bf16 measures the native backend on the same files (no
exact-rows columns: its rows are exact at every size; int8 and bf16 de-quantize the file's blocks
and round them to the precision). --threads 1 2 times every pass at each thread count, interleaved
in one run, and adds a row for --extrapolate threads: each pass's cost fitted as serial + parallel
/ threads (quickdraft.analysis.cost_at_threads, Amdahl's law) and read at that count. The fit keeps
this machine's memory and cores: a prediction on paper, not a measurement. On native, a fitted pass
costs at most the cheapest larger one (analysis.padded_costs): the backend times its row kernels at
load and pads a pass to a cheaper shape, as it would on that machine. --steps adds prompt
lookup's predicted speedup: the steps of a measured run on the real default target
(benchmarks/prediction_check.py) replayed at each file's pass costs. Nothing here is a test;
compare only numbers from one run.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import torch
from exact_rows_cost import pass_ms  # this folder's: one timed pass after cached tokens

from quickdraft.analysis import best_k, cost_at_threads, padded_costs, pass_cost, predicted_speedup, speedup_from_steps
from quickdraft.backends.kernel_timing import DECODE_ROWS, VERIFY_ROWS
from quickdraft.backends.llama_cpp import ROW_INVARIANT_ROWS, LlamaCppBackend
from quickdraft.backends.select import make_backend
from quickdraft.models import default_gguf_path
from quickdraft.models.loading import load_model
from quickdraft.models.random_gguf import GgufShape, quantize_gguf, random_gguf

SHAPES = {  # the shapes of TinyLlama-1.1B, Llama-3.2-3B and Llama-3.1-8B, with SmolLM2's vocabulary
    "1b": GgufShape(hidden=2048, layers=22, ffn=5632, heads=32, kv_heads=4, head_dim=64, context=2048),
    "3b": GgufShape(hidden=3072, layers=28, ffn=8192, heads=24, kv_heads=8, head_dim=128, context=2048),
    "8b": GgufShape(hidden=4096, layers=32, ffn=14336, heads=32, kv_heads=8, head_dim=128, context=2048),
}
ROWS = (1, 2, 4, 8, 16)
CACHED = 128  # tokens in the cache before a timed pass
ALPHAS = (0.5, 0.6, 0.7, 0.8)  # acceptance rates the draft-model predictions are made at


def predictions(costs: dict[int, float], draft_ms: float) -> str:
    """Predicted speedup (best K) with a draft model of one-token cost draft_ms, at each of ALPHAS."""
    ratio = draft_ms / costs[1]
    verify = lambda k: pass_cost(costs, k + 1) / costs[1]  # noqa: E731 - K drafts verified in K + 1 rows
    best = {a: best_k(a, ratio, k_max=15, verify_ratio=verify) for a in ALPHAS}
    return " / ".join(f"{predicted_speedup(a, best[a], ratio, verify(best[a])):.2f}x (K={best[a]})" for a in ALPHAS)


def use_threads(backend, threads: int) -> None:
    """Later passes of `backend` on `threads` CPU threads (llama.cpp's own, else torch's)."""
    if isinstance(backend, LlamaCppBackend):
        backend.set_threads(threads)
    else:
        torch.set_num_threads(threads)


def open_backend(path: Path, name: str, choice: str, work: Path, rows: tuple[int, ...] = VERIFY_ROWS):
    """The backend `choice` names over a GGUF file: llama.cpp's, or native at the given precision
    with the kernels `quickdraft generate` would time and choose (kept under `work`) for passes of
    `rows` rows (VERIFY_ROWS a target's, DECODE_ROWS a draft model's)."""
    if choice == "llama.cpp":
        return LlamaCppBackend(path, name, threads=2)
    precision = choice.partition(":")[2]
    return make_backend(
        load_model(path, cache_dir=work / "cache"),
        "native",
        precision,
        "cpu",
        measure=True,
        cache_dir=work / "cache",
        kernel_rows=rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["1b", "3b"], choices=list(SHAPES))
    parser.add_argument(
        "--types", nargs="+", default=["Q4_0", "Q8_0", "Q4_K_M"], help="llama.cpp quantizer types, or Q4_0-direct"
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=Path("/tmp/quickdraft-real-sizes"),
        help="where the random files are made (kept for a rerun)",
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--backend",
        default="llama.cpp",
        choices=["llama.cpp", "native:int4", "native:int8", "native:bf16"],
        help="the backend measured (native: the file's blocks as int4, or de-quantized and rounded to int8 or bf16)",
    )
    parser.add_argument("--threads", nargs="+", type=int, default=[2], help="thread counts, timed interleaved")
    parser.add_argument(
        "--extrapolate",
        type=int,
        default=16,
        help="with two thread counts or more: the count the fitted costs are read at",
    )
    parser.add_argument(
        "--steps",
        type=Path,
        default=None,
        help="prompt-lookup steps kept by prediction_check.py --steps-out, replayed at each file's pass costs",
    )
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    replayed = [tuple(step) for step in json.loads(args.steps.read_text())["steps"]] if args.steps else []
    backend_label = args.backend.replace(":", " ")
    threads = sorted(set(args.threads))
    fitted = [args.extrapolate] if len(threads) > 1 else []
    print(
        f"{date.today()} · {platform.processor() or platform.machine()} · {backend_label} backend, "
        f"{' and '.join(map(str, threads))} threads · {CACHED} cached tokens, median of {args.rounds} "
        f"interleaved rounds" + (f" · {args.extrapolate} threads extrapolated (Amdahl fit)" if fitted else "")
    )
    torch.set_num_threads(max(threads))  # the native kernels are timed and chosen at the most threads
    draft = open_backend(default_gguf_path(), "SmolLM2-135M", args.backend, args.work, DECODE_ROWS)
    pass_ms(draft, 1, CACHED)  # warm-up
    draft_times: dict[int, list[float]] = {t: [] for t in threads}
    for _ in range(9):
        for t in threads:
            use_threads(draft, t)
            draft_times[t].append(pass_ms(draft, 1, CACHED))
    draft_ms = {t: statistics.median(value) for t, value in draft_times.items()}
    for t in fitted:
        draft_ms[t] = cost_at_threads({n: draft_ms[n] for n in threads}, t)
    del draft
    print(
        "draft model: the default target's one-token pass on the same backend, "
        + ", ".join(f"{draft_ms[t]:.1f} ms at {t} thread{'s' if t > 1 else ''}" for t in threads + fitted)
        + (f"; prompt lookup: {len(replayed)} steps of {args.steps}" if replayed else "")
    )
    print(
        "| shape | type | backend | threads | file GB | load s | exact rows | ms, 1 row | "
        "n rows / 1 row, exact (n = 2/4/8/16) | one decode | bound, exact | bound, one decode | "
        "predicted, 135M draft, a = 0.5 / 0.6 / 0.7 / 0.8 | predicted, prompt lookup (steps replayed) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.shapes:
        base = args.work / f"{name}-F16.gguf"
        for kind in args.types:
            path = args.work / f"{name}-{kind}.gguf"
            if kind == "Q4_0-direct" and not path.is_file():
                random_gguf(default_gguf_path(), path, SHAPES[name], dtype="Q4_0", progress=True)
            if not base.is_file() and not path.is_file():
                random_gguf(default_gguf_path(), base, SHAPES[name], dtype="F16", progress=True)
            if not path.is_file():
                print(f"quantizing {base.name} to {kind}", file=sys.stderr)
                quantize_gguf(base, path, kind)
            torch.set_num_threads(max(threads))
            start = time.perf_counter()
            backend = open_backend(path, f"{name}-{kind}", args.backend, args.work)
            load = time.perf_counter() - start
            exact = backend.measure_exact_rows() if args.backend == "llama.cpp" else None
            steps = (exact, ROW_INVARIANT_ROWS) if exact is not None else (None,)
            times: dict[tuple[int, int, int | None], list[float]] = {
                (t, n, s): [] for t in threads for n in ROWS for s in steps
            }
            pass_ms(backend, 1, CACHED)  # warm-up
            for _ in range(args.rounds):
                for n in ROWS:
                    for t in threads:
                        use_threads(backend, t)
                        for step in steps:
                            if step is not None:
                                backend.exact_rows = step
                            times[t, n, step].append(pass_ms(backend, n, CACHED))
            cost = {key: statistics.median(value) for key, value in times.items()}
            for t in fitted:
                fit = {n: cost_at_threads({u: cost[u, n, exact] for u in threads}, t) for n in ROWS}
                if args.backend != "llama.cpp":  # the native backend there would time its own row kernels and pad
                    fit = padded_costs(fit)
                cost.update({(t, n, exact): ms for n, ms in fit.items()})
                cost.update(
                    {
                        (t, n, s): cost_at_threads({u: cost[u, n, s] for u in threads}, t)
                        for n in ROWS
                        for s in steps
                        if s != exact
                    }
                )
            for t in threads + fitted:
                one = cost[t, 1, exact]
                ratios = {s: " / ".join(f"{cost[t, n, s] / one:.2f}" for n in ROWS[1:]) for s in steps}
                bounds = {s: f"{max(n * one / cost[t, n, s] for n in ROWS):.2f}x" for s in steps}
                costs = {n: cost[t, n, exact] for n in ROWS}
                lookup = f"{speedup_from_steps(replayed, costs):.2f}x" if replayed else ""
                label = f"{t} (fit)" if t in fitted else str(t)
                print(
                    f"| {name} | {kind} | {backend_label} | {label} | {path.stat().st_size / 1e9:.2f} | "
                    f"{load:.1f} | {exact or ''} | {one:.0f} | {ratios[exact]} | "
                    f"{ratios.get(ROW_INVARIANT_ROWS, '')} | {bounds[exact]} | "
                    f"{bounds.get(ROW_INVARIANT_ROWS, '')} | {predictions(costs, draft_ms[t])} | {lookup} |",
                    flush=True,
                )
            del backend
            torch.set_num_threads(max(threads))


if __name__ == "__main__":
    main()
