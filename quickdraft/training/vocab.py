"""The draft vocabulary: the most frequent tokens of the training text (prompts too: answers
quote and translate their prompts). A head scores only
these (a slice of the target's LM head), which makes each drafting step several times cheaper;
tokens outside it are never drafted, and the target still verifies every token."""

from __future__ import annotations

import torch


def draft_vocabulary(
    shards: list[dict[str, torch.Tensor]], size: int, full_size: int, keep: torch.Tensor | None = None
) -> torch.Tensor:
    """[min(size, V)] int64: the ids seen most often, ascending. keep: ids that stay in it whatever
    their count (a fine-tuned head's own vocabulary): the most frequent others fill it up to
    `size`, and none join when keep holds `size` or more (then it is keep, all of it)."""
    counts = torch.zeros(full_size, dtype=torch.long)
    for shard in shards:
        counts += torch.bincount(shard["tokens"].long(), minlength=full_size)
    if keep is not None:
        counts[keep] = counts.sum() + 1  # above every count: kept first
    return torch.sort(torch.topk(counts, max(min(size, full_size), 0 if keep is None else len(keep))).indices).values


def vocabulary_index(vocab: torch.Tensor, full_size: int) -> torch.Tensor:
    """[V] int64: a full id's index in the draft vocabulary, or -1 outside it."""
    index = torch.full((full_size,), -1, dtype=torch.long)
    index[vocab] = torch.arange(len(vocab))
    return index


def coverage(shards: list[dict[str, torch.Tensor]], vocab: torch.Tensor, full_size: int) -> float:
    """The share of response tokens inside the draft vocabulary."""
    inside, total = 0, 0
    index = vocabulary_index(vocab, full_size)
    for shard in shards:
        tokens, offsets, starts = shard["tokens"].long(), shard["offsets"].tolist(), shard["starts"].tolist()
        for i, start in enumerate(starts):
            part = tokens[offsets[i] + start : offsets[i + 1]]
            inside += int((index[part] >= 0).sum())
            total += len(part)
    return inside / max(total, 1)
