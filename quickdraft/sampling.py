"""Logits -> probabilities: temperature, top-k and top-p, as pure functions.

The same function processes the target's logits (p) and the drafter's logits (q), so
speculative sampling compares the two distributions the user actually asked for.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quickdraft.settings import SAMPLING, checked_sampling


@dataclass(frozen=True)
class SamplingParams:
    """How to turn logits into a next token. temperature 0 means greedy (argmax)."""

    temperature: float = SAMPLING["temperature"].default
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        checked_sampling(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)  # bounds: settings.py

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[..., V] logits -> [..., V] probabilities after temperature, top-k, top-p (not greedy)."""
    if params.greedy:
        raise ValueError("logits_to_probs is for sampling; greedy decoding uses argmax")
    logits = logits.float()
    # Dividing (logits - max) keeps the largest at 0: a tiny temperature makes a one-hot (greedy), never inf - inf.
    logits = (logits - logits.max(dim=-1, keepdim=True).values) / params.temperature
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
    keep_sorted[..., 0] = True  # a top_p below float32's smallest number still keeps the top token
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = probs * keep
    return kept / kept.sum(dim=-1, keepdim=True)


@dataclass(frozen=True)
class TokenLogprob:
    """An emitted token's log-probability under the target, with the most likely alternatives."""

    token: int
    logprob: float
    top: list[tuple[int, float]]  # (token, logprob), most likely first


def token_logprobs(logits: torch.Tensor, tokens: list[int], top: int = 0) -> list[TokenLogprob]:
    """Each token's log-probability under its row of [E, V] logits, and the `top` best per row.
    Raw logits (before temperature and filters): the model's own distribution, as OpenAI reports."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # [E, V]
    index = torch.tensor(tokens, dtype=torch.long, device=logp.device)[:, None]  # [E, 1]
    chosen = logp.gather(-1, index)[:, 0].tolist()
    if top:
        values, ids = logp.topk(min(top, logp.shape[-1]), dim=-1)  # [E, top]
        alternatives = [list(zip(row_ids, row_values)) for row_ids, row_values in zip(ids.tolist(), values.tolist())]
    else:
        alternatives = [[] for _ in tokens]
    return [TokenLogprob(t, lp, alt) for t, lp, alt in zip(tokens, chosen, alternatives)]


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """Draw one token id from a [V] distribution, using only the given generator."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def gumbel_pick(probs: torch.Tensor, gumbel: torch.Tensor) -> int:
    """argmax(log p + g) of a [V] distribution and [V'] noise: an exact sample of p (the Gumbel-max
    trick) whose only randomness is g. Ids p lacks noise for (V > V') are never picked, nor ids p
    gives no mass (filtered by top-k or top-p: log 0 = -inf)."""
    n = min(probs.shape[-1], gumbel.shape[-1])
    return int((probs[:n].log() + gumbel[:n]).argmax())


def next_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """The token to emit from [V] logits: argmax when greedy, else a sample of the processed distribution."""
    if params.greedy:
        return int(torch.argmax(logits).item())
    return sample(logits_to_probs(logits, params), generator)
