"""Measured once per machine, kept on disk: a choice (which kernel, which backend, which
precision is fastest here) is timed the first time it is needed and read back from a JSON file
after, keyed by this machine (processor name and flags, torch, threads) and a signature of what
was timed. The backends' kernel and pass timings (backends/kernel_timing.py), auto's backend
choice (backends/choice.py), the draft heads' kernel (heads/inference.py) and a training run's
precision (training/train_precision.py) all keep their answers here.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPEATS = 5  # rounds over every case; the median of each case's rounds counts
QUIET = 0.75  # our threads' CPU seconds / (wall seconds x threads) below this: the machine was busy


def machine_key() -> str:
    """What decides kernel speed here: the processor (name and feature flags), torch, threads."""
    cpu = platform.machine()
    try:
        info = Path("/proc/cpuinfo").read_text()
        names = [
            line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith(("model name", "flags"))
        ]
        cpu += "|" + "|".join(dict.fromkeys(names))
    except OSError:
        cpu += "|" + platform.processor()
    if torch.cuda.is_available():
        cpu += "|" + torch.cuda.get_device_name()
    return f"{cpu}|torch {torch.__version__}|threads {torch.get_num_threads()}"


def _choice_path(folder: Path | None, signature: dict) -> tuple[Path | None, str]:
    """The JSON file that keeps a choice for this machine and signature, and the signature's text."""
    text = json.dumps({"machine": machine_key(), **signature}, sort_keys=True)
    path = None if folder is None else folder / f"{hashlib.sha256(text.encode()).hexdigest()[:20]}.json"
    return path, text


def read_choice(folder: Path | None, signature: dict) -> Any:
    """The choice kept for this machine and signature, or None (none kept, or unreadable)."""
    path, _ = _choice_path(folder, signature)
    if path is not None and path.is_file():
        try:
            return json.loads(path.read_text())["choice"]
        except (ValueError, KeyError, OSError):
            pass  # unreadable: measure again
    return None


def write_choice(folder: Path | None, signature: dict, choice: Any) -> None:
    """Keep a choice for this machine and signature (a read-only cache only costs a measurement)."""
    path, text = _choice_path(folder, signature)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"signature": json.loads(text), "choice": choice}, indent=1))
        except OSError:
            pass


def forget_choice(folder: Path | None, signature: dict) -> bool:
    """Drop a kept choice, so the next load measures again. True if one was dropped."""
    path, _ = _choice_path(folder, signature)
    try:
        path.unlink()
        return True
    except (AttributeError, OSError):
        return False


def cached_choice(folder: Path | None, signature: dict, measure: Callable[[], Any]) -> Any:
    """measure() once per machine and signature; later loads read the JSON file it left."""
    choice = read_choice(folder, signature)
    if choice is None:
        choice = measure()
        write_choice(folder, signature, choice)
    return choice


def wall_ms(run: Callable[[], object]) -> float:
    """Wall milliseconds of run(), GPU work included (a GPU runs queued work after the call returns)."""
    sync = torch.cuda.synchronize if torch.cuda.is_initialized() else (lambda: None)
    sync()
    start = time.perf_counter()
    run()
    sync()
    return 1000 * (time.perf_counter() - start)


class CpuShare:
    """The share of `threads` cores this process got from its making to share(): CPU seconds over
    wall seconds times threads (1: the cores were ours; under QUIET: other work had them)."""

    def __init__(self, threads: int) -> None:
        self.threads, self.wall, self.cpu = threads, time.perf_counter(), time.process_time()

    def share(self) -> float:
        wall = max(1e-9, (time.perf_counter() - self.wall) * self.threads)
        return min(1.0, (time.process_time() - self.cpu) / wall)
