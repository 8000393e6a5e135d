"""Gumbel-max against rejection sampling, side by side: reads `quickdraft bench` reports whose
contenders are METHOD:sampler=gumbel and METHOD:sampler=rejection (run in one process, back to
back per prompt), prints one table row per method and temperature, and draws acceptance and
speedup per method for both samplers.

    .venv/bin/python benchmarks/sampler_compare.py bench-out/sampler-t07 bench-out/sampler-t10 \
        --plot docs/bench/sampling/samplers.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from quickdraft.bench.report import read_results  # noqa: E402
from quickdraft.bench.summary import OVERALL  # noqa: E402

SAMPLERS = ("gumbel", "rejection")


def pairs(raw: dict) -> dict[str, dict[str, object]]:
    """method -> {sampler: its overall Summary} for every method run with both samplers."""
    found: dict[str, dict[str, object]] = {}
    for name, summary in raw["summaries"][OVERALL].items():
        method, _, settings = name.partition(":")
        sampler = dict(item.split("=") for item in settings.split(",") if item).get("sampler")
        if sampler in SAMPLERS:
            found.setdefault(method, {})[sampler] = summary
    return {method: both for method, both in found.items() if len(both) == 2}


def rows(folders: list[Path]) -> list[tuple[float, str, dict[str, object]]]:
    """(temperature, method, {sampler: Summary}) over the reports."""
    out = []
    for folder in folders:
        raw = read_results(folder)
        for method, both in pairs(raw).items():
            out.append((raw["settings"]["temperature"], method, both))
    return out


def table(found: list[tuple[float, str, dict[str, object]]]) -> list[str]:
    lines = [
        "| temperature | method | acceptance gumbel / rejection | tokens per pass gumbel / rejection "
        "| speedup vs none gumbel / rejection | outputs != plain (gumbel) |",
        "|---|---|---|---|---|---|",
    ]
    for temperature, method, both in found:
        g, r = both["gumbel"], both["rejection"]
        rate = " / ".join("" if s.acceptance_rate is None else f"{s.acceptance_rate:.1%}" for s in (g, r))
        lines.append(
            f"| {temperature} | {method} | {rate} | {g.mean_accepted_length:.2f} / {r.mean_accepted_length:.2f} "
            f"| {g.speedup:.2f}x / {r.speedup:.2f}x | {len(g.mismatches)}/{g.prompts} |"
        )
    return lines


def plot(found: list[tuple[float, str, dict[str, object]]], path: Path) -> Path:
    """Acceptance and speedup per method and temperature, a bar per sampler."""
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = [f"{method}\nT={temperature}" for temperature, method, _ in found]
    width = 0.38
    for offset, sampler in zip((-width / 2, width / 2), SAMPLERS):
        x = [i + offset for i in range(len(found))]
        axes[0].bar(x, [both[sampler].acceptance_rate or 0.0 for _, _, both in found], width, label=sampler)
        axes[1].bar(x, [both[sampler].speedup for _, _, both in found], width, label=sampler)
    axes[0].set(ylabel="acceptance rate (accepted / drafted)", title="Acceptance by sampler")
    axes[1].set(ylabel="speedup over plain decoding (method none)", title="Speed by sampler")
    axes[1].axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    for ax in axes:
        ax.set_xticks(range(len(found)), labels, fontsize=7, rotation=35, ha="right")
        ax.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", type=Path, help="folders written by quickdraft bench")
    parser.add_argument("--plot", type=Path, help="where to draw the bars (PNG)")
    args = parser.parse_args(argv)
    found = rows(args.reports)
    if not found:
        print("no method ran with both sampler=gumbel and sampler=rejection in these reports", file=sys.stderr)
        return 1
    print("\n".join(table(found)))
    if args.plot:
        print(f"plot: {plot(found, args.plot)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
