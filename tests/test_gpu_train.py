"""benchmarks/gpu_train.sh cannot rot: its CPU dry run (the default target, a few examples, 2
training steps) runs here, with answers made earlier travelling in as the stage carries them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from quickdraft.models.embedded import DEFAULT_NAME
from quickdraft.training.distill import answers_file, prompt_key, read_answers

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.integration
def test_the_gpu_training_dry_run_reuses_staged_answers_and_returns_the_head_in_parts(tmp_path):
    staged = answers_file(tmp_path / "files", DEFAULT_NAME, 8)  # the dry run answers up to 8 tokens
    staged.parent.mkdir()
    staged.write_text(json.dumps([[1, 2, 3], [4, 5]]) + "\n")  # made earlier, for a prompt not in the data
    run = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_train.sh"), "--dry-run", "--out", str(tmp_path)],
        env=os.environ | {"PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "gpu_train: training: exit 0" in run.stdout
    answers = read_answers(tmp_path / "cache" / staged.name)
    assert answers[prompt_key([1, 2, 3])] == [4, 5] and len(answers) == 7  # kept; the 6 data prompts answered beside it
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["target"] == DEFAULT_NAME and config["steps"] == 2 and len(config["held_out_top1"]) == 4
    parts = sorted(tmp_path.glob("heads.part-*"))
    assert parts and b"".join(p.read_bytes() for p in parts) == (tmp_path / "work" / "heads.safetensors").read_bytes()
