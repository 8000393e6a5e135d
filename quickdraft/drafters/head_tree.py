"""Draft trees grown from a head's confidence (EAGLE-2, Li et al. 2024), shared by EAGLE and Medusa.

Expand: at each level, the top_k most confident nodes so far (by cumulative log-probability,
the chance the whole path is right) each get their top_k children. Rerank: of all nodes grown,
keep the `nodes` most confident for verification. A child is never more confident than its
parent, so the kept set is always a tree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from quickdraft.errors import QuickdraftError

# (frontier node indices, tokens so far, parents so far) -> [len(frontier), V'] log-probs of each
# frontier node's children.
Expand = Callable[[list[int], list[int], list[int]], torch.Tensor]


@dataclass(frozen=True)
class TreeShape:
    """depth: levels drafted (the method's K); top_k: children per expanded node and nodes expanded
    per level; nodes: draft tokens verified per pass after reranking."""

    depth: int
    top_k: int = 4
    nodes: int = 16

    def __post_init__(self) -> None:
        if self.depth < 1 or self.top_k < 1 or self.nodes < 1:
            raise QuickdraftError(f"tree depth, top_k and nodes must be >= 1; got {self.depth}, {self.top_k}, "
                                  f"{self.nodes}")


def grow_tree(first: torch.Tensor, expand: Expand, shape: TreeShape) -> tuple[list[int], list[int]]:
    """first [V'] log-probs of the root's children -> (tokens, parents) of the kept tree, tokens as
    indices into the head's vocabulary, parents before children."""
    tokens: list[int] = []
    parents: list[int] = []
    scores: list[float] = []
    values, ids = first.topk(min(shape.top_k, first.shape[-1]))
    frontier = []
    for value, token in zip(values.tolist(), ids.tolist()):
        frontier.append(len(tokens))
        tokens.append(token), parents.append(-1), scores.append(value)
    for _ in range(shape.depth - 1):
        logp = expand(frontier, tokens, parents)  # [F, V']
        child_values, child_ids = logp.topk(min(shape.top_k, logp.shape[-1]), dim=-1)  # [F, top_k]
        total = torch.tensor([scores[n] for n in frontier])[:, None] + child_values  # [F, top_k]
        grown = []
        for row, node in enumerate(frontier):
            for value, token in zip(total[row].tolist(), child_ids[row].tolist()):
                grown.append(len(tokens))
                tokens.append(token), parents.append(node), scores.append(value)
        frontier = sorted(grown, key=lambda n: -scores[n])[: shape.top_k]
    return keep_most_confident(tokens, parents, scores, shape.nodes)


def keep_most_confident(tokens: list[int], parents: list[int], scores: list[float],
                        nodes: int) -> tuple[list[int], list[int]]:
    """The `nodes` highest-scoring nodes (ties: the earlier node), renumbered in their old order.
    Ancestors score at least as high as their descendants and come first, so they are kept too."""
    kept = sorted(sorted(range(len(tokens)), key=lambda n: (-scores[n], n))[:nodes])
    new_index = {old: new for new, old in enumerate(kept)}
    return [tokens[n] for n in kept], [new_index[parents[n]] if parents[n] >= 0 else -1 for n in kept]
