"""Server load: requests/s and tokens/s at several concurrencies, speculation on and off, and
one client through the server against the library on the same requests; and the promise under
load: how many answers differ from the same request's answer alone (the one-client run).

Starts `quickdraft serve` in its own process on a free port (the embedded default target), as
users run it; then for each method and concurrency C runs C client workers in this process,
each sending its share of the requests one after another as streaming chat completions
(greedy, or sampled with a seed of their own per request) through the official openai client.
Right before each method's one-client run, this process decodes the same requests with the
library (`Decoder.generate`, one at a time), so the single-client ratio compares runs made back
to back. Prompts: Spec-Bench questions taken
from each category in turn. Figures are over the whole wall time of each run.

    python benchmarks/serve_bench.py --output bench-out/serve
    python benchmarks/serve_bench.py --precision fp32 --temperature 0.7 --concurrency 1 4 16
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import socket
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import httpx
import openai
from tqdm import tqdm

import quickdraft
from quickdraft.bench.prompts import default_prompt_file, load_prompts
from quickdraft.bench.report import machine


async def run_load(
    url: str,
    model: str,
    prompts: list[str],
    concurrency: int,
    method: str | None,
    max_tokens: int,
    temperature: float = 0.0,
    chat: bool = True,
) -> dict:
    """C workers sending `prompts` as streaming chat requests (greedy; or sampled at `temperature`,
    request i with seed i); method None: the server's own (a peer's server, which knows no
    `quickdraft` field); chat False: text completions (a model without a chat template). Also
    returns each prompt's text."""
    seeds = {prompt: i for i, prompt in enumerate(prompts)}
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
    queue = list(prompts)
    latencies, first_tokens, tokens, texts = [], [], 0, {}

    async def worker() -> None:
        nonlocal tokens
        while queue:
            prompt = queue.pop()
            start = time.perf_counter()
            ask = client.chat.completions.create if chat else client.completions.create
            given = {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
            stream = await ask(
                model=model,
                **given,
                max_tokens=max_tokens,
                temperature=temperature,
                **({"seed": seeds[prompt]} if temperature > 0 else {}),
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"quickdraft": {"method": method}} if method else None,
            )
            first, pieces = None, []
            async for chunk in stream:
                piece = (chunk.choices[0].delta.content if chat else chunk.choices[0].text) if chunk.choices else None
                if piece:
                    first = first or time.perf_counter() - start
                    pieces.append(piece)
                if chunk.usage is not None:
                    tokens += chunk.usage.completion_tokens
            texts[prompt] = "".join(pieces)
            latencies.append(time.perf_counter() - start)
            first_tokens.append(first or latencies[-1])

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    await client.close()
    return {
        "requests": len(prompts),
        "tokens": tokens,
        "seconds": wall,
        "requests_per_second": len(prompts) / wall,
        "tokens_per_second": tokens / wall,
        "median_latency": statistics.median(latencies),
        "p95_latency": quantile(latencies, 0.95),
        "median_first_token": statistics.median(first_tokens),
        "latencies": latencies,
        "texts": texts,
    }


def differing(texts: dict[str, str], alone: dict[str, str]) -> int:
    """How many requests' answers differ from their answers alone."""
    return sum(texts.get(prompt) != text for prompt, text in alone.items())


def quantile(values: list[float], share: float) -> float:
    """The value below which `share` of values lie (nearest rank: no interpolation over few requests)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def run_library(decoder, prompts: list[str], method: str, max_tokens: int, temperature: float = 0.0) -> dict:
    """The same requests through the library, one after another: tokens over the whole wall time."""
    method_decoder = decoder.with_method(method)
    start, tokens = time.perf_counter(), 0
    for i, prompt in enumerate(prompts):
        seed = {"seed": i} if temperature > 0 else {}
        out = method_decoder.generate(prompt, max_new_tokens=max_tokens, temperature=temperature, **seed)
        tokens += len(out.token_ids)
    wall = time.perf_counter() - start
    return {"requests": len(prompts), "tokens": tokens, "seconds": wall, "tokens_per_second": tokens / wall}


def spec_bench_requests(count: int) -> list[str]:
    """`count` Spec-Bench questions, taken from each category in turn."""
    by_category: dict[str, list[str]] = {}
    for prompt in load_prompts(default_prompt_file(), per_category=count):
        by_category.setdefault(prompt.category, []).append(prompt.text)
    rounds = itertools.zip_longest(*by_category.values())
    return [text for round_ in rounds for text in round_ if text is not None][:count]


def write_report(folder: Path, report: str, raw: dict) -> None:
    """Print the report; write it and the raw figures to folder/report.md and folder/raw.json."""
    print(report)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.md").write_text(report + "\n")
    (folder / "raw.json").write_text(json.dumps(raw, indent=1))


def start_server(
    precision: str | None,
    max_batch: int,
    max_tokens: int,
    extra: tuple[str, ...] = (),
    timeout: float = 300,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> tuple[subprocess.Popen, str]:
    """`quickdraft serve` (with `extra` flags) in its own process on a free port, run by `python`
    in `cwd` (with `env`: another checkout's, run in it, since `python -m` reads the working folder's
    package first); returns it once /health answers."""
    port = free_port()
    command = [
        python,
        "-m",
        "quickdraft.cli",
        "serve",
        "--port",
        str(port),
        *(["--precision", precision] if precision else []),
        "--max-batch",
        str(max_batch),
        "--max-tokens-limit",
        str(max_tokens),
        *extra,
    ]
    process = subprocess.Popen(command, env=env, cwd=cwd)
    url = f"http://127.0.0.1:{port}"
    wait_for_health(process, url, timeout, "quickdraft serve")
    return process, url


def free_port() -> int:
    """A localhost port free right now (for a server started next)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_health(process: subprocess.Popen, url: str, timeout: float, name: str) -> None:
    """Until url/health answers 200; a server that exits or does not answer in time is an error."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.5)
    process.terminate()
    raise RuntimeError(f"{name} did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8], help="1 always runs (alone)")
    parser.add_argument("--methods", nargs="+", default=["none", "prompt-lookup"])
    parser.add_argument("--requests", type=int, default=16, help="requests per (method, concurrency) run")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0, help="above 0: sampled, request i with seed i")
    parser.add_argument("--target", default=None, help="the server's target (default: the embedded one)")
    parser.add_argument("--backend", default=None, help="the server's backend (default: its own choice)")
    parser.add_argument("--precision", default=None, help="the server's precision (default: its own choice)")
    parser.add_argument("--output", type=Path, default=Path("bench-out/serve"))
    args = parser.parse_args()
    args.concurrency = sorted(set(args.concurrency) | {1})  # alone first: what every other run is held to

    chosen = {"target": args.target, "backend": args.backend, "precision": args.precision}
    decoder = quickdraft.load(method="prompt-lookup", **{k: v for k, v in chosen.items() if v})
    source = default_prompt_file()
    prompts = spec_bench_requests(args.requests)
    flags = tuple(f for name in ("target", "backend") if chosen[name] for f in (f"--{name}", chosen[name]))
    process, url = start_server(args.precision, max(args.concurrency), args.max_tokens, flags)
    model = decoder.target.name
    library = {}
    try:
        asyncio.run(run_load(url, model, prompts[:2], 2, "none", min(8, args.max_tokens)))  # warm-up
        run_library(decoder, prompts[:2], "none", min(8, args.max_tokens), args.temperature)
        results = {}
        cases = [(c, m) for c in args.concurrency for m in args.methods]
        for concurrency, method in tqdm(cases, desc="load", unit="run"):
            if concurrency == 1:  # the library on the same requests, right before the server
                library[method] = run_library(decoder, prompts, method, args.max_tokens, args.temperature)
            results[(method, concurrency)] = asyncio.run(
                run_load(url, model, prompts, concurrency, method, args.max_tokens, args.temperature)
            )
    finally:
        process.terminate()
        process.wait(60)

    sampling = f"T {args.temperature}, request i seeded i" if args.temperature > 0 else "greedy"
    lines = [
        f"Target: {model} ({decoder.backend_kind}, {decoder.precision}); {len(prompts)} streaming chat requests "
        f"per run ({sampling}, max_tokens {args.max_tokens}, prompts from {source or 'the built-in set'}); max "
        f'batch {max(args.concurrency)}; {date.today()}; {machine()}. "differ": answers that differ from the '
        "same request's answer alone (the one-client run).",
        "",
        "| concurrency | method | requests/s | tokens/s | median latency s | median first token s | tokens/s vs none "
        "| differ |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for concurrency in args.concurrency:
        base = results.get(("none", concurrency))
        for method in args.methods:
            r = results[(method, concurrency)]
            ratio = f"{r['tokens_per_second'] / base['tokens_per_second']:.2f}x" if base else ""
            differ = differing(r["texts"], results[(method, 1)]["texts"])
            lines.append(
                f"| {concurrency} | {method} | {r['requests_per_second']:.2f} | {r['tokens_per_second']:.1f} "
                f"| {r['median_latency']:.2f} | {r['median_first_token']:.2f} | {ratio} | {differ} of {len(prompts)} |"
            )
    if library:
        lines += [
            "",
            "One client through the server against the library, the same requests back to back:",
            "",
            "| method | library tokens/s | server tokens/s (1 client) | server / library |",
            "|---|---|---|---|",
        ]
        for method, lib in library.items():
            served = results[(method, 1)]["tokens_per_second"]
            lines.append(
                f"| {method} | {lib['tokens_per_second']:.1f} | {served:.1f} | "
                f"{served / lib['tokens_per_second']:.2f}x |"
            )
    raw = {f"{m}|{c}": r for (m, c), r in results.items()} | {f"library|{m}": r for m, r in library.items()}
    write_report(args.output, "\n".join(lines), raw)


if __name__ == "__main__":
    main()
