"""Load and faults: `quickdraft serve` in its own process, driven over HTTP as clients would.

Prints (and writes to --output/report.md):
- requests/s and p50/p95 latency at each concurrency (streaming off, greedy);
- the server's RSS after 400 requests, and after requests with 40 distinct option values;
- how long a healthy request takes alone and while a hostile one is in flight (a 5 MB body;
  temperature 1e-38 and top_p 1e-300 beside healthy requests), and whether the healthy ones answered.

The code under test is whatever `python -m quickdraft.cli` imports from the working folder, so
the same script measures two checkouts (run it from each).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_bench import start_server, write_report  # noqa: E402

PROMPTS = [
    "What is a prime number?",
    "Why is the sky blue?",
    "Name three fruits.",
    "What is Python?",
    "How do plants grow?",
    "What is rain?",
    "Who was Ada Lovelace?",
    "What is a CPU?",
]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def post(client: httpx.AsyncClient, url: str, body: dict, timeout: float = 300) -> tuple[int, float]:
    start = time.perf_counter()
    try:
        response = await client.post(url + "/v1/chat/completions", json=body, timeout=timeout)
        status = response.status_code
    except httpx.TimeoutException:
        status = 0  # no answer in time
    return status, time.perf_counter() - start


def chat(model: str, prompt: str, max_tokens: int, **extra) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    } | extra


async def load_level(url: str, model: str, concurrency: int, requests: int, max_tokens: int) -> dict:
    queue = [PROMPTS[i % len(PROMPTS)] for i in range(requests)]
    latencies, statuses = [], []
    async with httpx.AsyncClient() as client:

        async def worker() -> None:
            while queue:
                status, seconds = await post(client, url, chat(model, queue.pop(), max_tokens))
                statuses.append(status)
                latencies.append(seconds)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    latencies.sort()
    return {
        "concurrency": concurrency,
        "requests": requests,
        "ok": statuses.count(200),
        "requests_per_second": requests / wall,
        "p50": statistics.median(latencies),
        "p95": latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))],
    }


async def fill(url: str, model: str, total: int, concurrency: int, max_tokens: int) -> int:
    level = await load_level(url, model, concurrency, total, max_tokens)
    return level["ok"]


async def distinct_options(url: str, model: str, count: int, prompt_words: int) -> int:
    long_prompt = " ".join(f"item{i % 97}" for i in range(prompt_words)) + " Summarize the list."
    ok = 0
    async with httpx.AsyncClient() as client:
        for k in range(1, count + 1):
            body = chat(model, long_prompt, 4, quickdraft={"method": "prompt-lookup", "k": k})
            status, _ = await post(client, url, body)
            ok += status == 200
    return ok


async def healthy_beside(url: str, model: str, hostile: str, max_tokens: int) -> dict:
    """A healthy request's latency alone, then while `hostile` is in flight."""
    async with httpx.AsyncClient() as client:
        _, alone = await post(client, url, chat(model, PROMPTS[0], max_tokens))

        async def attack() -> int:
            if hostile == "5 MB body":
                body = chat(model, "x" * (5 << 20), max_tokens)
                status, _ = await post(client, url, body, timeout=120)
                return status
            options = [{"temperature": 1e-38}, {"temperature": 1, "top_p": 1e-300}]
            results = await asyncio.gather(
                *(post(client, url, chat(model, PROMPTS[1], max_tokens, **o)) for o in options)
            )
            return max(status for status, _ in results)

        async def healthy() -> tuple[int, float]:
            await asyncio.sleep(0.05)  # the hostile request goes first
            return await post(client, url, chat(model, PROMPTS[0], max_tokens), timeout=120)

        hostile_status, (status, beside) = await asyncio.gather(attack(), healthy())
    return {
        "hostile": hostile,
        "hostile_status": hostile_status,
        "healthy_alone": alone,
        "healthy_beside": beside,
        "healthy_status": status,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 16, 32])
    parser.add_argument("--requests", type=int, default=32, help="requests per concurrency level")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--label", default="", help="a name for this checkout in the report")
    parser.add_argument("--output", type=Path, default=Path("bench-out/server-faults"))
    args = parser.parse_args()

    process, url = start_server(args.precision, max(args.concurrency), 64)
    model = httpx.get(url + "/health").json()["model"]
    results: dict = {"label": args.label, "levels": []}
    try:
        asyncio.run(load_level(url, model, 2, 2, 4))  # warm-up
        results["rss_start_mb"] = rss_mb(process.pid)
        done = 2
        for concurrency in args.concurrency:
            results["levels"].append(asyncio.run(load_level(url, model, concurrency, args.requests, args.max_tokens)))
            done += args.requests
        asyncio.run(fill(url, model, max(0, 400 - done), max(args.concurrency), 4))
        results["rss_after_400_mb"] = rss_mb(process.pid)
        results["distinct_ok"] = asyncio.run(distinct_options(url, model, 40, 400))
        results["rss_after_40_distinct_mb"] = rss_mb(process.pid)
        results["hostile"] = [
            asyncio.run(healthy_beside(url, model, h, 8)) for h in ("5 MB body", "temperature 1e-38 / top_p 1e-300")
        ]
    finally:
        process.terminate()
        process.wait(60)

    lines = [
        f"{args.label or 'this checkout'}: `quickdraft serve --precision {args.precision} --max-batch "
        f"{max(args.concurrency)}`; {date.today()}; chat requests, greedy, max_tokens {args.max_tokens}.",
        "",
        "| concurrency | requests | answered 200 | requests/s | p50 latency s | p95 latency s |",
        "|---|---|---|---|---|---|",
    ]
    for level in results["levels"]:
        lines.append(
            f"| {level['concurrency']} | {level['requests']} | {level['ok']} | "
            f"{level['requests_per_second']:.2f} | {level['p50']:.2f} | {level['p95']:.2f} |"
        )
    lines += [
        "",
        f"RSS: {results['rss_start_mb']:.0f} MB after warm-up, {results['rss_after_400_mb']:.0f} MB "
        f"after 400 requests, {results['rss_after_40_distinct_mb']:.0f} MB after 40 requests with distinct "
        f"k values and ~1,000-token prompts ({results['distinct_ok']}/40 answered).",
        "",
        "| hostile request | its status | healthy alone s | healthy beside it s | healthy status |",
        "|---|---|---|---|---|",
    ]
    for h in results["hostile"]:
        lines.append(
            f"| {h['hostile']} | {h['hostile_status']} | {h['healthy_alone']:.2f} | "
            f"{h['healthy_beside']:.2f} | {h['healthy_status']} |"
        )
    write_report(args.output, "\n".join(lines), results)


if __name__ == "__main__":
    main()
