"""Medusa training (Cai et al. 2024): every position of every example, head k learning the target's
own choice k + 1 tokens further on; sampled positions per step."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from quickdraft.heads.medusa_heads import MedusaHeads
from quickdraft.training.loop import TrainSettings, held_out, optimise, save_head, to_device, training_vocabulary
from quickdraft.training.vocab import vocabulary_index


@dataclass
class Positions:
    """Every position a head can learn from: its row in `hidden` and each head's target token."""

    hidden: torch.Tensor  # [N, H] bf16, all shards
    rows: torch.Tensor  # [P] int64 into hidden
    targets: torch.Tensor  # [heads, P] int64; -1 past the end of the example
    example: torch.Tensor  # [P] int64: which example (to split off held-out ones)
    response: torch.Tensor  # [P] bool: head 1's token is in the response (what drafting sees)


def medusa_positions(shards: list[dict[str, torch.Tensor]], heads: int) -> Positions:
    """Every position t with a token after it; head k's target is the target's own choice after
    position t + k + 1 (its greedy guess of token t + k + 2 from the true prefix)."""
    hidden = torch.cat([s["hidden"] for s in shards])
    rows, targets, example, response = [], [], [], []
    base, number = 0, 0
    for shard in shards:
        choice, offsets, starts = shard["choice"].long(), shard["offsets"].tolist(), shard["starts"].tolist()
        for i in range(len(offsets) - 1):
            first, end = offsets[i], offsets[i + 1]
            t = torch.arange(first, end - 1)  # positions within the shard
            ahead = t[None, :] + torch.arange(heads)[:, None] + 1  # [heads, len]
            rows.append(t + base)
            targets.append(torch.where(ahead < end, choice[ahead.clamp(max=end - 1)], torch.tensor(-1)))
            example.append(torch.full((len(t),), number))
            response.append(t - first + 2 >= starts[i])
            number += 1
        base += len(choice)
    return Positions(hidden, torch.cat(rows), torch.cat(targets, dim=1), torch.cat(example), torch.cat(response))


def medusa_loss(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy over heads, and each head's top-1 accuracy.

    logits [heads, P, V']; targets [heads, P]: head k's token at t + k + 2 as a draft-vocabulary
    index (-1 outside it: it counts as a miss; -2 past the end of the example)."""
    valid, known = targets >= -1, targets >= 0  # [heads, P]
    loss = F.cross_entropy(logits[known], targets[known])
    correct = (logits.argmax(-1) == targets) & known
    accuracy = correct.sum(-1).float() / valid.sum(-1).clamp(min=1)  # [heads]
    return loss, accuracy


def train_medusa(
    shards: list[dict[str, torch.Tensor]],
    lm_head: torch.Tensor,
    heads: int,
    folder: Path,
    settings: TrainSettings = TrainSettings(),
    target_name: str = "",
    progress: bool = True,
) -> dict:
    """Train `heads` Medusa heads; writes folder/heads.safetensors, config.json and a checkpoint.
    Returns the config: held-out top-1 accuracy per head, the loss, the draft vocabulary's coverage."""
    folder.mkdir(parents=True, exist_ok=True)
    full = lm_head.shape[0]
    vocab = training_vocabulary(shards, settings, full, folder)
    index = vocabulary_index(vocab, full)
    data = medusa_positions(shards, heads)
    data.targets = torch.where(data.targets >= 0, index[data.targets.clamp(min=0)], torch.tensor(-2))
    held = held_out(shards, settings)[data.example]
    train_index, eval_index = (~held).nonzero()[:, 0], held.nonzero()[:, 0]
    eval_index = eval_index[data.response[eval_index]]  # held-out response positions: what drafting sees
    eval_index = eval_index[torch.randperm(len(eval_index), generator=torch.Generator().manual_seed(0))[:2048]]
    model = MedusaHeads(lm_head, heads, vocab)

    def run(chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch = to_device(
            {"hidden": data.hidden[data.rows[chosen]].float(), "targets": data.targets[:, chosen]}, settings.device
        )
        return medusa_loss(model(batch["hidden"]), batch["targets"])

    def step_loss(generator: torch.Generator) -> torch.Tensor:
        return run(train_index[torch.randint(len(train_index), (settings.positions,), generator=generator)])[0]

    @torch.no_grad()
    def evaluate() -> torch.Tensor:
        return run(eval_index)[1]

    loss, accuracy, step, settings = optimise(model, step_loss, evaluate, folder, settings, "train medusa", progress)
    extra = {"heads": heads}
    return save_head(
        model, folder, "medusa", target_name, extra, lm_head, vocab, shards, step, accuracy, loss, settings
    )
