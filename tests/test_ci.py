"""CI runs exactly the test command the README gives (.ci/run), and the README gives one."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_the_readmes_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^(\./setup\.sh && \.venv/bin/python -m pytest[^#\n]*?)\s*(?:#.*)?$", readme, re.M)
    assert len(commands) == 1, commands
    ci = [
        line
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line and not line.startswith(("#", "set ", "cd "))
    ]
    assert ci == [commands[0]]
