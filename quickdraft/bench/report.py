"""Write a bench run out: a Markdown report (a table per category), raw JSON, and PNG plots."""

from __future__ import annotations

import gzip
import json
import os
import platform
import statistics
from dataclasses import asdict
from datetime import date
from pathlib import Path

import torch

from quickdraft.backends.llama_cpp import build_description
from quickdraft.bench.contenders import BASELINE, MethodContender, RunRecord
from quickdraft.bench.harness import BenchResult
from quickdraft.bench.summary import OVERALL, Summary
from quickdraft.plots import (
    plot_acceptance_by_position,
    plot_by_request,
    plot_grouped_bars,
    plot_tokens_per_second_vs_k,
)

PLOTS = {
    "speedup": "speedup_by_category.png",
    "acceptance": "acceptance_by_position.png",
    "k": "tokens_per_second_vs_k.png",
}
BY_REQUEST = "by_request.png"  # an in-order stream's


def machine() -> str:
    return f"{platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}"


def cpu() -> str:
    """The processor's name (from /proc/cpuinfo where there is one) and its core count."""
    name = platform.processor() or platform.machine()
    try:
        name = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    return f"{name}, {os.cpu_count()} cores"


def _ratio(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "" if value is None else f"{value:.{digits}f}{suffix}"


PREDICTION = "predicted / measured decode speedup"
COLUMNS = (
    "tok/s",
    "speedup vs none",
    "mean accepted length",
    "acceptance rate",
    "mean K",
    PREDICTION,
    "outputs != reference",
)


def table(
    summaries: dict[str, Summary],
    methods: set[str],
    with_prediction: bool,
    columns: tuple[str, ...] | None = None,
) -> list[str]:
    """One row per contender. columns: a subset of COLUMNS, in order (default: all; the prediction only
    with_prediction)."""
    columns = columns or tuple(c for c in COLUMNS if with_prediction or c != PREDICTION)
    lines = ["| contender | " + " | ".join(columns) + " |", "|" + "---|" * (len(columns) + 1)]
    for name, s in summaries.items():
        if not s.checked:
            mismatch = "(sampled)"
        elif s.reference == name:
            mismatch = "reference"
        else:
            mismatch = (
                f"{len(s.mismatches)}/{s.prompts}"
                + ("" if name in methods else " (peer)")
                + ("" if s.reference == BASELINE else f" vs {s.reference}")
            )
        cells = {
            "tok/s": f"{s.tokens_per_second:.1f}",
            "speedup vs none": f"{s.speedup:.2f}x",
            "mean accepted length": _ratio(s.mean_accepted_length),
            "acceptance rate": "" if s.acceptance_rate is None else f"{s.acceptance_rate:.1%}",
            "mean K": _ratio(s.mean_k, 1),
            PREDICTION: ""
            if s.predicted_speedup is None
            else f"{s.predicted_speedup:.2f}x / {s.measured_decode_speedup:.2f}x",
            "outputs != reference": mismatch,
        }
        lines.append("| " + " | ".join([name] + [cells[c] for c in columns]) + " |")
    return lines


def speedup_table(summaries: dict[str, dict[str, Summary]]) -> list[str]:
    """Speedup vs none by group: one row per contender, a column per group ("overall" first)."""
    groups = [OVERALL] + [g for g in summaries if g != OVERALL]
    lines = ["| contender | " + " | ".join(groups) + " |", "|" + "---|" * (len(groups) + 1)]
    for name in summaries[OVERALL]:
        lines.append("| " + " | ".join([name] + [f"{summaries[g][name].speedup:.2f}x" for g in groups]) + " |")
    return lines


def markdown(result: BenchResult, summaries: dict[str, dict[str, Summary]], header: dict) -> str:
    s = result.settings
    sampling = "greedy" if result.greedy else f"temperature {s.temperature}, seed {s.seed}"
    methods = {c.name for c in result.contenders if isinstance(c, MethodContender)}
    categories = [g for g in summaries if g != OVERALL]
    lines = [
        "# quickdraft bench",
        "",
        f"Target: {header['target']} ({header['precision']}, {header['backend']} backend); "
        f"{len(result.prompts)} prompts from {header['prompts']} ({', '.join(categories)}); {sampling}; "
        f"at most {s.max_new_tokens} new tokens; {s.repeats} repeat(s); {header['date']}; "
        + "; ".join(filter(None, (header.get("cpu"), header["machine"])))
        + ".",
        "",
        *([f"Command: `{header['command']}`", ""] if header.get("command") else []),
        *([f"llama.cpp (backend and peers): {header['llama_cpp']}.", ""] if header.get("llama_cpp") else []),
        "tok/s: new tokens (EOS included) over the whole call, prefill included; the median over prompts "
        "(each prompt: the median of its repeats). Speedup: that median over method none's (same backend, "
        "same prompts, run back to back). Mean accepted length: new tokens per target pass. Greedy "
        "outputs, and sampled ones of sampler gumbel (whose text follows the seed alone), are checked against "
        "plain decoding at the same precision, backend and sampler (the reference).",
        "",
        f"## {OVERALL}",
        "",
        *table(summaries[OVERALL], methods, with_prediction=True),
    ]
    for category in categories:
        lines += ["", f"## {category}", "", *table(summaries[category], methods, False)]
    if any(x.checked for x in summaries[OVERALL].values()):
        broken = {name: x.mismatches for name, x in summaries[OVERALL].items() if x.mismatches}
        lines += ["", "## Equality check (greedy)" if result.greedy else "## Equality check (seeded sampling)", ""]
        failed = {name: numbers for name, numbers in broken.items() if name in methods}
        lines.append(
            f"Every quickdraft method{'' if result.greedy else ' of sampler gumbel'} produced its reference's tokens "
            "on every prompt."
            if not failed
            else "**quickdraft methods whose tokens differ from their reference:** "
            + "; ".join(f"{name}: prompts {numbers}" for name, numbers in failed.items())
        )
        peers = {name: numbers for name, numbers in broken.items() if name not in methods}
        if peers:
            lines.append(
                "Peers that differ (information only; e.g. llama.cpp computes with the GGUF's "
                "quantized weights, quickdraft with their de-quantized fp32 values): "
                + "; ".join(f"{name}: {len(numbers)} prompts" for name, numbers in peers.items())
            )
    lines += batched_lines(result)
    lines += stream_lines(result)
    plots = {**PLOTS, **({"by_request": BY_REQUEST} if result.in_order else {})}
    lines += ["", "## Plots", ""] + [f"![{key}]({file})" for key, file in plots.items()]
    return "\n".join(lines) + "\n"


def batched_lines(result: BenchResult) -> list[str]:
    """The batched runs' section: tok/s with the prompts sharing passes, and how many outputs differ
    from the same prompt alone (the promise: none)."""
    if not result.batched:
        return []
    batch = next(iter(result.batched.values())).batch
    count = len(result.prompts)
    lines = [
        "",
        f"## Batched ({batch} prompts at a time)",
        "",
        f"Each method's prompts again, {batch} at a time in shared passes (as the server batches them), "
        "with the same sampling settings and seed; tok/s: all new tokens over all batches' wall time. "
        "Differ: outputs that differ from the same prompt decoded alone (above).",
        "",
        "| contender | tok/s batched | differ from alone |",
        "|---|---|---|",
    ]
    for name, run in result.batched.items():
        differ = f"{len(run.differ)} of {count}" + (f" (prompts {run.differ})" if run.differ else "")
        lines.append(f"| {name} | {run.tokens / run.seconds:.1f} | {differ} |")
    return lines


def by_request(result: BenchResult) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per request, in order: each method's new tokens per target pass, and each contender's tok/s
    over method none's on the same request (the median of its repeats' seconds)."""

    def speed(runs: list[RunRecord]) -> float:
        return len(runs[0].tokens) / statistics.median(r.seconds for r in runs)

    per_pass: dict[str, list[float]] = {}
    speedups: dict[str, list[float]] = {}
    for prompt in result.prompts:
        base = speed(prompt.runs[BASELINE])
        for contender in result.contenders:
            runs = prompt.runs[contender.name]
            if contender.name == BASELINE:
                continue  # 1.0 on both: the dashed line
            speedups.setdefault(contender.name, []).append(speed(runs) / base)
            if runs[0].passes:  # peers count none
                per_pass.setdefault(contender.name, []).append(len(runs[0].tokens) / runs[0].passes)
    return per_pass, speedups


def stream_lines(result: BenchResult) -> list[str]:
    """An in-order stream's section: tokens per pass and speedup over its first and last halves
    (totals: all new tokens over all passes, and over all seconds against method none's)."""
    if not result.in_order:
        return []
    count = len(result.prompts)
    halves = {"first half": result.prompts[: count // 2], "last half": result.prompts[count // 2 :]}
    lines = [
        "",
        "## By request (in order)",
        "",
        f"The {count} prompts ran in order as one stream of requests; each method learned from the outputs "
        "before (suffix decoding's pool; the other methods learn nothing across requests). Tokens per pass: "
        "new tokens over target passes; speedup: new tokens per second over method none's, on the same "
        "requests, the whole call (prefill included) and decoding alone (drafting and verification). "
        "Drafting: the method's drafting time per target pass, over method none's time per pass (a "
        "one-token pass). Each request is plotted in by_request.png.",
        "",
        "| contender | tokens per pass, first half | last half | speedup, first half | last half "
        "| decoding alone, first half | last half | drafting |",
        "|---|---|---|---|---|---|---|---|",
    ]
    base_runs = [p.runs[BASELINE][0] for p in result.prompts]
    one_row = sum(r.decode_seconds for r in base_runs) / max(1, sum(r.passes for r in base_runs))
    for contender in result.contenders:
        if contender.name == BASELINE:
            continue
        per_half = [_half(prompts, contender.name) for prompts in halves.values()]
        cells = [cell for column in range(3) for cell in (half[column] for half in per_half)]
        runs = [p.runs[contender.name][0] for p in result.prompts]
        passes = sum(r.passes for r in runs)
        drafting = sum(r.draft_seconds for r in runs) / passes / one_row if passes and one_row else None
        cells.append(f"{100 * drafting:.1f}%" if drafting is not None else "-")
        lines.append(f"| {contender.name} | " + " | ".join(cells) + " |")
    return lines


def _half(prompts: list, name: str) -> tuple[str, str, str]:
    """One contender over some requests: tokens per pass, speedup over method none's whole calls
    (median of repeats), and over its decoding alone."""
    own, base = [p.runs[name] for p in prompts], [p.runs[BASELINE] for p in prompts]
    tokens, base_tokens = sum(len(r[0].tokens) for r in own), sum(len(r[0].tokens) for r in base)
    passes = sum(r[0].passes for r in own)
    whole = (tokens / sum(statistics.median(x.seconds for x in r) for r in own)) / (
        base_tokens / sum(statistics.median(x.seconds for x in r) for r in base)
    )
    decoding, base_decoding = sum(r[0].decode_seconds for r in own), sum(r[0].decode_seconds for r in base)
    alone = (tokens / decoding) / (base_tokens / base_decoding) if decoding and base_decoding else None
    return (
        f"{tokens / passes:.2f}" if passes else "-",
        f"{whole:.2f}x",
        f"{alone:.2f}x" if alone is not None else "-",
    )


def write_plots(output: Path, result: BenchResult, summaries: dict[str, dict[str, Summary]]) -> list[Path]:
    overall = summaries[OVERALL]
    categories = [g for g in summaries if g != OVERALL] + [OVERALL]
    speedups = {name: {g: summaries[g][name].speedup for g in categories} for name in overall if name != BASELINE}
    paths = [
        plot_grouped_bars(
            output / PLOTS["speedup"],
            speedups or {BASELINE: {g: 1.0 for g in categories}},
            "speedup over method none (ratio of median tok/s)",
            "Speedup by method and category",
            reference=1.0,
        )
    ]
    rates = {name: s.acceptance_by_position for name, s in overall.items() if s.acceptance_by_position}
    paths.append(plot_acceptance_by_position(output / PLOTS["acceptance"], rates or {BASELINE: []}))
    points: dict[str, list[tuple[float, float]]] = {}
    for contender in result.contenders:
        if isinstance(contender, MethodContender) and contender.speculative:
            line = f"{contender.decoder.method} ({contender.decoder.draft_length} K)"  # a K sweep is one line
            points.setdefault(line, []).append((contender.decoder.k, overall[contender.name].tokens_per_second))
    paths.append(plot_tokens_per_second_vs_k(output / PLOTS["k"], points, overall[BASELINE].tokens_per_second))
    if result.in_order:
        paths.append(plot_by_request(output / BY_REQUEST, *by_request(result)))
    return paths


def write_report(
    output: Path, result: BenchResult, summaries: dict[str, dict[str, Summary]], header: dict
) -> dict[str, Path]:
    """report.md, results.json and the plots under `output`; returns their paths."""
    output.mkdir(parents=True, exist_ok=True)
    header = {"date": str(date.today()), "machine": machine(), "cpu": cpu(), "llama_cpp": build_description()} | header
    report = output / "report.md"
    report.write_text(markdown(result, summaries, header))
    raw = {
        "header": header,
        "settings": asdict(result.settings),
        "contenders": [c.name for c in result.contenders],
        "summaries": {g: {name: asdict(s) for name, s in group.items()} for g, group in summaries.items()},
        "prompts": [
            {
                "category": p.category,
                "prompt_tokens": p.prompt_tokens,
                "runs": {name: [asdict(r) for r in records] for name, records in p.runs.items()},
            }
            for p in result.prompts
        ],
    }
    raw["batched"] = {name: asdict(run) for name, run in result.batched.items()}
    raw["in_order"] = result.in_order
    results = output / "results.json"
    results.write_text(json.dumps(raw, indent=1))
    plots = write_plots(output, result, summaries)
    return {"report": report, "results": results} | {path.stem: path for path in plots}


def read_results(folder: Path) -> dict:
    """A report folder's results.json (or results.json.gz, as committed) with Summary objects as summaries."""
    plain, packed = Path(folder) / "results.json", Path(folder) / "results.json.gz"
    raw = json.loads(plain.read_text() if plain.exists() else gzip.decompress(packed.read_bytes()))
    greedy = raw["settings"]["temperature"] == 0  # reports before 2026-12-06 checked greedy tokens only
    raw["summaries"] = {
        group: {name: Summary(**({"checked": greedy} | fields)) for name, fields in members.items()}
        for group, members in raw["summaries"].items()
    }
    return raw
