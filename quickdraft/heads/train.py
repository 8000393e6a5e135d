"""Train draft heads on cached features: sampled positions, AdamW, held-out top-1 per head,
resumable from a checkpoint, saved as safetensors with a small config naming the target."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from quickdraft.heads.medusa import MedusaHeads, medusa_loss


@dataclass(frozen=True)
class TrainSettings:
    steps: int = 2000
    positions: int = 256  # sampled training positions per step
    lr: float = 1e-3
    eval_every: int = 100
    checkpoint_every: int = 200
    held_out: float = 0.05  # the last examples, never trained on
    seed: int = 0


@dataclass
class Positions:
    """Every position a head can learn from: its row in `hidden` and each head's target token."""

    hidden: torch.Tensor  # [N, H] bf16, all shards
    rows: torch.Tensor  # [P] int64 into hidden
    targets: torch.Tensor  # [heads, P] int64; -1 past the end of the example
    example: torch.Tensor  # [P] int64: which example (to split off held-out ones)


def medusa_positions(shards: list[dict[str, torch.Tensor]], heads: int) -> Positions:
    """Response positions t (from the last prompt token on); head k's target is token t + k + 2."""
    hidden = torch.cat([s["hidden"] for s in shards])
    rows, targets, example = [], [], []
    base, number = 0, 0
    for shard in shards:
        tokens, offsets, starts = shard["tokens"].long(), shard["offsets"].tolist(), shard["starts"].tolist()
        for i, start in enumerate(starts):
            first, end = offsets[i], offsets[i + 1]
            t = torch.arange(first + max(start - 1, 0), end - 1)  # positions within the shard
            ahead = t[None, :] + torch.arange(heads)[:, None] + 2  # [heads, len]
            padded = torch.cat([tokens, torch.full((heads + 2,), -1)])
            target = torch.where(ahead < end, padded[ahead.clamp(max=len(padded) - 1)], torch.tensor(-1))
            rows.append(t + base)
            targets.append(target)
            example.append(torch.full((len(t),), number))
            number += 1
        base += len(tokens)
    return Positions(hidden, torch.cat(rows), torch.cat(targets, dim=1), torch.cat(example))


def train_medusa(shards: list[dict[str, torch.Tensor]], lm_head: torch.Tensor, heads: int, folder: Path,
                 settings: TrainSettings = TrainSettings(), target_name: str = "", progress: bool = True) -> dict:
    """Train `heads` Medusa heads; writes folder/heads.safetensors, config.json and a checkpoint.
    Returns the final held-out top-1 accuracy per head and the loss."""
    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(settings.seed)
    data = medusa_positions(shards, heads)
    examples = int(data.example.max()) + 1
    held = data.example >= examples - max(1, int(examples * settings.held_out))
    train_index, eval_index = (~held).nonzero()[:, 0], held.nonzero()[:, 0]
    eval_index = eval_index[torch.randperm(len(eval_index), generator=generator)[:2048]]
    model = MedusaHeads(lm_head, heads)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr)
    checkpoint, step = folder / "checkpoint.pt", 0
    if checkpoint.is_file():  # resume where it stopped
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"])
        step = state["step"]

    def batch(index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return data.hidden[data.rows[index]].float(), data.targets[:, index]

    def evaluate() -> torch.Tensor:
        with torch.no_grad():
            return medusa_loss(model(batch(eval_index)[0]), batch(eval_index)[1])[1]

    bar = tqdm(total=settings.steps, initial=step, desc="train medusa", unit="step", disable=not progress)
    loss = torch.tensor(float("nan"))
    accuracy = evaluate()
    while step < settings.steps:
        index = train_index[torch.randint(len(train_index), (settings.positions,), generator=generator)]
        hidden, target = batch(index)
        loss, _ = medusa_loss(model(hidden), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step % settings.eval_every == 0 or step == settings.steps:
            accuracy = evaluate()
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", top1="/".join(f"{a:.2f}" for a in accuracy.tolist()))
        if step % settings.checkpoint_every == 0 or step == settings.steps:
            staging = checkpoint.with_suffix(".partial")
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "generator": generator.get_state(), "step": step}, staging)
            staging.rename(checkpoint)
    bar.close()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "heads.safetensors"))
    result = {"kind": "medusa", "target": target_name, "heads": heads, "hidden": lm_head.shape[1],
              "vocab": lm_head.shape[0], "steps": step, "held_out_top1": accuracy.tolist(),
              "final_loss": float(loss.detach()), "settings": asdict(settings)}
    (folder / "config.json").write_text(json.dumps(result, indent=1))
    return result


def load_medusa(folder: Path, lm_head: torch.Tensor) -> MedusaHeads:
    """Heads saved by train_medusa, over the target's LM head weight."""
    config = json.loads((folder / "config.json").read_text())
    model = MedusaHeads(lm_head, config["heads"])
    model.load_state_dict(load_file(str(folder / "heads.safetensors")))
    return model.eval()
