#!/usr/bin/env python
"""Do the speculation tests notice when speculation stops? Runs the tests marked `speculation`
(greedy equality with plain decoding, and the sampled-distribution tests, for every method and
backend) twice under a broken drafter (scripts/broken_drafter.py, a pytest plugin loaded with -p):

  nothing: every draft is empty (every test marked `speculation`);
  wrong:   every draft token is (token + 1) % vocab, tree siblings shifted off each other's tokens
           (not the tests also marked `chance`).

Output stays exact either way, so only the tests' own speculation checks (tests/spec_util.py) can
fail them. Exits non-zero, naming them, if any selected test passes (or errors instead of failing)
under either broken drafter.

    .venv/bin/python scripts/check-tests-catch-stalls.py [extra pytest args: files, or -m EXPR to narrow]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A drafter proposing wrong tokens is not run against the tests marked `chance`: under sampling a
# wrong token x is still accepted with probability p(x) (exact speculative sampling), and a tree of
# B siblings over the tiny models' 32 tokens holds the target's choice by chance about B/32 of the
# time (measured 6-13% of passes, against 32-58% for the drafters those tests check).
MODES = {"nothing": "speculation", "wrong": "speculation and not chance"}
SPECULATION_CHECK = "[speculation check]"  # how tests/spec_util.py's assertion messages begin


def outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """test id -> (passed, failed, error or skipped; the failure's message), from pytest's JUnit XML."""
    results = {}
    for case in ElementTree.parse(junit).iter("testcase"):
        parts = case.get("classname", "").split(".")  # tests.test_x[.Class]
        test_id = "/".join(parts[:2]) + ".py::" + "::".join([*parts[2:], case.get("name", "")])
        found = {child.tag: child.get("message", "") for child in case}
        state = next((t for t in ("error", "failure", "skipped") if t in found), "passed")
        results[test_id] = ({"failure": "failed"}.get(state, state), found.get(state, ""))
    return results


def selection(mode: str, extra: list[str]) -> tuple[str, list[str]]:
    """The marker expression (the mode's, and the caller's own -m if given) and the other arguments."""
    if "-m" not in extra:
        return MODES[mode], extra
    at = extra.index("-m")
    return f"{MODES[mode]} and ({extra[at + 1]})", extra[:at] + extra[at + 2 :]


def run(mode: str, extra: list[str], folder: Path) -> tuple[dict[str, str], float]:
    marks, extra = selection(mode, extra)
    junit = folder / f"{mode}.xml"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT / "scripts"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "broken_drafter",
        f"--broken-drafter={mode}",
        "-m",
        marks,
        "-q",
        "--no-header",
        "-p",
        "no:cacheprovider",
        "--tb=no",
        "-o",
        "console_output_style=classic",
        f"--junitxml={junit}",
        *extra,
    ]
    print(f"== drafter proposing {mode}: pytest -m '{marks}' {' '.join(extra)}", flush=True)
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, env=env, check=False)
    elapsed = time.perf_counter() - start
    if not junit.exists():
        sys.exit(f"pytest wrote no report for the '{mode}' run")
    return outcomes(junit), elapsed


def main() -> int:
    extra = sys.argv[1:]
    bad = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in MODES:
            results, elapsed = run(mode, extra, Path(tmp))
            counts = {
                state: sum(r[0] == state for r in results.values())
                for state in ("failed", "passed", "error", "skipped")
            }
            caught = sum(state == "failed" and SPECULATION_CHECK in message for state, message in results.values())
            print(
                f"-- {mode}: {len(results)} tests in {elapsed:.0f} s: "
                + ", ".join(f"{n} {state}" for state, n in counts.items())
                + f" ({caught} failed by the speculation check, {counts['failed'] - caught} by another assertion)",
                flush=True,
            )
            for test_id, (state, message) in sorted(results.items()):
                if state == "failed" and SPECULATION_CHECK not in message:
                    print(f"   {test_id}: {message.splitlines()[0] if message else ''}"[:200])
            if not results:
                bad.append(f"{mode}: no test selected")
            for test_id, (state, _) in sorted(results.items()):
                if state in ("passed", "error"):
                    bad.append(f"{mode}: {test_id} {state.upper()} with a drafter proposing {mode}")
    if bad:
        print("Tests that did not catch a broken drafter:", *bad, sep="\n  ")
        return 1
    print("Every selected test failed under both broken drafters (skipped ones were not run).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
