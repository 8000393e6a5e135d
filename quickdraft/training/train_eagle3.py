"""Train an EAGLE-3 head with "training-time test" (Li et al. 2025): the head is unrolled on its
own outputs for several steps, so the guesses it makes two, three, four tokens ahead are trained
the way drafting makes them.

Step 0 reads the target's fused features: position t holds (F_t, x_{t+1}) and predicts the
target's choice after t + 1. Step j >= 1 holds (h^{j-1}_{t-1}, x_{t+1}) at position t: the
state the head itself predicted one position earlier, as a tree node at depth j holds its
parent's output. Its query sees step 0's keys up to t - j (what the target verified) and, of
each step i <= j, the one key on its own path (position t - j + i): drafting's tree attention.
Every step predicts the same label at t, with less verified context: loss weights decay by
`decay` per step (later guesses count less, as their acceptance depends on the earlier ones).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from quickdraft.errors import QuickdraftError
from quickdraft.heads.config import Eagle3Config
from quickdraft.heads.eagle3 import Eagle3Head
from quickdraft.heads.format import HEADS_FILE, read_config
from quickdraft.training.loop import TrainSettings, held_out, optimise, save_head, to_device, training_vocabulary
from quickdraft.training.train_eagle import Sequences, eagle_batch, eagle_sequences
from quickdraft.training.vocab import vocabulary_index

EVAL_CONTEXT = 128  # held-out top-1 reads responses after this many prompt tokens, whatever a run's --context


def unroll_mask(t: int, step: int) -> torch.Tensor:
    """[T, (step + 1) T] bool: step `step`'s queries over the keys of steps 0..step, side by side.
    Block 0: keys s <= t - step (verified pairs); block i >= 1: the key at t - step + i (the path)."""
    blocks = [torch.ones(t, t, dtype=torch.bool).tril(diagonal=-step)]
    blocks += [torch.eye(t, dtype=torch.bool).roll(-(step - i), dims=1).tril(diagonal=0) for i in range(1, step + 1)]
    return torch.cat(blocks, dim=1)


def unrolled_states(
    head: Eagle3Head, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, steps: int
) -> Iterator[torch.Tensor]:
    """hidden [B, T, F] target features, tokens [B, T] (x_{t+1}), positions [B, T] -> each step's
    outputs h^j [B, T, H] in turn (h^j at t: the guess after t + 1 with verified pairs up to t - j)."""
    b, t = tokens.shape
    state = head.state(hidden)  # [B, T, H]
    keys: list[list[torch.Tensor]] = [[] for _ in range(head.config.layers)]  # per layer, each step's [B, KV, T, D]
    values: list[list[torch.Tensor]] = [[] for _ in range(head.config.layers)]
    for j in range(steps):
        mask = unroll_mask(t, j).to(tokens.device)[None].expand(b, t, -1)  # [B, T, (j + 1) T]

        def context(layer: int, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor = mask):
            keys[layer].append(k), values[layer].append(v)
            return torch.cat(keys[layer], dim=2), torch.cat(values[layer], dim=2), mask

        h = head.run(state, tokens, positions, context)  # [B, T, H]
        yield h
        state = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], dim=1)  # position t gets h_{t-1}


def unrolled_loss(
    head: Eagle3Head,
    batch: dict[str, torch.Tensor],
    steps: int,
    where: str = "weight",
    decay: float = 0.8,
    prompt_rows: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy on the target's choices over `steps` unrolled steps (weights decay^j,
    normalised) -> (loss, top-1 accuracy per step [steps]) over positions batch[where] that step j
    can reach (t >= j). prompt_rows > 0: every row with a choice counts, prompt rows weighted
    prompt_rows against a response row's 1, and step j only where the j tokens on its path were
    the target's own choices (a drafted path that could be accepted; a prompt's text often is not)."""
    labels = batch["labels"]  # [B, T] draft-vocabulary index, -1 outside it
    t = labels.shape[1]
    weights = [decay**j / sum(decay**i for i in range(steps)) for j in range(steps)]
    rows = torch.where(batch["response"], 1.0, prompt_rows)  # [B, T] each row's share of the loss
    losses, accuracy = [], []
    for j, h in enumerate(unrolled_states(head, batch["hidden"], batch["tokens"], batch["positions"], steps)):
        late = (torch.arange(t, device=labels.device) >= j)[None]  # [1, T] step j needs j earlier rows
        reach = late & (batch["weight"] & (batch["path"] >= j) if prompt_rows > 0 else batch[where])  # [B, T]
        known = reach & (labels >= 0)
        logits = head.logits(h[known])  # [n, V']: only rows with a loss (the LM head is the dear part)
        if not known.any():
            losses.append(h.sum() * 0)
        elif prompt_rows > 0:
            share = rows[known]  # [n]
            losses.append((F.cross_entropy(logits, labels[known], reduction="none") * share).sum() / share.sum())
        else:
            losses.append(F.cross_entropy(logits, labels[known]))
        correct = (logits.argmax(-1) == labels[known]).sum().float()
        accuracy.append(correct / reach.sum().clamp(min=1))  # out-of-vocabulary counts as a miss
    return sum(w * loss for w, loss in zip(weights, losses)), torch.stack(accuracy).detach()


def crop_prompts(data: Sequences, context: int) -> Sequences:
    """Each sequence from `context` tokens before its response: the head learns on responses,
    and long prompts (summaries, passages) would fill the window with rows nobody drafts."""
    cut = [max(0, start - context) for start in data.starts]
    return Sequences(
        [x[c:] for x, c in zip(data.tokens, cut)],
        [x[c:] for x, c in zip(data.choice, cut)],
        [x[c:] for x, c in zip(data.hidden, cut)],
        [s - c for s, c in zip(data.starts, cut)],
    )


def start_from_target(head: Eagle3Head) -> None:
    """fc starts as "take the high features": the state begins as the target's late-layer residual,
    which the target's own final norm and LM head (the head's starting ones) already read. Layers
    after the first start adding nothing (quiet)."""
    h = head.config.hidden
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, -h:] = torch.eye(h)
    quiet(head, list(head.layers))


def quiet(head: Eagle3Head, names: list[str]) -> None:
    """The later layers `names` add nothing to their input (output projections zero) until trained:
    a residual branch that starts silent leaves the head's guesses as they were."""
    with torch.no_grad():
        for name in names:
            head.layers[name].self_attn.o_proj.weight.zero_()
            head.layers[name].mlp.down_proj.weight.zero_()


def starting_head(folder: Path, config: Eagle3Config, vocab: int) -> dict[str, torch.Tensor]:
    """The saved state of the EAGLE-3 head in `folder` (a quickdraft head, as `train` writes and
    heads/shipped holds), checked to fit a target of this layer shape and vocabulary: a run
    fine-tunes it instead of starting from the target's layers. A head of fewer layers than
    `config` gives its own; the layers it lacks start as nothing (see grown_layers)."""
    if not (folder / HEADS_FILE).is_file():
        raise QuickdraftError(f"--init: no quickdraft head in {folder} (its {HEADS_FILE} is missing)")
    saved = read_config(folder)
    layer = saved.get("layer", {})
    if saved.get("kind") != "eagle" or "features" not in layer:
        raise QuickdraftError(f"--init: {folder} holds no EAGLE-3 head (kind {saved.get('kind')!r})")
    own = Eagle3Config.from_dict(layer)
    if replace(own, layers=config.layers) != config or saved.get("vocab") != vocab:
        raise QuickdraftError(
            f"--init: the head in {folder} was trained for another target ({saved.get('target')!r}); "
            "its layer shape or vocabulary differs from this target's"
        )
    if own.layers > config.layers:
        raise QuickdraftError(
            f"--init: the head in {folder} has {own.layers} layers; --head-layers {config.layers} cannot hold them"
        )
    return load_file(str(folder / HEADS_FILE))


def grown_layers(head: Eagle3Head, start: dict[str, torch.Tensor]) -> None:
    """Load `start` (a head of as many or fewer layers) into `head`; each layer it lacks adds
    nothing yet (its attention's and MLP's output projections zero), so the grown head drafts
    exactly as `start` did, and training grows the new layers from there."""
    missing, unexpected = head.load_state_dict(start, strict=False)  # bf16 values into the fp32 parameters
    if unexpected or any(not name.startswith("layers.") for name in missing):
        raise QuickdraftError(f"--init: the head's tensors do not fit ({sorted(unexpected or missing)[:3]})")
    quiet(head, [name for name in head.layers if f"layers.{name}.self_attn.o_proj.weight" in missing])


def widened(start: dict[str, torch.Tensor], head: Eagle3Head) -> dict[str, torch.Tensor]:
    """`start` (a saved head's state) for `head`, whose draft vocabulary holds start's and may add
    tokens: start's LM head rows move to its tokens' places, and an added token's row is the
    head's own (the target's LM head row), which the target's final norm and late-layer state
    the head was trained from already read. Start's tokens score as they did."""
    if torch.equal(start["vocab"], head.vocab):
        return start
    rows = head.lm_head.weight.detach().clone()  # [V', H]
    rows[vocabulary_index(head.vocab, head.embed.shape[0])[start["vocab"]]] = start["lm_head.weight"].float()
    return {**start, "vocab": head.vocab, "lm_head.weight": rows}


def train_eagle3(
    shards: list[dict[str, torch.Tensor]],
    lm_head: torch.Tensor,
    norm: torch.Tensor,
    embed: torch.Tensor,
    config: Eagle3Config,
    folder: Path,
    settings: TrainSettings = TrainSettings(),
    target_name: str = "",
    progress: bool = True,
    init: Path | None = None,
) -> dict:
    """Train an EAGLE-3 head on shards of fused features (extract_features with config.features);
    writes folder/heads.safetensors, config.json and a checkpoint (resumable). init: a head folder
    to fine-tune (its weights and draft vocabulary, widened to settings.vocab where that is larger),
    else the head starts from the target's layers.
    Returns the config with the held-out top-1 accuracy per unrolled step (its depth-1, 2, ... guesses)."""
    folder.mkdir(parents=True, exist_ok=True)
    full = lm_head.shape[0]
    start = starting_head(init, config, full) if init is not None else None
    vocab = training_vocabulary(shards, settings, full, folder, None if start is None else start["vocab"])
    index = vocabulary_index(vocab, full)
    whole = eagle_sequences(shards)
    data = crop_prompts(whole, settings.context)
    eval_data = crop_prompts(whole, EVAL_CONTEXT)
    held = held_out(shards, settings)
    train_ids, eval_ids = (~held).nonzero()[:, 0], held.nonzero()[:, 0]
    head = Eagle3Head(config, embed, vocab, lm_head, norm)
    if start is None:
        start_from_target(head)
    else:
        grown_layers(head, widened(start, head))
    eval_batch = eagle_batch(
        eval_data, eval_ids[:32].tolist(), settings.window, index, 0.0, torch.Generator().manual_seed(0)
    )

    def step_loss(generator: torch.Generator) -> torch.Tensor:
        chosen = train_ids[torch.randint(len(train_ids), (settings.sequences,), generator=generator)].tolist()
        batch = eagle_batch(data, chosen, settings.window, index, 0.0, generator)
        return unrolled_loss(
            head, to_device(batch, settings.device), settings.unroll, "response", prompt_rows=settings.prompt_rows
        )[0]

    @torch.no_grad()
    def evaluate() -> torch.Tensor:  # held-out response positions: what drafting sees
        return unrolled_loss(head, to_device(eval_batch, settings.device), settings.unroll, "response")[1]

    loss, accuracy, step, settings = optimise(head, step_loss, evaluate, folder, settings, "train eagle-3", progress)
    return save_head(
        head,
        folder,
        "eagle",
        target_name,
        {"layer": config.to_dict(), **({"init": str(init)} if init is not None else {})},
        lm_head,
        vocab,
        shards,
        step,
        accuracy,
        loss,
        settings,
    )
