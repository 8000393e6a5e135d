"""Pictures that say more than tables: speedup vs K, acceptance by draft position, bars by group, tok/s vs K."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt  # noqa: E402

from quickdraft.analysis import predicted_speedup  # noqa: E402


def plot_speedup_vs_k(
    path: Path, alphas: list[float], cost_ratio: float, verify_ratio: float = 1.0, k_max: int = 16
) -> Path:
    """Predicted speedup against K, one curve per acceptance rate, best K marked."""
    figure, axes = plt.subplots(figsize=(7, 4.5))
    ks = list(range(1, k_max + 1))
    for alpha in alphas:
        speedups = [predicted_speedup(alpha, k, cost_ratio, verify_ratio) for k in ks]
        best = max(range(len(ks)), key=speedups.__getitem__)
        line = axes.plot(ks, speedups, marker="o", markersize=3, label=f"alpha = {alpha:.2f}")[0]
        axes.plot([ks[best]], [speedups[best]], marker="*", markersize=12, color=line.get_color())
    axes.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    axes.set(
        xlabel="draft tokens per step K",
        ylabel="predicted speedup over plain decoding",
        title=f"Speedup vs K (cost ratio c = {cost_ratio}, verify ratio {verify_ratio}); * = best K",
    )
    axes.legend()
    return _save(figure, path)


def plot_acceptance_by_position(path: Path, rates: dict[str, list[float]]) -> Path:
    """Fraction of drafts accepted at each draft position, one line per method."""
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name, values in rates.items():
        axes.plot(range(1, len(values) + 1), values, marker="o", label=name)
    axes.set(
        xlabel="draft position",
        ylabel="acceptance rate",
        ylim=(0, 1),
        title="Acceptance by draft position (drafted there and accepted)",
    )
    axes.legend(fontsize=8)
    return _save(figure, path)


def plot_grouped_bars(
    path: Path, table: dict[str, dict[str, float]], ylabel: str, title: str, reference: float | None = None
) -> Path:
    """Grouped bars: one bar per series (e.g. method) in each cluster (e.g. task group)."""
    figure, axes = plt.subplots(figsize=(10, 4.5))
    groups = list(next(iter(table.values())))
    width = 0.8 / len(table)
    for index, (name, values) in enumerate(table.items()):
        positions = [g + index * width for g in range(len(groups))]
        axes.bar(positions, [values[group] for group in groups], width, label=name)
    if reference is not None:
        axes.axhline(reference, color="grey", linewidth=0.8, linestyle="--")
    axes.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))], groups)
    axes.set(ylabel=ylabel, title=title)
    # Below the axes: with many series a legend inside would cover the tallest bars.
    axes.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.08), frameon=False)
    return _save(figure, path)


def plot_tokens_per_second_vs_k(
    path: Path, points: dict[str, list[tuple[float, float]]], baseline: float | None = None
) -> Path:
    """Tokens/s against the K setting (draft tokens per step; the cap for dynamic K), one line per method."""
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name, values in points.items():
        values = sorted(values)
        axes.plot([k for k, _ in values], [speed for _, speed in values], marker="o", label=name)
    if baseline is not None:
        axes.axhline(baseline, color="grey", linewidth=0.8, linestyle="--", label="plain decoding")
    axes.set(
        xlabel="K (draft tokens per step; the cap when K is dynamic)",
        ylabel="tokens / s",
        title="Tokens per second vs K",
    )
    axes.legend(fontsize=8)
    return _save(figure, path)


def plot_by_request(
    path: Path, per_pass: dict[str, list[float]], speedups: dict[str, list[float]], window: int = 8
) -> Path:
    """Tokens per target pass and speedup over plain decoding against the request's place in a
    stream, one line per method: each request as a faint point, the mean of the last `window` as a line."""
    figure, panels = plt.subplots(1, 2, figsize=(12, 4.5))
    for axes, series, label in (
        (panels[0], per_pass, "tokens per target pass"),
        (panels[1], speedups, "speedup over plain decoding"),
    ):
        for name, values in series.items():
            color = f"C{list(speedups).index(name)}"  # a method keeps its colour in both panels
            requests = range(1, len(values) + 1)
            axes.plot(requests, values, ".", color=color, alpha=0.25)
            means = [
                sum(values[max(0, i + 1 - window) : i + 1]) / (i + 1 - max(0, i + 1 - window))
                for i in range(len(values))
            ]
            axes.plot(requests, means, color=color, label=name)
        axes.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        axes.set(
            xlabel="request (in order)", ylabel=label, title=f"{label} by request (line: mean of the last {window})"
        )
        axes.legend(fontsize=8)
    return _save(figure, path)


def _save(figure, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
