"""What quickdraft's llama.cpp patch costs llama.cpp's own decoding (docs/llama-cpp.md).

setup.sh builds llama-cpp-python with patches/llama-cpp-row-independent-attention.patch, which
turns off two attention schedules (a KV split for a lone query row, Q tiles for large passes)
so that rows do not depend on the pass. This times llama.cpp plain decoding the way its users
run it (llama_cpp.Llama, greedy, the default target's GGUF), with the installed (patched) build
and with a stock build, each in its own process, alternating rounds, on Spec-Bench prompts
(short and long: the split only runs past 512 cached tokens).

A stock build in a folder:  pip install --no-deps --target /tmp/stock llama-cpp-python==0.3.36
  (CMAKE_ARGS as in scripts/build-llama-cpp.sh)
Run:  .venv/bin/python benchmarks/llama_cpp_patch_cost.py --stock-site /tmp/stock
One patch's cost: a build with every other patch (e.g. without patches/llama-cpp-ordered-cells.patch)
  as --stock-site, named with --baseline "without ordered cells".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tqdm import tqdm

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench" / "question.jsonl"


def worker(prompts: int, tokens: int, threads: int) -> None:
    """One process: time plain greedy decoding of each prompt; print JSON {prompt index: tok/s}."""
    import llama_cpp

    from quickdraft.models import default_gguf_path
    from quickdraft.models.loading import load_model

    tokenizer = load_model(None).tokenizer
    llm = llama_cpp.Llama(model_path=str(default_gguf_path()), n_ctx=4096, n_threads=threads, verbose=False)
    rates = {}
    for index, text in enumerate(_prompts(prompts)):
        chat = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        ids = list(tokenizer(chat, add_special_tokens=False)["input_ids"])
        llm.reset()
        count, start = 0, time.perf_counter()
        for _ in llm.generate(ids, temp=0.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
            count += 1
            if count == tokens:
                break
        rates[index] = {"tok_s": count / (time.perf_counter() - start), "prompt_tokens": len(ids)}
    print(json.dumps(rates))


def _prompts(per_category: int) -> list[str]:
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    chosen: dict[str, list[str]] = {}
    for row in rows:
        group = chosen.setdefault(row["category"], [])
        if len(group) < per_category:
            group.append(row["turns"][0])
    return [text for group in chosen.values() for text in group]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stock-site", required=True, help="folder holding a stock llama-cpp-python build")
    parser.add_argument("--baseline", default="stock", help="what to call that build in the table")
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.per_category, args.tokens, args.threads)
        return
    command = [
        sys.executable,
        __file__,
        "--worker",
        "--stock-site",
        args.stock_site,
        "--per-category",
        str(args.per_category),
        "--tokens",
        str(args.tokens),
        "--threads",
        str(args.threads),
    ]
    repo = str(Path(__file__).resolve().parents[1])
    builds = {"patched (setup.sh)": repo, "stock": os.pathsep.join([args.stock_site, repo])}
    runs: dict[str, list[dict]] = {name: [] for name in builds}
    for _ in tqdm(range(args.rounds), desc="rounds (each: both builds, alternating)", unit="round"):
        for name, path in builds.items():
            out = subprocess.run(
                command, env=os.environ | {"PYTHONPATH": path}, capture_output=True, text=True, check=True
            )
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    prompts = sorted(runs["stock"][0], key=int)
    print(
        f"llama.cpp plain decoding, {args.tokens} tokens, {args.threads} threads, median of {args.rounds} "
        f"rounds per prompt; {time.strftime('%Y-%m-%d')}"
    )
    print(f"| prompt tokens | {args.baseline} tok/s | patched tok/s | patched / {args.baseline} |")
    print("|---|---|---|---|")
    ratios = []
    for index in prompts:
        stock = statistics.median(run[index]["tok_s"] for run in runs["stock"])
        patched = statistics.median(run[index]["tok_s"] for run in runs["patched (setup.sh)"])
        ratios.append(patched / stock)
        print(f"| {runs['stock'][0][index]['prompt_tokens']} | {stock:.1f} | {patched:.1f} | {patched / stock:.2f}x |")
    print(f"| all (median ratio) | | | {statistics.median(ratios):.2f}x |")


if __name__ == "__main__":
    main()
