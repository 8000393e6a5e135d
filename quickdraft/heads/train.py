"""Train draft heads on cached features: one optimisation loop (AdamW, held-out top-1, progress
bar, checkpoint and resume) for Medusa (sampled positions) and EAGLE (windows of whole sequences);
heads are saved as safetensors with a small config naming the target."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm import tqdm

from quickdraft.heads.eagle import EagleConfig, EagleHead, eagle_loss
from quickdraft.heads.eagle3 import Eagle3Config, Eagle3Head
from quickdraft.heads.medusa import MedusaHeads, medusa_loss
from quickdraft.heads.precision import autocast, training_precision
from quickdraft.heads.vocab import coverage, draft_vocabulary, vocabulary_index

HEADS_FILE, CONFIG_FILE, CHECKPOINT_FILE = "heads.safetensors", "config.json", "checkpoint.pt"


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


def eagle_batch(data: Sequences, chosen: list[int], window: int, index: torch.Tensor, noise: float,
                generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Padded inputs for the EAGLE head: input j is (f_j, x_{j+1}); it should predict f_{j+1} and
    the target's own choice after j + 1 (its greedy guess of x_{j+2}). A random window of at most
    `window` positions per sequence. "response" marks inputs whose x_{j+2} is a response token."""
    parts = []
    for i in chosen:
        tokens, choice, hidden = data.tokens[i], data.choice[i], data.hidden[i]
        first = int(torch.randint(len(tokens) - window + 1, (1,), generator=generator)) if len(tokens) > window else 0
        parts.append((tokens[first : first + window], choice[first : first + window],
                      hidden[first : first + window].float(), data.starts[i] - first))
    t = max(len(p[0]) for p in parts) - 1
    b, h = len(parts), parts[0][2].shape[1]
    states, inputs = torch.zeros(b, t, h), torch.zeros(b, t, dtype=torch.long)
    targets, labels = torch.zeros(b, t, h), torch.full((b, t), -1, dtype=torch.long)
    weight, response = torch.zeros(b, t, dtype=torch.bool), torch.zeros(b, t, dtype=torch.bool)
    for row, (tokens, choice, hidden, start) in enumerate(parts):
        n = len(tokens) - 1
        states[row, :n], inputs[row, :n], targets[row, :n] = hidden[:-1], tokens[1:], hidden[1:]
        labels[row, :n] = torch.where(choice[1:] >= 0, index[choice[1:].clamp(min=0)], -1)  # -1: not extracted
        weight[row, :n] = True
        response[row, max(start - 2, 0) : n] = True
    if noise > 0:
        scale = states.pow(2).mean().sqrt() * noise
        states = states + (torch.rand(states.shape, generator=generator) * 2 - 1) * scale
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    mask = causal[None] & weight[:, None, :]  # [B, T, T]
    mask |= torch.eye(t, dtype=torch.bool)[None]  # padded rows see themselves (their loss is masked)
    positions = torch.arange(t)[None].expand(b, t)
    return {"hidden": states, "tokens": inputs, "positions": positions, "mask": mask, "targets": targets,
            "labels": labels, "weight": weight, "response": response}


def learning_rate(step: int, settings: TrainSettings) -> float:
    """The rate for `step` (a function of the step alone, so a resumed run continues the schedule)."""
    if settings.schedule == "constant":
        return settings.lr
    warmup = max(1, min(100, settings.steps // 10))
    if step < warmup:
        return settings.lr * (step + 1) / warmup  # no large steps while Adam's moments are unknown
    done = (step - warmup) / max(1, settings.steps - warmup)
    return settings.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(done, 1.0))))


def optimise(model: nn.Module, step_loss: Callable[[torch.Generator], torch.Tensor],
             evaluate: Callable[[], torch.Tensor], folder: Path, settings: TrainSettings, desc: str,
             progress: bool) -> tuple[float, torch.Tensor, int, TrainSettings]:
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
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "generator": generator.get_state(), "step": step}, staging)
            staging.rename(checkpoint)
    bar.close()
    return loss, accuracy, step, replace(settings, precision=precision)


def training_vocabulary(shards: list[dict[str, torch.Tensor]], settings: TrainSettings, full: int,
                        folder: Path) -> torch.Tensor:
    """[V'] the draft vocabulary: a resumed run's own (its head's LM head rows follow it, whatever
    data the run now reads), else the data's most frequent response tokens."""
    checkpoint = folder / CHECKPOINT_FILE
    if checkpoint.is_file():
        return torch.load(checkpoint, map_location="cpu")["model"]["vocab"]
    return draft_vocabulary(shards, settings.vocab, full)


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


def train_medusa(shards: list[dict[str, torch.Tensor]], lm_head: torch.Tensor, heads: int, folder: Path,
                 settings: TrainSettings = TrainSettings(), target_name: str = "", progress: bool = True) -> dict:
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
        batch = to_device({"hidden": data.hidden[data.rows[chosen]].float(), "targets": data.targets[:, chosen]},
                          settings.device)
        return medusa_loss(model(batch["hidden"]), batch["targets"])

    def step_loss(generator: torch.Generator) -> torch.Tensor:
        return run(train_index[torch.randint(len(train_index), (settings.positions,), generator=generator)])[0]

    @torch.no_grad()
    def evaluate() -> torch.Tensor:
        return run(eval_index)[1]

    loss, accuracy, step, settings = optimise(model, step_loss, evaluate, folder, settings, "train medusa", progress)
    extra = {"heads": heads}
    return save_head(model, folder, "medusa", target_name, extra, lm_head, vocab, shards, step, accuracy, loss,
                     settings)


def train_eagle(shards: list[dict[str, torch.Tensor]], lm_head: torch.Tensor, embed: torch.Tensor, target_config,
                folder: Path, settings: TrainSettings = TrainSettings(), target_name: str = "",
                progress: bool = True) -> dict:
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
    eval_batch = eagle_batch(data, eval_ids[:32].tolist(), settings.window, index, 0.0,
                             torch.Generator().manual_seed(0))

    def run(batch: dict[str, torch.Tensor], where: str) -> tuple[torch.Tensor, torch.Tensor]:
        batch = to_device(batch, settings.device)
        predicted = model(batch["hidden"], batch["tokens"], batch["positions"], batch["mask"])
        return eagle_loss(predicted, batch["targets"], model.logits(predicted), batch["labels"], batch[where],
                          settings.classification)

    def step_loss(generator: torch.Generator) -> torch.Tensor:
        chosen = train_ids[torch.randint(len(train_ids), (settings.sequences,), generator=generator)].tolist()
        return run(eagle_batch(data, chosen, settings.window, index, settings.noise, generator), "weight")[0]

    @torch.no_grad()
    def evaluate() -> torch.Tensor:  # held-out response positions: what drafting sees
        return run(eval_batch, "response")[1].reshape(1)

    loss, accuracy, step, settings = optimise(model, step_loss, evaluate, folder, settings, "train eagle", progress)
    return save_head(model, folder, "eagle", target_name, {"layer": config.to_dict()}, lm_head, vocab, shards,
                     step, accuracy, loss, settings)


def save_head(model: nn.Module, folder: Path, kind: str, target_name: str, extra: dict, lm_head: torch.Tensor,
              vocab: torch.Tensor, shards: list[dict[str, torch.Tensor]], step: int, accuracy: torch.Tensor,
              loss: float, settings: TrainSettings) -> dict:
    """heads.safetensors (the trained weights in bf16, and the draft vocabulary) and config.json."""
    state = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).cpu().contiguous()
             for k, v in model.state_dict().items()}
    save_file(state, str(folder / HEADS_FILE))
    result = {"kind": kind, "target": target_name, **extra, "hidden": lm_head.shape[1], "vocab": lm_head.shape[0],
              "draft_vocab": len(vocab), "draft_vocab_coverage": round(coverage(shards, vocab, lm_head.shape[0]), 4),
              "steps": step, "held_out_top1": accuracy.reshape(-1).tolist(), "final_loss": loss,
              "settings": asdict(settings)}
    (folder / CONFIG_FILE).write_text(json.dumps(result, indent=1))
    return result


def read_config(folder: Path) -> dict:
    return json.loads((folder / CONFIG_FILE).read_text())


def load_medusa(folder: Path, lm_head: torch.Tensor) -> MedusaHeads:
    """Heads saved by train_medusa, over the target's LM head weight."""
    state = load_file(str(folder / HEADS_FILE))
    model = MedusaHeads(lm_head, read_config(folder)["heads"], state["vocab"])
    model.load_state_dict(state)  # bf16 values into the fp32 parameters
    return model.eval()


def load_eagle(folder: Path, lm_head: torch.Tensor, embed: torch.Tensor) -> EagleHead | Eagle3Head:
    """A head saved by train_eagle (EAGLE-3 when its layer names the fused feature layers, else
    EAGLE-1), over the target's embedding (and, EAGLE-1, LM head) weights."""
    state = load_file(str(folder / HEADS_FILE))
    layer = read_config(folder)["layer"]
    if "features" in layer:
        model = Eagle3Head(Eagle3Config.from_dict(layer), embed, state["vocab"])
    else:
        model = EagleHead(EagleConfig(**layer), embed, lm_head, state["vocab"])
    model.load_state_dict(state)
    return model.eval()
