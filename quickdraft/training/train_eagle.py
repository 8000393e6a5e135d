"""EAGLE-1 training (Li et al. 2024): windows of whole sequences, the head predicting the target's
next state and choice from its current state and the next token; the sequences and batches
EAGLE-3 training (train_eagle3.py) reads too."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from quickdraft.heads.config import EagleConfig
from quickdraft.heads.eagle_head import EagleHead
from quickdraft.training.loop import TrainSettings, held_out, optimise, save_head, to_device, training_vocabulary
from quickdraft.training.vocab import vocabulary_index


@dataclass
class Sequences:
    """Whole training sequences for EAGLE: tokens [L_i], the target's choices [L_i], hidden [L_i, H],
    where each response starts."""

    tokens: list[torch.Tensor]
    choice: list[torch.Tensor]
    hidden: list[torch.Tensor]
    starts: list[int]


def eagle_sequences(shards: list[dict[str, torch.Tensor]]) -> Sequences:
    tokens, choice, hidden, starts = [], [], [], []
    for shard in shards:
        offsets = shard["offsets"].tolist()
        for i in range(len(offsets) - 1):
            tokens.append(shard["tokens"][offsets[i] : offsets[i + 1]].long())
            choice.append(shard["choice"][offsets[i] : offsets[i + 1]].long())
            hidden.append(shard["hidden"][offsets[i] : offsets[i + 1]])
            starts.append(int(shard["starts"][i]))
    return Sequences(tokens, choice, hidden, starts)


def eagle_batch(
    data: Sequences, chosen: list[int], window: int, index: torch.Tensor, noise: float, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """Padded inputs for the EAGLE head: input j is (f_j, x_{j+1}); it should predict f_{j+1} and
    the target's own choice after j + 1 (its greedy guess of x_{j+2}). A random window of at most
    `window` positions per sequence. "response" marks inputs whose x_{j+2} is a response token;
    "path" counts the inputs up to j whose token x_{j+1} was the target's own choice, unbroken (on
    a greedy response all of them; in a prompt, where a person wrote the text, often few)."""
    parts = []
    for i in chosen:
        tokens, choice, hidden = data.tokens[i], data.choice[i], data.hidden[i]
        first = int(torch.randint(len(tokens) - window + 1, (1,), generator=generator)) if len(tokens) > window else 0
        parts.append(
            (
                tokens[first : first + window],
                choice[first : first + window],
                hidden[first : first + window].float(),
                data.starts[i] - first,
            )
        )
    t = max(len(p[0]) for p in parts) - 1
    b, h = len(parts), parts[0][2].shape[1]
    states, inputs = torch.zeros(b, t, h), torch.zeros(b, t, dtype=torch.long)
    targets, labels = torch.zeros(b, t, h), torch.full((b, t), -1, dtype=torch.long)
    weight, response = torch.zeros(b, t, dtype=torch.bool), torch.zeros(b, t, dtype=torch.bool)
    agree = torch.zeros(b, t, dtype=torch.bool)
    for row, (tokens, choice, hidden, start) in enumerate(parts):
        n = len(tokens) - 1
        states[row, :n], inputs[row, :n], targets[row, :n] = hidden[:-1], tokens[1:], hidden[1:]
        labels[row, :n] = torch.where(choice[1:] >= 0, index[choice[1:].clamp(min=0)], -1)  # -1: not extracted
        weight[row, :n] = True
        response[row, max(start - 2, 0) : n] = True
        agree[row, :n] = (tokens[1:] == choice[:-1]) & (choice[:-1] >= 0)  # x_{j+1}: the target's own choice
    if noise > 0:
        scale = states.pow(2).mean().sqrt() * noise
        states = states + (torch.rand(states.shape, generator=generator) * 2 - 1) * scale
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    mask = causal[None] & weight[:, None, :]  # [B, T, T]
    mask |= torch.eye(t, dtype=torch.bool)[None]  # padded rows see themselves (their loss is masked)
    positions = torch.arange(t)[None].expand(b, t)
    path = torch.zeros(b, t, dtype=torch.long)  # inputs in a row, ending at j, that were the target's choices
    for j in range(t):
        path[:, j] = (path[:, j - 1] + 1 if j else 1) * agree[:, j]
    return {
        "hidden": states,
        "tokens": inputs,
        "positions": positions,
        "mask": mask,
        "targets": targets,
        "labels": labels,
        "weight": weight,
        "response": response,
        "path": path,
    }


def eagle_loss(
    predicted: torch.Tensor,
    target: torch.Tensor,
    logits: torch.Tensor,
    labels: torch.Tensor,
    weight: torch.Tensor,
    classification: float = 0.1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Smooth-L1 on the predicted state plus `classification` x cross-entropy on its next token
    (EAGLE's loss), over positions where weight is True; and the top-1 accuracy there.

    predicted, target [B, T, H]; logits [B, T, V']; labels [B, T] draft-vocab index (-1: outside it
    or past the end); weight [B, T] bool."""
    regression = F.smooth_l1_loss(predicted[weight], target[weight])
    known = weight & (labels >= 0)
    ce = F.cross_entropy(logits[known], labels[known]) if known.any() else predicted.sum() * 0
    correct = (logits.argmax(-1) == labels) & known
    accuracy = correct.sum().float() / weight.sum().clamp(min=1)  # out-of-vocabulary counts as a miss
    return regression + classification * ce, accuracy


def train_eagle(
    shards: list[dict[str, torch.Tensor]],
    lm_head: torch.Tensor,
    embed: torch.Tensor,
    target_config,
    folder: Path,
    settings: TrainSettings = TrainSettings(),
    target_name: str = "",
    progress: bool = True,
) -> dict:
    """Train an EAGLE head; writes folder/heads.safetensors, config.json and a checkpoint.
    Returns the config with the held-out top-1 accuracy of its first draft token (teacher-forced)."""
    folder.mkdir(parents=True, exist_ok=True)
    full = lm_head.shape[0]
    vocab = training_vocabulary(shards, settings, full, folder)
    index = vocabulary_index(vocab, full)
    data = eagle_sequences(shards)
    held = held_out(shards, settings)
    train_ids, eval_ids = (~held).nonzero()[:, 0], held.nonzero()[:, 0]
    config = EagleConfig.from_target(target_config)
    model = EagleHead(config, embed, lm_head, vocab)
    eval_batch = eagle_batch(
        data, eval_ids[:32].tolist(), settings.window, index, 0.0, torch.Generator().manual_seed(0)
    )

    def run(batch: dict[str, torch.Tensor], where: str) -> tuple[torch.Tensor, torch.Tensor]:
        batch = to_device(batch, settings.device)
        predicted = model(batch["hidden"], batch["tokens"], batch["positions"], batch["mask"])
        return eagle_loss(
            predicted, batch["targets"], model.logits(predicted), batch["labels"], batch[where], settings.classification
        )

    def step_loss(generator: torch.Generator) -> torch.Tensor:
        chosen = train_ids[torch.randint(len(train_ids), (settings.sequences,), generator=generator)].tolist()
        return run(eagle_batch(data, chosen, settings.window, index, settings.noise, generator), "weight")[0]

    @torch.no_grad()
    def evaluate() -> torch.Tensor:  # held-out response positions: what drafting sees
        return run(eval_batch, "response")[1].reshape(1)

    loss, accuracy, step, settings = optimise(model, step_loss, evaluate, folder, settings, "train eagle", progress)
    return save_head(
        model,
        folder,
        "eagle",
        target_name,
        {"layer": config.to_dict()},
        lm_head,
        vocab,
        shards,
        step,
        accuracy,
        loss,
        settings,
    )
