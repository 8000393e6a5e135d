"""scripts/bench_page.py on made-up reports: the page between the markers, nothing else touched."""

from __future__ import annotations

import gzip
import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from quickdraft.bench.contenders import RunRecord
from quickdraft.bench.harness import BenchResult, BenchSettings, PromptRuns
from quickdraft.bench.report import write_report
from quickdraft.bench.summary import summarise_all

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_page.py"
spec = importlib.util.spec_from_file_location("bench_page", SCRIPT)
bench_page = sys.modules["bench_page"] = importlib.util.module_from_spec(spec)  # dataclasses look it up
spec.loader.exec_module(bench_page)

BEFORE = (
    "# benchmarks\n\nIntro, kept.\n\n<!-- bench-page: start -->\nold page\n<!-- bench-page: end -->\n\n"
    "## Kept\n\n| a |\n"
)
README = "# tool\n\n<!-- bench-headline: start -->\nold line\n<!-- bench-headline: end -->\n\n## Rest\n"


def fake_report(folder: Path, command: str) -> None:
    """A report as `quickdraft bench` writes it: method none, prompt-lookup and a peer on two groups."""
    contenders = [
        SimpleNamespace(name=name, chain=False, speculative=name == "prompt-lookup", reference="none")
        for name in ("none", "prompt-lookup", "llama.cpp")
    ]
    prompts = []
    for category, seconds in (("qa", 1.0), ("translation", 2.0)):
        tokens = list(range(20))
        prompts.append(
            PromptRuns(
                category,
                30,
                {
                    "none": [RunRecord(tokens, seconds, passes=20)],
                    "prompt-lookup": [RunRecord(tokens, seconds / 2, passes=10, drafted=12, accepted=10)],
                    "llama.cpp": [RunRecord(tokens[:-1] + [99], seconds / 4)],
                },
            )
        )
    result = BenchResult(BenchSettings(max_new_tokens=20), contenders, prompts)
    write_report(
        folder,
        result,
        summarise_all(result),
        {
            "target": "tiny",
            "precision": "int4",
            "backend": "native",
            "prompts": "made up",
            "methods": ["prompt-lookup"],
            "peers": ["llama.cpp"],
            "command": command,
        },
    )


@pytest.fixture
def checkout(tmp_path):
    fake_report(tmp_path / "docs/bench/page/fresh", "quickdraft bench --output docs/bench/page/fresh")
    fake_report(tmp_path / "docs/bench/old", "not shown")
    old = tmp_path / "docs/bench/old/results.json"  # committed reports are gzipped
    (tmp_path / "docs/bench/old/results.json.gz").write_bytes(gzip.compress(old.read_bytes()))
    old.unlink()
    (tmp_path / "BENCHMARKS.md").write_text(BEFORE)
    (tmp_path / "README.md").write_text(README)
    return tmp_path


BACKENDS = [
    bench_page.Backend(
        "fresh",
        "fresh backend",
        "quickdraft bench --output docs/bench/page/fresh",
        bench_page.Earlier("docs/bench/gone", "unused", "", "unused cpu", "unused.md"),
    ),
    bench_page.Backend(
        "later",
        "later backend",
        "quickdraft bench --output docs/bench/page/later",
        bench_page.Earlier(
            "docs/bench/old", "quickdraft bench --output old", "abc1234", "Old CPU, 2 cores", "docs/bench/notes.md#old"
        ),
    ),
]


def test_the_page_is_written_between_the_markers_once(checkout):
    report = (checkout / "docs/bench/page/fresh/report.md").read_text()
    assert "\nCommand: `quickdraft bench --output docs/bench/page/fresh`\n" in report  # the report keeps it too
    assert bench_page.write(checkout, BACKENDS) == ["BENCHMARKS.md", "README.md"]
    text = (checkout / "BENCHMARKS.md").read_text()
    head, page = text.split("<!-- bench-page: start -->\n")
    page, tail = page.split("<!-- bench-page: end -->")
    assert head == "# benchmarks\n\nIntro, kept.\n\n" and tail == "\n\n## Kept\n\n| a |\n"
    assert "old page" not in page
    # the run in docs/bench/page/ wins; the other backend shows its earlier report, with its command and CPU
    assert "### fresh backend" in page and "Command: `quickdraft bench --output docs/bench/page/fresh`" in page
    assert "Command (commit abc1234): `quickdraft bench --output old`" in page and "Old CPU, 2 cores" in page
    assert "[docs/bench/old/report.md](docs/bench/old/report.md)" in page
    assert "| prompt-lookup | 30.0 | 2.00x | 2.00 | 0/2 |" in page  # tok/s, speedup, tokens per pass, outputs
    assert "| llama.cpp | 60.0 | 4.00x |  | 2/2 (peer) |" in page
    assert "| contender | overall | qa | translation |" in page and "| prompt-lookup | 2.00x | 2.00x | 2.00x |" in page
    assert (
        "Best method: **prompt-lookup**, 30.0 tok/s, 2.00x plain decoding; its tok/s over each peer's: 0.50x llama.cpp."
    ) in page
    assert "![speedup by task group, fresh backend](docs/bench/page/fresh/speedup_by_category.png)" in page
    assert (
        "```bash\nquickdraft bench --output docs/bench/page/fresh\n"
        "quickdraft bench --output docs/bench/page/later\n"
        ".venv/bin/python scripts/bench_page.py\n```"
    ) in page  # how to reproduce
    readme = (checkout / "README.md").read_text().split("\n")
    assert readme[3] == (
        "Best method over plain decoding on the default target (greedy, Spec-Bench prompts): "
        "prompt-lookup 2.00x on the fresh backend, prompt-lookup 2.00x on the later backend "
        "([BENCHMARKS.md](BENCHMARKS.md))."
    )
    assert "\n".join(readme[:3] + readme[4:]) == README.replace("old line\n", "")
    assert bench_page.write(checkout, BACKENDS) == []  # idempotent


def test_missing_markers_are_an_error_and_nothing_is_written(checkout):
    (checkout / "BENCHMARKS.md").write_text("# benchmarks\n\n<!-- bench-page: start -->\nno end\n")
    with pytest.raises(SystemExit, match="bench-page: end"):
        bench_page.write(checkout, BACKENDS)
    assert (checkout / "README.md").read_text() == README
