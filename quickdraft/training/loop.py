"""The optimisation loop every head trains in: AdamW with a learning-rate schedule, held-out top-1,
a progress bar, checkpoint and resume; the held-out split and the draft vocabulary it keeps; the
trained head saved in the runtime's format (heads/format.py) with how it was made."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from quickdraft.heads.format import write_head
from quickdraft.training.train_precision import autocast, training_precision
from quickdraft.training.vocab import coverage, draft_vocabulary

CHECKPOINT_FILE = "checkpoint.pt"


@dataclass(frozen=True)
class TrainSettings:
    steps: int = 2000
    positions: int = 256  # Medusa: sampled training positions per step
    sequences: int = 8  # EAGLE: sequences per step
    window: int = 256  # EAGLE: the longest stretch of a sequence in one step
    lr: float = 1e-3
    vocab: int = 8192  # draft vocabulary: the most frequent response tokens
    noise: float = 0.1  # EAGLE: uniform noise on input states, x their RMS (drafting reads its own guesses)
    classification: float = 0.1  # EAGLE: weight of the cross-entropy on the next choice (regression: 1)
    unroll: int = 4  # EAGLE-3: steps the head is unrolled on its own outputs (training-time test)
    context: int = 128  # EAGLE-3: prompt tokens kept before each response
    prompt_rows: float = 0.0  # EAGLE-3: loss weight of prompt rows with the target's choices (0: responses only)
    schedule: str = "constant"  # learning rate: "constant", or "cosine" (warm-up, then down to a tenth)
    eval_every: int = 100
    checkpoint_every: int = 200
    held_out: float = 0.05  # share of examples never trained on (chosen by their digest and the seed)
    seed: int = 0
    device: str = "cpu"  # where the head trains (batches are drawn on the CPU, then moved)
    precision: str = "auto"  # a step's arithmetic: "fp32", "bf16" (autocast) or "auto" (the faster, measured)


def to_device(batch: dict[str, torch.Tensor], device: str) -> dict[str, torch.Tensor]:
    """A batch's tensors on `device`."""
    return {key: value.to(device) for key, value in batch.items()}


def learning_rate(step: int, settings: TrainSettings) -> float:
    """The rate for `step` (a function of the step alone, so a resumed run continues the schedule)."""
    if settings.schedule == "constant":
        return settings.lr
    warmup = max(1, min(100, settings.steps // 10))
    if step < warmup:
        return settings.lr * (step + 1) / warmup  # no large steps while Adam's moments are unknown
    done = (step - warmup) / max(1, settings.steps - warmup)
    return settings.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(done, 1.0))))


def optimise(
    model: nn.Module,
    step_loss: Callable[[torch.Generator], torch.Tensor],
    evaluate: Callable[[], torch.Tensor],
    folder: Path,
    settings: TrainSettings,
    desc: str,
    progress: bool,
) -> tuple[float, torch.Tensor, int, TrainSettings]:
    """AdamW on step_loss until settings.steps, resuming from folder's checkpoint; returns the last
    loss, the held-out top-1 accuracy, the step count and the settings with the precision used."""
    generator = torch.Generator().manual_seed(settings.seed)  # draws batches on the CPU, wherever the head is
    model.to(settings.device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=settings.lr)
    checkpoint, step = folder / CHECKPOINT_FILE, 0
    if checkpoint.is_file():  # resume where it stopped
        state = torch.load(checkpoint, map_location=settings.device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"].cpu())
        step = state["step"]
    timed = {k: v for k, v in asdict(settings).items() if k not in ("steps", "lr", "precision")}  # what costs time
    precision = training_precision(model, step_loss, folder, timed, settings.device, settings.precision)
    bar = tqdm(total=settings.steps, initial=step, desc=f"{desc} ({precision})", unit="step", disable=not progress)
    loss = float("nan")
    accuracy = evaluate()
    while step < settings.steps:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, settings)
        with autocast(settings.device, precision):
            value = step_loss(generator)
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
        loss = value.item()
        step += 1
        if step == settings.steps:
            with torch.no_grad():  # heads are saved in bf16: the final weights are what loads back
                for parameter in model.parameters():
                    parameter.copy_(parameter.to(torch.bfloat16))
        if step % settings.eval_every == 0 or step == settings.steps:
            accuracy = evaluate()
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", top1="/".join(f"{a:.2f}" for a in accuracy.reshape(-1).tolist()))
        if step % settings.checkpoint_every == 0 or step == settings.steps:
            staging = checkpoint.with_suffix(".partial")
            torch.save(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "generator": generator.get_state(),
                    "step": step,
                },
                staging,
            )
            staging.rename(checkpoint)
    bar.close()
    return loss, accuracy, step, replace(settings, precision=precision)


def training_vocabulary(
    shards: list[dict[str, torch.Tensor]],
    settings: TrainSettings,
    full: int,
    folder: Path,
    start: torch.Tensor | None = None,
) -> torch.Tensor:
    """[V'] the draft vocabulary: a resumed run's own (its head's LM head rows follow it, whatever
    data the run now reads), else the data's most frequent tokens, `settings.vocab` of them; a
    run that fine-tunes a head (`start`, its vocabulary) keeps all of that head's, and widens it
    to `settings.vocab` with the data's most frequent others."""
    checkpoint = folder / CHECKPOINT_FILE
    if checkpoint.is_file():
        return torch.load(checkpoint, map_location="cpu")["model"]["vocab"]
    return draft_vocabulary(shards, settings.vocab, full, keep=start)


def held_out(shards: list[dict[str, torch.Tensor]], settings: TrainSettings) -> torch.Tensor:
    """[examples] bool, in the shards' order: the examples never trained on, a share chosen by each
    example's own tokens (and the seed), so data grown later keeps them held out (at least one)."""
    draws = []
    for shard in shards:
        offsets = shard["offsets"].tolist()
        for first, end in zip(offsets, offsets[1:]):
            text = shard["tokens"][first:end].numpy().tobytes() + str(settings.seed).encode()
            draws.append(int(hashlib.sha256(text).hexdigest()[:12], 16) / 16**12)  # uniform in [0, 1)
    draws = torch.tensor(draws, dtype=torch.float64)
    return (draws < settings.held_out) | (draws == draws.min())


def save_head(
    model: nn.Module,
    folder: Path,
    kind: str,
    target_name: str,
    extra: dict,
    lm_head: torch.Tensor,
    vocab: torch.Tensor,
    shards: list[dict[str, torch.Tensor]],
    step: int,
    accuracy: torch.Tensor,
    loss: float,
    settings: TrainSettings,
) -> dict:
    """The trained head in `folder` (heads/format.py), its config telling how it was made; returns the config."""
    result = {
        "kind": kind,
        "target": target_name,
        **extra,
        "hidden": lm_head.shape[1],
        "vocab": lm_head.shape[0],
        "draft_vocab": len(vocab),
        "draft_vocab_coverage": round(coverage(shards, vocab, lm_head.shape[0]), 4),
        "steps": step,
        "held_out_top1": accuracy.reshape(-1).tolist(),
        "final_loss": loss,
        "settings": asdict(settings),
    }
    write_head(folder, model, result)
    return result
