"""Teacher-forced features: each training example through the target's backend once (the one
plain decoding runs on; no transformers model is built), its last hidden state
(after the final norm) and its greedy choice at every position kept on disk next to the tokens,
so heads train without the target. Heads learn the target's choices, not the text's: on text the
target did not write, the two differ, and drafts must match the target."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm
from transformers import PreTrainedTokenizerBase

from quickdraft.backends.backend import Backend, SeqPass
from quickdraft.training.data import Example

Sequence = tuple[list[int], int]  # token ids of a conversation, and where its response starts
SHARD_EXAMPLES = 64  # examples per shard file on average: a crash loses at most one shard
PROMPT_CHOICES = "-prompts"  # in a shard's name: the target's choices on its prompt rows too


def encode_example(tokenizer: PreTrainedTokenizerBase, example: Example, max_tokens: int) -> Sequence:
    """Token ids of the whole conversation and where the response starts (the heads learn the response)."""
    if example.prompt and tokenizer.chat_template:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": example.prompt}], add_generation_prompt=True, tokenize=False
        )
        prompt = tokenizer.encode(text, add_special_tokens=False)  # as Decoder.encode_chat does
    else:
        prompt = tokenizer.encode(example.prompt) if example.prompt else []
    ids = prompt + tokenizer.encode(example.response, add_special_tokens=False)
    return ids[:max_tokens], min(len(prompt), max_tokens)


def fingerprint(sequences: list[Sequence]) -> str:
    """A short digest of training sequences: a shard's name, so a shard is reused only for the same data."""
    return hashlib.sha256(json.dumps(sequences).encode()).hexdigest()[:16]


def shard_sequences(sequences: list[Sequence], mean: int = SHARD_EXAMPLES) -> list[list[Sequence]]:
    """Cut the sequences into shards where an example's own digest says so (content-defined, as
    rsync cuts files): adding or removing examples changes only the shards around them, so the
    features of the rest are reused. At most 16 * mean examples a shard (a rare forced cut)."""
    shards, shard = [], []
    for sequence in sequences:
        shard.append(sequence)
        if int(fingerprint([sequence]), 16) % mean == 0 or len(shard) == 16 * mean:
            shards.append(shard)
            shard = []
    return shards + ([shard] if shard else [])


def feature_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices of sequences of these lengths, grouped for batched passes: similar lengths share a
    pass (little compute goes to padding), at most `budget` padded tokens a pass (a longer
    sequence alone)."""
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if batches and (len(batches[-1]) + 1) * lengths[i] <= budget:
            batches[-1].append(i)  # sorted: the newest is the longest, so it sets the padded width
        else:
            batches.append([i])
    return batches


@torch.inference_mode()
def extract_features(
    backend: Backend,
    sequences: list[Sequence],
    folder: Path,
    progress: bool = True,
    layers: tuple[int, ...] = (),
    shard_examples: int = SHARD_EXAMPLES,
    batch_tokens: int = 1,
    prompt_choices: bool = False,
) -> Path:
    """Write shards features-<digest>.safetensors (tokens int32 [N], hidden bf16 [N, H] or, with
    `layers`, the inputs of those target layers side by side [N, len(layers) H] (EAGLE-3's
    features), choice int32 [N]: the target's argmax after each position (with `layers`, -1 in
    prompts up to 2 tokens before the response), offsets int64 [E + 1],
    starts int64 [E]) and index.json (this data's shards, in order) into `folder`. A shard is
    named by its examples and layers: one already there is kept (resuming an interrupted run, or
    reusing the examples a run shares with an earlier one). shard_examples: examples a shard on
    average. A shard's examples run through the target's `backend` in passes of at most
    `batch_tokens` tokens (1: one example a pass; on a GPU one example a pass is bound by kernel
    launches). prompt_choices: with `layers`, the target's choices on prompt rows too (for heads
    that learn on prompts, `train --prompt-rows`; shards named apart)."""
    folder.mkdir(parents=True, exist_ok=True)
    suffix = f"-layers-{'-'.join(map(str, layers))}" if layers else ""
    suffix += PROMPT_CHOICES if layers and prompt_choices else ""
    bar = tqdm(total=len(sequences), desc="features", unit="example", disable=not progress)
    names = []
    for shard in shard_sequences(sequences, shard_examples):
        name = f"features-{fingerprint(shard)}{suffix}.safetensors"
        names.append(name)
        if (folder / name).is_file():
            bar.update(len(shard))
            continue
        kept = [(ids, start) for ids, start in shard if len(ids) - start >= 2]  # else nothing to learn from
        bar.update(len(shard) - len(kept))
        if not kept:
            names.pop()
            continue
        made: list[tuple[torch.Tensor, torch.Tensor]] = [None] * len(kept)  # type: ignore[list-item]
        for batch in feature_batches([len(ids) for ids, _ in kept], batch_tokens):
            for i, features in zip(batch, target_features(backend, [kept[i] for i in batch], layers, prompt_choices)):
                made[i] = features
            bar.update(len(batch))
        staging = folder / (name + ".partial")
        lengths = torch.tensor([0] + [len(ids) for ids, _ in kept])
        save_file(
            {
                "tokens": torch.cat([torch.tensor(ids, dtype=torch.int32) for ids, _ in kept]),
                "hidden": torch.cat([hidden for hidden, _ in made]),
                "choice": torch.cat([c for _, c in made]),
                "offsets": lengths.cumsum(0),
                "starts": torch.tensor([start for _, start in kept]),
            },
            str(staging),
        )
        staging.rename(folder / name)  # atomic: a half-written shard is never read
    bar.close()
    (folder / "index.json").write_text(json.dumps({"shards": names}))
    return folder


def target_features(
    backend: Backend, batch: list[Sequence], layers: tuple[int, ...], prompt_choices: bool = False
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The target's backend over `batch` (each sequence its own rows and cache) -> each sequence's
    (features bf16 [T, F], choices int32 [T]) as extract_features stores them. EAGLE-3 heads learn
    on responses only (choices -1 in the prompt up to 2 tokens before the response): those prompt
    rows run first in a pass with no logits: no LM head over most of a long prompt (7% less
    time on 40 prompts of the licensed mix, SmolLM2-135M at fp32); prompt_choices: every row's,
    the prompt rows' from that same first pass, so the features are the same bits either way (a
    row's bits may follow its pass's size, e.g. at fp32)."""
    caches = [backend.new_cache() for _ in batch]
    firsts = [max(start - 2, 0) if layers else 0 for _, start in batch]  # the first row of the second pass
    early = [i for i, first in enumerate(firsts) if first]
    prompt_logits = "all" if prompt_choices else "none"
    prompts = [
        SeqPass(caches[i], batch[i][0][: firsts[i]], logits=prompt_logits, hidden=True, taps=layers) for i in early
    ]
    before = dict(zip(early, backend.forward(prompts))) if prompts else {}
    rest = [
        SeqPass(cache, tokens[first:], hidden=True, taps=layers)
        for cache, (tokens, _), first in zip(caches, batch, firsts)
    ]
    result = []
    for i, ((tokens, _), first, out) in enumerate(zip(batch, firsts, backend.forward(rest))):
        picked = torch.full((len(tokens),), -1, dtype=torch.int32)
        picked[first:] = out.logits.argmax(-1).to(torch.int32).cpu()
        if prompt_choices and i in before:
            picked[:first] = before[i].logits.argmax(-1).to(torch.int32).cpu()
        # hidden: the last hidden state after the final norm [T, H], or with layers the inputs of
        # those layers side by side [T, len(layers) H] (EAGLE-3's features).
        hidden = torch.cat([before[i].hidden, out.hidden]) if i in before else out.hidden
        result.append((hidden.to(torch.bfloat16).cpu(), picked))  # [T, F], [T]
    return result


def load_features(folder: Path) -> list[dict[str, torch.Tensor]]:
    """The shards extract_features wrote, in order."""
    index = json.loads((folder / "index.json").read_text())
    return [load_file(str(folder / name)) for name in index["shards"]]
