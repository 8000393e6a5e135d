"""The rejection sampler: which draft tokens the target accepts, and the token it adds.

Pure functions: no model inside. Given a tree of draft tokens (a chain is the tree where every
node has one child), the distribution q each node was drawn from (None for deterministic
drafters, meaning one-hot q) and the target's logits at the root and at every node, return
the accepted path and the recovered or bonus token. One sampler serves chains and trees.

Worked example (greedy): draft [5, 9, 2], target argmax at the 4 positions [5, 9, 7, 3]
-> drafts 5 and 9 match, 2 != 7, so 2 tokens are accepted and 7 is the recovered token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from quickdraft.sampling import SamplingParams, gumbel_pick, logits_to_probs, sample
from quickdraft.tree import chain_parents, children


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
    gumbel: torch.Tensor | None = None,
) -> Verdict:
    """Verify a chain of drafts. draft_tokens [K], draft_probs [K, V] or None, target_logits [K+1, V],
    gumbel [K+1, V] or None (the noise at each row's next position, see verify_tree)."""
    k = draft_tokens.shape[0]
    assert target_logits.shape[0] == k + 1, "the target scores the last token plus every draft"
    return verify_tree(draft_tokens.tolist(), chain_parents(k), target_logits, params, generator, draft_probs, gumbel)


def verify_tree(
    draft_tokens: list[int],
    parents: list[int],
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator,
    draft_probs: torch.Tensor | None = None,
    gumbel: torch.Tensor | None = None,
) -> Verdict:
    """Verify a tree of drafts (see tree.py); target_logits [M+1, V]: row 0 at the root, row
    i + 1 after node i. draft_probs [M, V'] (V' <= V): the q each node was drawn from, siblings
    independently; None: every node deterministic (one-hot q).

    Greedy: follow the child that equals the target's argmax; emit the argmax where none does.
    Gumbel (sampling with gumbel [D+1, V]: the noise of the positions 1..D+1 past the root, see
    noise.py; a node at depth d predicts position d + 1): the target's pick at a row is
    argmax(log p + g), an exact sample of p fixed by the noise alone; then as greedy. The text is
    plain decoding's with the same noise, whatever was drafted.
    Sampling without gumbel: recursive rejection sampling over the siblings (SpecInfer, Miao et al. 2024; for
    a chain it is Leviathan et al. 2023): try child x with probability min(1, p(x)/q(x)); after
    a rejection p <- norm(max(0, p - q)), so a one-hot sibling repeating a rejected token can
    never pass; the recovered token comes from what is left of p. Lossless for any tree.
    """
    kids = children(parents)
    node, path = -1, []  # -1 is the root
    if params.greedy or gumbel is not None:
        pick = target_picks(target_logits, params, gumbel)
        while True:
            choice = pick(node + 1, len(path))
            nxt = next((c for c in kids[node + 1] if draft_tokens[c] == choice), None)
            if nxt is None:
                return Verdict(len(path), choice, bonus=not kids[node + 1], path=tuple(path))
            path.append(nxt)
            node = nxt
    target_logits = target_logits.float().cpu()  # sampling follows the CPU generator, on any device
    while True:
        p = logits_to_probs(target_logits[node + 1], params)  # [V]
        nxt = None
        for child in kids[node + 1]:
            x = draft_tokens[child]
            q = one_hot(x, p.shape[-1]) if draft_probs is None else padded(draft_probs[child], p.shape[-1])
            if torch.rand((), generator=generator, dtype=p.dtype) < acceptance(p[x], q[x]):
                nxt = child
                break
            p = residual_distribution(p, q)
        if nxt is None:
            return Verdict(len(path), sample(p, generator), bonus=not kids[node + 1], path=tuple(path))
        path.append(nxt)
        node = nxt


def target_picks(
    target_logits: torch.Tensor, params: SamplingParams, gumbel: torch.Tensor | None
) -> Callable[[int, int], int]:
    """(row, its depth) -> the target's token there: greedy's argmax, or argmax(log p + g) with the
    noise of that depth. Greedy reads every row from the device at once; Gumbel processes (top-k,
    top-p) only the rows the walk visits."""
    if params.greedy:
        picks = target_logits.argmax(-1).tolist()  # [M+1]
        return lambda row, depth: picks[row]
    rows = target_logits.float().cpu()  # [M+1, V]
    return lambda row, depth: gumbel_pick(logits_to_probs(rows[row], params), gumbel[depth])


def acceptance(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """min(1, p(x)/q(x)). q(x) = 0 cannot be drafted, so it only matters when p(x) = 0 too,
    and then x must be rejected."""
    return torch.where(q_x > 0, p_x / q_x.clamp_min(1e-30), (p_x > 0).to(p_x.dtype))


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


def one_hot(token: int, vocab: int) -> torch.Tensor:
    """[V] q of a deterministic drafter: all mass on the drafted token."""
    q = torch.zeros(vocab)
    q[token] = 1.0
    return q


def padded(q: torch.Tensor, vocab: int) -> torch.Tensor:
    """A draft with a smaller logit space [V'] puts no mass on the extra ids -> [V]."""
    return torch.nn.functional.pad(q, (0, vocab - q.shape[-1])) if q.shape[-1] < vocab else q
