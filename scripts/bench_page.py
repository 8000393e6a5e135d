"""Rewrite the top of BENCHMARKS.md, and README.md's headline line, from the latest `quickdraft bench` reports.

    .venv/bin/python scripts/bench_page.py

BACKENDS below lists one report per backend. Each entry reads docs/bench/page/<name>/ once its
command has written a report there, and until then the earlier report it names. Only the text
between the markers changes; a second run changes nothing.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's report format, whichever quickdraft is installed

from quickdraft.bench.contenders import BASELINE  # noqa: E402
from quickdraft.bench.report import PLOTS, read_results, speedup_table, table  # noqa: E402
from quickdraft.bench.summary import OVERALL, Summary  # noqa: E402

PAGE = "docs/bench/page"
PAGE_MARKERS = ("<!-- bench-page: start", "<!-- bench-page: end -->")
HEADLINE_MARKERS = ("<!-- bench-headline: start", "<!-- bench-headline: end -->")
COLUMNS = ("tok/s", "speedup vs none", "mean accepted length", "outputs != reference")
INTEL = "Intel Xeon (x86_64; AVX-512 with AVX512-BF16, AMX-BF16/INT8), 2 cores, 24 GiB"


@dataclass(frozen=True)
class Earlier:
    """A report from before docs/bench/page/: it recorded neither its command nor its CPU."""

    folder: str
    command: str
    commit: str
    cpu: str
    notes: str  # where BENCHMARKS.md's notes on this run went


@dataclass(frozen=True)
class Backend:
    name: str  # its run goes to docs/bench/page/<name>
    title: str
    command: str  # the run that refreshes it
    earlier: Earlier | None = None  # shown until that run exists
    headline: bool = True  # in README.md's line (greedy runs only)


METHODS = "docs/bench/methods.md#"  # the notes on the earlier runs
BACKENDS = [
    Backend(
        "llama-cpp",
        "llama.cpp backend",
        ".venv/bin/quickdraft bench --backend llama.cpp --peers llama.cpp --per-category 5 --max-new-tokens 128 "
        "--output docs/bench/page/llama-cpp",
        Earlier(
            "docs/bench/llama-cpp",
            ".venv/bin/quickdraft bench --backend llama.cpp --per-category 5 --max-new-tokens 128 --methods "
            "prompt-lookup eagle medusa lookahead self-spec prompt-lookup:backend=native,precision=int4 "
            "--peers llama.cpp --output docs/bench/llama-cpp",
            commit="",
            cpu="AMD EPYC (x86_64, AVX2, no AVX-512/AMX), 2 cores",
            notes="docs/bench/llama-cpp-backend.md",
        ),
    ),
    Backend(
        "native-int4",
        "native backend at int4",
        ".venv/bin/quickdraft bench --backend native --precision int4 --methods all none:precision=fp32 "
        "--peers llama.cpp --per-category 5 --max-new-tokens 128 --output docs/bench/page/native-int4",
        Earlier(
            "docs/bench/heads-greedy",
            ".venv/bin/quickdraft bench --precision int4 --methods all none:precision=fp32 --peers llama.cpp "
            "--per-category 5 --max-new-tokens 128 --threads 2 --output bench-out/heads-greedy",
            commit="82892e1",
            cpu=INTEL,
            notes=METHODS + "every-method-at-int4-with-the-shipped-heads-greedy-30-prompts",
        ),
    ),
    Backend(
        "native-fp32",
        "native backend at fp32",
        ".venv/bin/quickdraft bench --backend native --precision fp32 --per-category 10 --max-new-tokens 128 "
        "--output docs/bench/page/native-fp32",
        Earlier(
            "docs/bench/greedy",
            ".venv/bin/quickdraft bench --per-category 10 --max-new-tokens 128 --output bench-out/full-greedy",
            commit="62ea4b4",
            cpu=INTEL,
            notes=METHODS + "greedy-60-prompts-10-per-task-group-at-most-128-new-tokens",
        ),
    ),
    Backend(
        "native-fp32-t07",
        "native backend at fp32, temperature 0.7",
        ".venv/bin/quickdraft bench --backend native --precision fp32 --temperature 0.7 --per-category 5 "
        "--max-new-tokens 128 --output docs/bench/page/native-fp32-t07",
        Earlier(
            "docs/bench/t07",
            ".venv/bin/quickdraft bench --per-category 5 --max-new-tokens 128 --temperature 0.7 "
            "--output bench-out/full-t07",
            commit="62ea4b4",
            cpu=INTEL,
            notes=METHODS + "temperature-07-seed-0-30-prompts-5-per-task-group-at-most-128-new-tokens",
        ),
        headline=False,
    ),
]


def source(backend: Backend, root: Path) -> tuple[Path, Earlier | None]:
    """The report folder to show: the page's own run when there is one, else the earlier report."""
    folder = root / PAGE / backend.name
    if backend.earlier is None or any((folder / name).exists() for name in ("results.json", "results.json.gz")):
        return folder, None
    return root / backend.earlier.folder, backend.earlier


def methods_of(overall: dict[str, Summary]) -> set[str]:
    """quickdraft's own contenders: they count target passes, peers do not."""
    return {name for name, s in overall.items() if s.mean_accepted_length is not None}


def best_method(overall: dict[str, Summary]) -> Summary | None:
    """The fastest speculative method checked against method none (not plain decoding elsewhere)."""
    methods = methods_of(overall)
    rivals = [s for name, s in overall.items() if name in methods and name != BASELINE and s.reference == BASELINE]
    return max(rivals, key=lambda s: s.speedup, default=None)


def section(backend: Backend, root: Path) -> tuple[list[str], Summary | None]:
    folder, earlier = source(backend, root)
    raw = read_results(folder)
    header, settings, summaries = raw["header"], raw["settings"], raw["summaries"]
    overall, where = summaries[OVERALL], folder.relative_to(root).as_posix()
    greedy = settings["temperature"] == 0
    sampling = "greedy" if greedy else f"temperature {settings['temperature']}, seed {settings['seed']}"
    groups = [g for g in summaries if g != OVERALL]
    cpu = earlier.cpu if earlier else header.get("cpu", "")
    command = earlier.command if earlier else header.get("command", backend.command)
    commit = f" (commit {earlier.commit})" if earlier and earlier.commit else ""
    notes = f"; notes: [{earlier.notes.split('#')[0]}]({earlier.notes})" if earlier else ""
    lines = [
        f"### {backend.title}",
        "",
        f"{header['date']}; {cpu}; {header['machine']}. {overall[BASELINE].prompts} prompts "
        f"({', '.join(groups)}); {sampling}; at most {settings['max_new_tokens']} new tokens; "
        f"{settings['repeats']} repeat(s). Report: [{where}/report.md]({where}/report.md){notes}.",
        "",
        f"Command{commit}: `{command}`",
        "",
    ]
    best = best_method(overall)
    if best:
        peers = [s for name, s in overall.items() if name not in methods_of(overall)]
        against = ", ".join(f"{best.tokens_per_second / p.tokens_per_second:.2f}x {p.name}" for p in peers)
        lines += [
            f"Best method: **{best.name}**, {best.tokens_per_second:.1f} tok/s, {best.speedup:.2f}x plain "
            f"decoding" + (f"; its tok/s over each peer's: {against}." if peers else "."),
            "",
        ]
    lines += table(overall, methods_of(overall), False, COLUMNS)
    lines += [
        "",
        "Speedup over plain decoding (method none) by task group:",
        "",
        *speedup_table(summaries),
        "",
        f"![speedup by task group, {backend.title}]({where}/{PLOTS['speedup']})",
        "",
    ]
    return lines, best


def headline(bests: list[tuple[Backend, Summary | None]]) -> str:
    parts = [f"{s.name} {s.speedup:.2f}x on the {b.title}" for b, s in bests if b.headline and s is not None]
    return (
        "Best method over plain decoding on the default target (greedy, Spec-Bench prompts): " + ", ".join(parts) + "."
    )


def page(backends: list[Backend], root: Path) -> tuple[str, str]:
    """BENCHMARKS.md's generated part and README.md's headline line."""
    sections, bests = [], []
    for backend in backends:
        lines, best = section(backend, root)
        sections += lines
        bests.append((backend, best))
    line = headline(bests)
    lines = [
        "## The default target on each backend",
        "",
        "SmolLM2-135M-Instruct, the embedded default target, on Spec-Bench prompts with its chat template: what "
        "each quickdraft method gives over plain decoding (method none) on the same backend and precision in the "
        "same run, and the peers beside it. tok/s: new tokens over the whole call, prefill included, the median "
        "over prompts; speedup: that median over method none's. Mean accepted length: new tokens per target "
        "pass. Outputs != reference: greedy outputs that differ from plain decoding at the same precision and "
        "backend (for peers, information only). Each run names its machine: compare tok/s across backends only "
        "on the same machine; the peers in a table ran in the same run.",
        "",
        line,
        "",
        *sections,
        "## How to reproduce",
        "",
        "From the repository root after `./setup.sh`, on the machine to report, with nothing else running:",
        "",
        "```bash",
        *[b.command for b in backends],
        ".venv/bin/python scripts/bench_page.py",
        "```",
        "",
        "Each command writes its report (report.md, results.json, plots) to docs/bench/page/<backend>/. The "
        "script then shows that report in place of the earlier one and rewrites this part of BENCHMARKS.md and "
        "README.md's headline line, nothing else. The list of reports is `BACKENDS` in scripts/bench_page.py. "
        "Commit a run with its results.json gzipped (the script reads either).",
    ]
    return "\n".join(lines), line[:-1] + " ([BENCHMARKS.md](BENCHMARKS.md))."


def replace_between(text: str, markers: tuple[str, str], body: str, name: str) -> str:
    """`text` with the lines between the marker lines (the start marker: a line's beginning) set to `body`."""
    start = next((i for i, line in enumerate(text.split("\n")) if line.startswith(markers[0])), None)
    lines = text.split("\n")
    end = next((i for i in range(start + 1, len(lines)) if lines[i] == markers[1]), None) if start is not None else None
    if end is None:
        raise SystemExit(f"{name}: no line starting {markers[0]!r} followed by a line {markers[1]!r}")
    return "\n".join(lines[: start + 1] + body.split("\n") + lines[end:])


def write(root: Path, backends: list[Backend]) -> list[str]:
    """Rewrite both files under `root`; returns the names of those that changed."""
    body, line = page(backends, root)
    texts = {name: (root / name).read_text() for name in ("BENCHMARKS.md", "README.md")}
    new = {
        "BENCHMARKS.md": replace_between(texts["BENCHMARKS.md"], PAGE_MARKERS, "\n" + body + "\n", "BENCHMARKS.md"),
        "README.md": replace_between(texts["README.md"], HEADLINE_MARKERS, line, "README.md"),
    }
    changed = [name for name in texts if new[name] != texts[name]]
    for name in changed:  # only once both have their markers
        (root / name).write_text(new[name])
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to update (default: this one)")
    args = parser.parse_args(argv)
    changed = write(args.root.resolve(), BACKENDS)
    print("rewrote " + ", ".join(changed) if changed else "nothing changed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
