"""Logits -> probabilities: temperature, top-k and top-p, as pure functions.

The same function processes the target's logits (p) and the drafter's logits (q), so
speculative sampling compares the two distributions the user actually asked for.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quickdraft.errors import QuickdraftError


@dataclass(frozen=True)
class SamplingParams:
    """How to turn logits into a next token. temperature 0 means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise QuickdraftError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise QuickdraftError(f"top_k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise QuickdraftError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[..., V] logits -> [..., V] probabilities after temperature, top-k, top-p (not greedy)."""
    if params.greedy:
        raise ValueError("logits_to_probs is for sampling; greedy decoding uses argmax")
    logits = logits.float() / params.temperature
    if params.top_k is not None and params.top_k < logits.shape[-1]:
        # Keep the k largest logits; ties at the k-th value are kept too, as in transformers.
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p is not None and params.top_p < 1.0:
        probs = _top_p_filter(probs, params.top_p)
    return probs


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p, renormalised."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    # Mass strictly before each token: a token is kept while that mass is still below top_p,
    # so the most likely token is always kept.
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    keep_sorted = mass_before < top_p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = probs * keep
    return kept / kept.sum(dim=-1, keepdim=True)


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """Draw one token id from a [V] distribution, using only the given generator."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def next_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """The token to emit from [V] logits: argmax when greedy, else a sample of the processed distribution."""
    if params.greedy:
        return int(torch.argmax(logits).item())
    return sample(logits_to_probs(logits, params), generator)
