"""Every drafting method against plain decoding (and transformers' generate), side by side.

Each configuration runs back to back on each prompt, in one process, after a warm-up, on the
same loaded target; tokens are counted the same way for all (new tokens, EOS included).
Greedy runs also check that every method's tokens equal method none's.

    python benchmarks/methods_bench.py --per-group 5 --max-new-tokens 128 \\
        --config none --config prompt-lookup:k=8 --config lookahead:k=2,window=4,ngram=3,candidates=4

A config is METHOD[:key=value,...] with keys k, draft_length, k_max and any DrafterOptions
field (layers takes L or a list joined by '+', e.g. layers=0+1+2).
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
from quickdraft.analysis import expected_tokens_per_pass
from quickdraft.methods import get_method
from quickdraft.plots import plot_acceptance_by_position, plot_tokens_per_second

SPEC_BENCH = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "spec_bench" / "question.jsonl"
GROUPS = ["mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"]
HF_GENERATE = "transformers generate"


def spec_bench_prompts(path: Path, per_group: int) -> list[tuple[str, str]]:
    """(group, first turn) pairs: the first `per_group` questions of each of Spec-Bench's six task groups."""
    by_group: dict[str, list[str]] = {group: [] for group in GROUPS}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        group = "mt_bench" if record["question_id"] <= 160 else record["category"]
        by_group[group].append(record["turns"][0])
    return [(group, text) for group in GROUPS for text in by_group[group][:per_group]]


def parse_config(spec: str) -> tuple[str, dict]:
    method, _, rest = spec.partition(":")
    options: dict = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        if key == "layers" and "+" in value:
            options[key] = [int(v) for v in value.split("+")]
        elif key in ("draft_length", "runner", "precision"):
            options[key] = value
        else:
            number = float(value)
            options[key] = int(number) if number.is_integer() else number
    return method, options


def time_hf_generate(model, prompt_ids: list[int], max_new_tokens: int, eos_ids) -> tuple[list[int], float]:
    input_ids = torch.tensor([prompt_ids])
    start = time.perf_counter()
    with torch.inference_mode():
        output = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                                max_new_tokens=max_new_tokens, eos_token_id=sorted(eos_ids),
                                pad_token_id=sorted(eos_ids)[0])
    return output[0, len(prompt_ids):].tolist(), time.perf_counter() - start


def summarise(name: str, rows: list[dict]) -> dict:
    runs = [row["runs"][name] for row in rows]
    base = [row["runs"]["none"] for row in rows]
    tokens = sum(len(r["tokens"]) for r in runs)
    seconds = sum(r["seconds"] for r in runs)
    speed = [len(r["tokens"]) / r["seconds"] for r in runs]
    base_speed = [len(b["tokens"]) / b["seconds"] for b in base]
    drafted = sum(r.get("drafted", 0) for r in runs)
    summary = {
        "prompts": len(runs),
        "tokens": tokens,
        "tokens_per_second": tokens / seconds,
        "median_speedup": statistics.median(s / b for s, b in zip(speed, base_speed)),
        "mean_accepted_length": tokens / sum(r["passes"] for r in runs),
        "acceptance_rate": sum(r.get("accepted", 0) for r in runs) / drafted if drafted else 0.0,
        "mismatches": sum(r["tokens"] != b["tokens"] for r, b in zip(runs, base)),
    }
    if runs[0].get("chain") and drafted:
        # Closed-form prediction from this run's alpha, mean K and times, against the measured
        # speedup; both over decoding time only (prefill excluded), per generated token.
        alpha = min(summary["acceptance_rate"], 0.999)
        passes = sum(r["passes"] for r in runs)
        step_time = sum(r["draft_time"] + r["verify_time"] for r in runs) / passes
        plain_time = sum(b["draft_time"] + b["verify_time"] for b in base) / sum(len(b["tokens"]) for b in base)
        expected = expected_tokens_per_pass(alpha, max(1, round(drafted / passes)))
        summary["predicted_speedup"] = plain_time / (step_time / expected)
        summary["measured_speedup"] = plain_time / (step_time * passes / tokens)
    return summary


def write_plots(output: Path, names: list[str], rows: list[dict], by_group: dict) -> None:
    """Acceptance by draft position (chain methods) and tokens/s by task group, as PNG files."""
    rates = {}
    for name in names:
        runs = [row["runs"][name] for row in rows]
        if not runs[0].get("chain") or not any(r.get("drafted") for r in runs):
            continue
        depth = max(len(r["drafted_by_position"]) for r in runs)
        drafted = [sum(r["drafted_by_position"][i] for r in runs if i < len(r["drafted_by_position"]))
                   for i in range(depth)]
        accepted = [sum(r["accepted_by_position"][i] for r in runs if i < len(r["accepted_by_position"]))
                    for i in range(depth)]
        rates[name] = [a / d if d else 0.0 for a, d in zip(accepted, drafted)]
    if rates:
        plot_acceptance_by_position(output / "acceptance_by_position.png", rates)
    table = {name: {g: by_group[g][name]["tokens_per_second"] for g in by_group} for name in names}
    plot_tokens_per_second(output / "tokens_per_second.png", table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-group", type=int, default=5, help="prompts from each Spec-Bench task group")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--config", action="append", help="METHOD[:key=value,...] (repeatable)")
    parser.add_argument("--transformers", action="store_true", help="also time transformers' generate")
    parser.add_argument("--runner", default="auto", help="runner for every config (auto, native, hf)")
    parser.add_argument("--data", type=Path, default=SPEC_BENCH)
    parser.add_argument("--output", type=Path, default=Path("bench-out/methods"))
    args = parser.parse_args()

    base = quickdraft.load(method="none", runner=args.runner)
    decoders = {"none": base}
    for spec in args.config or ["prompt-lookup"]:
        method, options = parse_config(spec)
        if spec != "none":
            decoders[spec] = base.with_method(method, **options)
    chain = {name: not get_method(d.method).drafts_trees for name, d in decoders.items()}
    prompts = spec_bench_prompts(args.data, args.per_group)
    encoded = [(group, base.encode(text)) for group, text in prompts]
    options = dict(temperature=args.temperature, seed=0)

    for decoder in decoders.values():  # warm-up
        decoder.generate(encoded[0][1], max_new_tokens=16, **options)
    rows = []
    for group, ids in tqdm(encoded, desc="prompts", unit="prompt"):
        row = {"group": group, "prompt_tokens": len(ids), "runs": {}}
        if args.transformers:
            tokens, seconds = time_hf_generate(base.target.model, ids, args.max_new_tokens, base.eos_ids)
            row["runs"][HF_GENERATE] = {"tokens": tokens, "seconds": seconds, "passes": len(tokens)}
        for name, decoder in decoders.items():
            out = decoder.generate(ids, max_new_tokens=args.max_new_tokens, **options)
            s = out.stats
            row["runs"][name] = {"tokens": out.token_ids, "seconds": s.wall_time, "passes": s.target_passes,
                                 "drafted": s.drafted_tokens, "accepted": s.accepted_tokens,
                                 "draft_time": s.draft_time, "verify_time": s.verify_time, "chain": chain[name],
                                 "ks": [step.k for step in out.steps],
                                 "accepted_by_position": s.accepted_by_position,
                                 "drafted_by_position": s.drafted_by_position}
        rows.append(row)

    names = list(rows[0]["runs"])
    overall = {name: summarise(name, rows) for name in names}
    by_group = {g: {name: summarise(name, [r for r in rows if r["group"] == g]) for name in names}
                for g in GROUPS if any(r["group"] == g for r in rows)}
    machine = f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    sampling = "greedy" if args.temperature == 0 else f"temperature {args.temperature}, seed 0"
    lines = [f"Target: {base.target.name} ({base.precision}, {args.runner} runner); {len(rows)} Spec-Bench prompts "
             f"({args.per_group} per task group); {sampling}; at most {args.max_new_tokens} new tokens; "
             f"{date.today()}; {machine}.", "",
             "| method | tok/s | median speedup vs none | mean accepted length | acceptance rate | "
             "predicted / measured decode speedup | outputs != none |", "|---|---|---|---|---|---|---|"]
    for name in names:
        s = overall[name]
        predicted = (f"{s['predicted_speedup']:.2f}x / {s['measured_speedup']:.2f}x"
                     if "predicted_speedup" in s else "")
        mismatch = f"{s['mismatches']}/{s['prompts']}" if args.temperature == 0 else "(sampled)"
        lines.append(f"| {name} | {s['tokens_per_second']:.1f} | {s['median_speedup']:.2f}x | "
                     f"{s['mean_accepted_length']:.2f} | {s['acceptance_rate']:.1%} | {predicted} | {mismatch} |")
    lines += ["", "Per task group: tok/s (mean accepted length)", "",
              "| method | " + " | ".join(by_group) + " |", "|---" * (len(by_group) + 1) + "|"]
    for name in names:
        cells = [f"{by_group[g][name]['tokens_per_second']:.1f} ({by_group[g][name]['mean_accepted_length']:.2f})"
                 for g in by_group]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    report = "\n".join(lines)
    print(report)
    args.output.mkdir(parents=True, exist_ok=True)
    write_plots(args.output, names, rows, by_group)
    (args.output / "report.md").write_text(report + "\n")
    (args.output / "raw.json").write_text(json.dumps({"overall": overall, "by_group": by_group, "rows": rows},
                                                     indent=1))


if __name__ == "__main__":
    main()
