"""The rejection sampler: which draft tokens the target accepts, and the token it adds.

Pure functions: no model inside. Given K draft tokens, the draft's distributions q at each
of them (None for deterministic drafters, meaning one-hot q) and the target's logits at
K + 1 positions, return how many drafts are accepted and the recovered or bonus token.

Worked example (greedy): draft [5, 9, 2], target argmax at the 4 positions [5, 9, 7, 3]
-> drafts 5 and 9 match, 2 != 7, so 2 tokens are accepted and 7 is the recovered token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quickdraft.sampling import SamplingParams, logits_to_probs, sample
from quickdraft.tree import children


@dataclass(frozen=True)
class Verdict:
    """The outcome of one target pass."""

    accepted: int  # number of draft tokens kept
    next_token: int  # recovered token (after a rejection) or bonus token (all accepted)
    bonus: bool  # True when the accepted path ended at a leaf and next_token came from its p
    path: tuple[int, ...] = ()  # indices of the accepted draft nodes, root to leaf


def verify(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator,
) -> Verdict:
    """Verify a chain of drafts. draft_tokens [K], draft_probs [K, V] or None, target_logits [K+1, V]."""
    k = draft_tokens.shape[0]
    assert target_logits.shape[0] == k + 1, "the target scores the last token plus every draft"
    if params.greedy:
        return verify_greedy(draft_tokens, target_logits)
    target_probs = logits_to_probs(target_logits, params)  # [K+1, V]
    if draft_probs is None:
        draft_probs = one_hot_probs(draft_tokens, target_probs.shape[-1])
    return verify_stochastic(draft_tokens, draft_probs, target_probs, generator)


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> Verdict:
    """Accept while the draft equals the target's argmax; the argmax after that is emitted."""
    k = draft_tokens.shape[0]
    target_choice = torch.argmax(target_logits, dim=-1)  # [K+1]
    accepted = leading_true(draft_tokens == target_choice[:k])
    return Verdict(accepted, int(target_choice[accepted].item()), bonus=accepted == k,
                   path=tuple(range(accepted)))


def verify_stochastic(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> Verdict:
    """Speculative sampling (Leviathan et al. 2023, Chen et al. 2023); lossless for any q.

    draft_tokens [K], draft_probs q [K, V'], target_probs p [K+1, V] with V' <= V
    (a draft with a smaller logit space puts no mass on the extra ids).
    """
    k = draft_tokens.shape[0]
    vocab = target_probs.shape[-1]
    if draft_probs.shape[-1] < vocab:
        draft_probs = torch.nn.functional.pad(draft_probs, (0, vocab - draft_probs.shape[-1]))
    rows = torch.arange(k)
    p_x = target_probs[rows, draft_tokens]  # [K] target mass on each draft token
    q_x = draft_probs[rows, draft_tokens]  # [K] draft mass on it
    # Accept x with probability min(1, p(x)/q(x)); q(x) = 0 cannot be drafted, so it only
    # matters when p(x) = 0 too, and then x must be rejected.
    ratio = torch.where(q_x > 0, p_x / q_x.clamp_min(1e-30), (p_x > 0).float())
    uniforms = torch.rand(k, generator=generator, dtype=p_x.dtype)  # [K]
    accepted = leading_true(uniforms < ratio)
    if accepted == k:
        # Every draft passed: one more token for free from the target's next distribution.
        return Verdict(k, sample(target_probs[k], generator), bonus=True, path=tuple(range(k)))
    residual = residual_distribution(target_probs[accepted], draft_probs[accepted])
    return Verdict(accepted, sample(residual, generator), bonus=False, path=tuple(range(accepted)))


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) over [V]: the mass p has that q under-proposed.

    When the residual is all zero (p == q, which can only reject through rounding) any
    sample from p is correct, so fall back to p.
    """
    residual = (p - q).clamp_min(0.0)
    total = residual.sum()
    if total <= 0:
        return p
    return residual / total


def one_hot_probs(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """[K] tokens -> [K, V] one-hot q, the distribution of a deterministic drafter."""
    return torch.nn.functional.one_hot(tokens, vocab).to(torch.float32)


def leading_true(mask: torch.Tensor) -> int:
    """Length of the run of True at the start of a [K] bool tensor."""
    misses = (~mask).nonzero()
    return int(misses[0].item()) if misses.numel() else int(mask.shape[0])


def verify_tree(
    draft_tokens: list[int],
    parents: list[int],
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator,
) -> Verdict:
    """Verify a tree of deterministic drafts (q one-hot at every node).

    target_logits [M+1, V]: row 0 at the root, row i + 1 after node i. Greedy: follow the
    child that equals the target's argmax. Sampling: recursive rejection sampling over the
    siblings (SpecInfer, Miao et al. 2024): try each child x with probability p(x); after a
    rejection p <- norm(max(0, p - onehot(x))), so a sibling repeating a rejected token can
    never pass, and the recovered token comes from what is left. Lossless for any tree.
    """
    kids = children(parents)
    node, path = -1, []  # -1 is the root
    while True:
        row = target_logits[node + 1]  # [V]
        if params.greedy:
            choice = int(torch.argmax(row).item())
            nxt = next((c for c in kids[node + 1] if draft_tokens[c] == choice), None)
            if nxt is None:
                return Verdict(len(path), choice, bonus=not kids[node + 1], path=tuple(path))
        else:
            p = logits_to_probs(row, params)  # [V]
            nxt = None
            for child in kids[node + 1]:
                x = draft_tokens[child]
                if torch.rand((), generator=generator) < p[x]:
                    nxt = child
                    break
                p = p.clone()
                p[x] = 0.0  # max(0, p - onehot(x)), renormalised below
                total = p.sum()
                if total <= 0:  # cannot happen for a real distribution; guard against rounding
                    break
                p = p / total
            if nxt is None:
                return Verdict(len(path), sample(p, generator), bonus=not kids[node + 1], path=tuple(path))
        path.append(nxt)
        node = nxt
