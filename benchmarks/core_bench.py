"""Issue 2's measurement: method none vs prompt lookup, and our none vs transformers' generate.

Every configuration runs back to back on each prompt, in one process, after a warm-up, on
the same loaded model; tokens are counted the same way for all (new tokens, EOS included).

    python benchmarks/core_bench.py --prompts 20 --max-new-tokens 128 --output bench-out/core
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
from tqdm import tqdm

import quickdraft

SPEC_BENCH = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "spec_bench" / "question.jsonl"
GROUPS = ["mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"]


def spec_bench_prompts(path: Path, count: int) -> list[tuple[str, str]]:
    """(group, first turn) pairs taken round-robin over Spec-Bench's six task groups."""
    by_group: dict[str, list[str]] = {group: [] for group in GROUPS}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        group = "mt_bench" if record["question_id"] <= 160 else record["category"]
        by_group[group].append(record["turns"][0])
    prompts = []
    index = 0
    while len(prompts) < count:
        for group in GROUPS:
            if len(prompts) < count and index < len(by_group[group]):
                prompts.append((group, by_group[group][index]))
        index += 1
    return prompts


def time_hf_generate(model, prompt_ids: list[int], max_new_tokens: int, eos_ids) -> tuple[list[int], float]:
    input_ids = torch.tensor([prompt_ids])
    start = time.perf_counter()
    with torch.inference_mode():
        output = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                                max_new_tokens=max_new_tokens, eos_token_id=sorted(eos_ids), pad_token_id=sorted(eos_ids)[0])
    elapsed = time.perf_counter() - start
    return output[0, len(prompt_ids):].tolist(), elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--lookup", nargs="+", default=["4:1", "8:1", "8:2"],
                        help="prompt-lookup settings as K:MIN_NGRAM (max n-gram 3)")
    parser.add_argument("--data", type=Path, default=SPEC_BENCH)
    parser.add_argument("--output", type=Path, default=Path("bench-out/core"))
    args = parser.parse_args()

    decoder = quickdraft.load(method="none")
    configs = {"none": decoder}
    for setting in args.lookup:
        k, min_ngram = (int(part) for part in setting.split(":"))
        lookup = quickdraft.Decoder(decoder.target, None, "prompt-lookup", k, max_ngram=3, min_ngram=min_ngram)
        configs[f"prompt-lookup k={k} n>={min_ngram}"] = lookup
    prompts = spec_bench_prompts(args.data, args.prompts)
    encoded = [(group, decoder.encode(text)) for group, text in prompts]

    # Warm-up: first calls allocate and pick kernels.
    for runner in configs.values():
        runner.generate(encoded[0][1], max_new_tokens=16)
    time_hf_generate(decoder.target.model, encoded[0][1], 16, decoder.eos_ids)

    rows = []
    for group, ids in tqdm(encoded, desc="prompts", unit="prompt"):
        row = {"group": group, "prompt_tokens": len(ids), "runs": {}}
        tokens, elapsed = time_hf_generate(decoder.target.model, ids, args.max_new_tokens, decoder.eos_ids)
        row["runs"]["transformers generate"] = {"tokens": tokens, "seconds": elapsed, "passes": len(tokens)}
        for name, runner in configs.items():
            out = runner.generate(ids, max_new_tokens=args.max_new_tokens)
            row["runs"][name] = {"tokens": out.token_ids, "seconds": out.stats.wall_time,
                                 "passes": out.stats.target_passes, "drafted": out.stats.drafted_tokens,
                                 "accepted": out.stats.accepted_tokens}
        rows.append(row)

    names = ["transformers generate", *configs]
    summary = {}
    for name in names:
        runs = [row["runs"][name] for row in rows]
        tokens = sum(len(r["tokens"]) for r in runs)
        seconds = sum(r["seconds"] for r in runs)
        per_prompt = [len(r["tokens"]) / r["seconds"] for r in runs]
        baseline = [len(row["runs"]["none"]["tokens"]) / row["runs"]["none"]["seconds"] for row in rows]
        summary[name] = {
            "tokens": tokens,
            "tokens_per_second": tokens / seconds,
            "median_tokens_per_second": statistics.median(per_prompt),
            "median_speedup_vs_none": statistics.median(t / b for t, b in zip(per_prompt, baseline)),
            "mean_accepted_length": tokens / sum(r["passes"] for r in runs),
            "acceptance_rate": (sum(r.get("accepted", 0) for r in runs) / max(1, sum(r.get("drafted", 0) for r in runs))),
            "mismatches_vs_none": sum(r["tokens"] != row["runs"]["none"]["tokens"] for r, row in zip(runs, rows)),
        }

    machine = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    lines = [
        f"Target: {decoder.target.name} (fp32, transformers runner), {len(rows)} Spec-Bench prompts "
        f"({', '.join(GROUPS)}), greedy, max {args.max_new_tokens} new tokens. {date.today()}, {machine}.",
        "",
        "| method | tok/s (total) | median tok/s | median speedup vs none | mean accepted length | acceptance rate | outputs != none |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in names:
        s = summary[name]
        lines.append(
            f"| {name} | {s['tokens_per_second']:.1f} | {s['median_tokens_per_second']:.1f} | "
            f"{s['median_speedup_vs_none']:.2f}x | {s['mean_accepted_length']:.2f} | {s['acceptance_rate']:.1%} | "
            f"{s['mismatches_vs_none']}/{len(rows)} |"
        )
    report = "\n".join(lines)
    print(report)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "report.md").write_text(report + "\n")
    (args.output / "raw.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
