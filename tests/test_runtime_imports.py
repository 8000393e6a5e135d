"""Drafting, serving, benchmarking and export never import training code: they read heads through
quickdraft/heads/format.py, and only `quickdraft train` reaches quickdraft/training/."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = (
    "quickdraft",
    "quickdraft.methods",
    "quickdraft.drafters.eagle",
    "quickdraft.drafters.medusa",
    "quickdraft.heads.format",
    "quickdraft.heads.store",
    "quickdraft.heads.export",
    "quickdraft.heads.inference",
    "quickdraft.serve",
    "quickdraft.bench.bench_command",
    "quickdraft.cli",
)
REPORT = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(" ".join(sorted(m for m in sys.modules if m == "quickdraft.training" or m.startswith("quickdraft.training."))))
"""


def test_runtime_modules_do_not_import_the_training_package():
    # A fresh interpreter: this test process has imported training modules for other tests.
    run = subprocess.run(
        [sys.executable, "-c", REPORT, *RUNTIME], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "", f"runtime imports training modules: {run.stdout.strip()}"
