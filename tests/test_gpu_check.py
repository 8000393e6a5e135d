"""benchmarks/gpu_check.sh cannot rot: its CPU dry run (tiny shapes, the static backend without CUDA
graphs, the bench on the default target) runs here, and the staging that carries the weights to a
GPU machine in parts is checked end to end."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_stage import MISSING, pack, receive  # noqa: E402


@pytest.mark.integration
def test_the_gpu_check_dry_run_runs_every_part(tmp_path):
    run = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run", "--out", str(tmp_path)],
        env=os.environ | {"PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    log = (tmp_path / "check.log").read_text()
    for part in ("tests", "passes", "bench"):
        assert f"gpu_check: {part}: exit 0" in run.stdout, part
    assert "passed" in log and "plain greedy decoding" in log
    passes = json.loads((tmp_path / "passes.json").read_text())["shapes"]["tiny"]
    assert set(passes["passes"]["own_graph"]) == {"1", "2", "4"} and passes["plain"]["tokens"] == 8
    report = (tmp_path / "bench" / "report.md").read_text()
    assert "static backend" in report and "| prompt-lookup |" in report and "0/2 |" in report


def test_staged_parts_travel_one_call_at_a_time_and_unpack_once_all_have_come(tmp_path):
    files = []
    for name, size in (("model.gguf", 300_000), ("question.jsonl", 2_000)):
        path = tmp_path / name
        path.write_bytes(os.urandom(size))
        files.append(path)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "x-1.0-py3-none-any.whl").write_bytes(b"wheel")
    files.append(wheels / "x-1.0-py3-none-any.whl")
    staged = tmp_path / "stage-here"
    manifest = pack(files, staged, part_bytes=120_000)
    assert len(manifest["parts"]) == 3
    store = tmp_path / "there"
    for i, expect in ((1, MISSING), (2, MISSING), (3, 0)):  # one device call per part
        call = tmp_path / f"call-{i}"
        call.mkdir()
        shutil.copy(staged / "manifest.json", call)
        shutil.copy(staged / f"part-{i}", call)
        assert receive(call, store) == expect
    assert (store / "files" / "model.gguf").read_bytes() == files[0].read_bytes()
    assert (store / "files" / "wheels" / "x-1.0-py3-none-any.whl").read_bytes() == b"wheel"
    assert receive(call, store) == 0  # again: already unpacked
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    shutil.copy(staged / "manifest.json", damaged)
    (damaged / "part-1").write_bytes(b"not the part")
    assert receive(damaged, tmp_path / "elsewhere") == 1
