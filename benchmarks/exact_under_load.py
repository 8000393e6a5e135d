"""Exact under load, before and after: answers that differ from the same request alone, and
throughput, at several concurrencies, greedy and seeded (docs/llama-cpp.md, "Exactness").

Starts `quickdraft serve` twice, each in its own process: "after" is this checkout with the
installed build; "before" is another checkout (e.g. `git worktree add /tmp/before 7b5712e`) with
a llama-cpp-python built without patches/llama-cpp-ordered-cells.patch (e.g. `pip wheel` of the
source with only the first patch applied, installed with `pip install --no-deps --target
/tmp/old/site`), both first on the before server's PYTHONPATH, the checkout first (it runs there).
For each temperature and concurrency C (1 first: each request alone), C client workers send the
same Spec-Bench chat requests to one server then the other, back to back (request i seeded i), as
streaming chat completions through the official openai client. "differ": answers that differ
from the same server's answer to the same request alone.

    python benchmarks/exact_under_load.py --before-path /tmp/before:/tmp/old/site \\
        --output bench-out/exact-under-load
    python benchmarks/exact_under_load.py --after-only --backend native --output bench-out/exact-native
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from datetime import date
from pathlib import Path

import httpx
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).parent))
from serve_bench import differing, run_load, spec_bench_requests, start_server, write_report  # noqa: E402

from quickdraft.bench.report import machine  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before-path", help="the before server's PYTHONPATH: the checkout, the old build")
    parser.add_argument("--after-only", action="store_true", help="this checkout alone (no before server)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    parser.add_argument("--requests", type=int, default=40, help="requests per (server, temperature, concurrency)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--method", default="prompt-lookup", help="the requests' method (the server's default)")
    parser.add_argument("--target", help="the servers' target (default: the embedded one)")
    parser.add_argument("--backend", help="the servers' backend (default: their own choice)")
    parser.add_argument("--precision", help="the servers' precision (default: their own choice)")
    parser.add_argument("--context", type=int, default=8192, help="cells: room for every concurrent request")
    parser.add_argument(
        "--completions", action="store_true", help="text completions (a target without a chat template)"
    )
    parser.add_argument("--output", type=Path, default=Path("bench-out/exact-under-load"))
    args = parser.parse_args()
    if not args.after_only and not args.before_path:
        parser.error("give --before-path, or --after-only")
    concurrency = sorted(set(args.concurrency) | {1})  # alone first: what every other run is held to
    prompts = spec_bench_requests(args.requests)
    flags = ("--context", str(args.context))
    flags += tuple(
        f for name in ("target", "backend") if getattr(args, name) for f in (f"--{name}", getattr(args, name))
    )
    sides: dict[str, tuple[dict | None, Path | None]] = {"after": (None, None)}
    if not args.after_only:  # run in the checkout: `python -m` reads the working folder's package first
        checkout = Path(args.before_path.split(os.pathsep)[0])
        sides["before"] = (os.environ | {"PYTHONPATH": args.before_path}, checkout)
    servers = {
        side: start_server(args.precision, max(concurrency), args.max_tokens, flags, env=env, cwd=cwd)
        for side, (env, cwd) in sides.items()
    }
    results: dict[tuple, dict] = {}
    try:
        model = httpx.get(next(iter(servers.values()))[1] + "/v1/models").json()["data"][0]["id"]
        for _, url in servers.values():  # warm-up: the one-time checks and timings
            asyncio.run(run_load(url, model, prompts[:2], 2, args.method, 8, chat=not args.completions))
        cases = [(t, c, side) for t in args.temperatures for c in concurrency for side in servers]
        for temperature, clients, side in tqdm(cases, desc="load", unit="run"):
            url = servers[side][1]
            results[(side, temperature, clients)] = asyncio.run(
                run_load(url, model, prompts, clients, args.method, args.max_tokens, temperature, not args.completions)
            )
    finally:
        for process, _ in servers.values():
            process.terminate()
            process.wait(60)

    lines = [
        f"Target: {args.target or 'the embedded default'} ({args.backend or 'auto'} backend, "
        f"{args.precision or 'its precision'}); method {args.method}; {len(prompts)} streaming "
        f"{'text completion' if args.completions else 'chat'} requests "
        f"per run (Spec-Bench, max_tokens {args.max_tokens}, request i seeded i); context {args.context}; "
        f"{date.today()}; {machine()}. differ: answers that differ from the same server's answer alone "
        "(concurrency 1).",
        "",
        "| temperature | concurrency | "
        + " | ".join(f"{side} tok/s | {side} differ" for side in servers)
        + (" | after / before tok/s |" if "before" in servers else " |"),
        "|---|---|" + "---|---|" * len(servers) + ("---|" if "before" in servers else ""),
    ]
    totals = {side: [0, 0] for side in servers}  # side -> [compared, differ]
    for temperature in args.temperatures:
        for clients in concurrency:
            cells = []
            for side in servers:
                r = results[(side, temperature, clients)]
                differ = differing(r["texts"], results[(side, temperature, 1)]["texts"])
                if clients > 1:
                    totals[side][0] += len(prompts)
                    totals[side][1] += differ
                cells.append(f"{r['tokens_per_second']:.1f} | {differ} of {len(prompts)}")
            ratio = ""
            if "before" in servers:
                after, before = (results[(s, temperature, clients)]["tokens_per_second"] for s in ("after", "before"))
                ratio = f" {after / before:.2f}x |"
            lines.append(f"| {temperature} | {clients} | " + " | ".join(cells) + " |" + ratio)
    lines += [""] + [
        f"{side}: {differ} of {compared} concurrent answers differ from alone."
        for side, (compared, differ) in totals.items()
    ]
    raw = {f"{side}|{t}|{c}": r for (side, t, c), r in results.items()}
    write_report(args.output, "\n".join(lines), raw)


if __name__ == "__main__":
    main()
