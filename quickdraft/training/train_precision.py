"""The arithmetic a training step runs in: fp32, or bf16 autocast (fp32 weights and optimiser
state, bf16 products). Which is faster depends on the processor (bf16 units or not), so "auto"
times both on the run's own batches once per machine and run settings, and keeps the answer in
the run's folder."""

from __future__ import annotations

import statistics
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from quickdraft.measured import cached_choice, wall_ms

PRECISIONS = ("fp32", "bf16")
TIMED_STEPS = 3  # per precision, interleaved, after one warm-up each


@contextmanager
def autocast(device: str, precision: str) -> Iterator[None]:
    """Run the enclosed forward pass in `precision` on `device`."""
    with warnings.catch_warnings():
        # bf16 activations meet fp32 norm weights: torch warns that it uses its unfused kernel there.
        warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            yield


def training_precision(
    model: nn.Module,
    step_loss: Callable[[torch.Generator], torch.Tensor],
    folder: Path,
    settings: dict,
    device: str,
    chosen: str,
) -> str:
    """`chosen` ("fp32", "bf16"), or for "auto" the one whose training step (forward and backward,
    no update) is faster here, measured once per machine and `settings` (cached in `folder`)."""
    if chosen != "auto":
        if chosen not in PRECISIONS:
            raise ValueError(f"training precision must be auto or one of {PRECISIONS}, not {chosen!r}")
        return chosen
    shapes = [list(p.shape) for p in model.parameters() if p.requires_grad]

    def measure() -> str:
        generator = torch.Generator().manual_seed(1)  # not the run's: its batches stay as they were

        def run(precision: str) -> None:
            with autocast(device, precision):
                loss = step_loss(generator)
            loss.backward()

        costs: dict[str, list[float]] = {precision: [] for precision in PRECISIONS}
        for precision in PRECISIONS:
            run(precision)  # warm-up
        for _ in range(TIMED_STEPS):
            for precision in PRECISIONS:  # interleaved: drift hits both alike
                costs[precision].append(wall_ms(lambda: run(precision)))
        model.zero_grad(set_to_none=True)
        medians = {precision: statistics.median(times) for precision, times in costs.items()}
        faster = min(PRECISIONS, key=medians.__getitem__)
        print(
            "quickdraft: a training step here: "
            + ", ".join(f"{p} {ms:,.0f} ms" for p, ms in medians.items())
            + f" (median of {TIMED_STEPS}): {faster}",
            file=sys.stderr,
        )
        return faster

    signature = {"training": "precision", "device": device, "parameters": shapes, "settings": settings}
    return str(cached_choice(folder, signature, measure))
