"""Style is checked by a tool, not by reading: ruff's lint rules and its formatter, with the short
config in pyproject.toml ([tool.ruff]), over the package, the tests, the benchmarks and the scripts."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUFF = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
CHECKED = ["quickdraft", "tests", "benchmarks", "scripts"]


def ruff(*args: str) -> subprocess.CompletedProcess:
    assert RUFF is not None, "ruff is a pinned dev dependency: pip install -e '.[dev]'"
    return subprocess.run([RUFF, *args, *CHECKED], cwd=ROOT, capture_output=True, text=True, check=False)


def test_the_code_passes_the_linter():
    result = ruff("check", "--output-format", "concise")
    assert result.returncode == 0, f"`ruff check` found (fix with `ruff check --fix`):\n{result.stdout}{result.stderr}"


def test_the_code_is_formatted():
    result = ruff("format", "--check")
    assert result.returncode == 0, f"`ruff format` would change (run `ruff format`):\n{result.stdout}{result.stderr}"
