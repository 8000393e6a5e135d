"""Draft trees from a head's guesses, shared by EAGLE and Medusa.

Dynamic (EAGLE-2, Li et al. 2024): at each level, the top_k most confident nodes so far (by
cumulative log-probability, the chance the whole path is right) each get their top_k children.
Rerank: of all nodes grown, keep the `nodes` most confident for verification. A child is never
more confident than its parent, so the kept set is always a tree, and a frontier node already
outside the best `nodes` is not expanded (its descendants could not be kept): the same tree for
fewer head rows, which matters when `nodes` is small (CPUs). Given the target's measured pass
costs, the kept count is chosen each step: the most expected tokens per millisecond; then a
frontier node is not expanded either when nodes as confident as it could not pay for their rows.

Static (EAGLE-1, Medusa): the same rule applied once to a fixed prior over sibling ranks instead
of the head's confidence gives a fixed shape (which ranks under which); drafting fills it with
the head's candidates at those ranks, whatever their confidence.

Branches: another drafter's chain (prompt lookup's copy of earlier text) can join the tree with
its own confidence; the head's best nodes and the chain's compete for the same measured rows.

Sampling by Gumbel-max: the target's pick at a position is argmax(log p + g) for noise g fixed
by the seed and the position, so a head grows its tree from its distribution tilted by the same
noise (`tilted`): its likeliest guess is the target's pick wherever the head's q is the target's p.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from quickdraft.analysis import best_tree_size, best_tree_value, drafting_pays
from quickdraft.errors import QuickdraftError
from quickdraft.sampling import SamplingParams, logits_to_probs
from quickdraft.tree import depths

# (frontier node indices, tokens so far, parents so far) -> [len(frontier), V'] log-probs of each
# frontier node's children.
Expand = Callable[[list[int], list[int], list[int]], torch.Tensor]
DEFAULT_TOP_K = 4  # children per node of a small tree (SGLang's default; Medusa's, always)


@dataclass(frozen=True)
class TreeShape:
    """depth: levels drafted (the method's K); top_k: children per expanded node and nodes expanded
    per level; nodes: draft tokens verified per pass after reranking (at most, with pass_ms);
    kind: dynamic or static. pass_ms: the target's measured pass costs (rows, ms), given when the
    size is the budget's: a dynamic tree then keeps the best-paying number of nodes each step.
    scale: the log of how far the head's confidence has proved right for this sequence (<= 0),
    added to each of its nodes' scores before sizing."""

    depth: int
    top_k: int = DEFAULT_TOP_K
    nodes: int = 4
    kind: str = "dynamic"
    pass_ms: tuple[tuple[int, float], ...] = ()
    scale: float = 0.0

    def __post_init__(self) -> None:
        if self.depth < 1 or self.top_k < 1 or self.nodes < 1:
            raise QuickdraftError(
                f"tree depth, top_k and nodes must be >= 1; got {self.depth}, {self.top_k}, {self.nodes}"
            )
        if self.kind not in TREE_KINDS:
            raise QuickdraftError(f"unknown tree {self.kind!r}; choose one of: {', '.join(TREE_KINDS)}")


def tilted(
    logits: torch.Tensor, vocab: torch.Tensor, sampling: SamplingParams, noise: torch.Tensor | None
) -> torch.Tensor:
    """[..., V'] a head's logits over its draft vocabulary (target ids `vocab` [V']) -> the log-probs
    its tree grows from. noise None (greedy, or rejection sampling): the head's own distribution.
    noise [..., V] (Gumbel-max sampling: the target's noise at the positions guessed): the
    distribution the user asked for (temperature, top-k, top-p) times exp(noise), renormalised,
    so the order of its guesses is that of log q + g and the first is the target's pick
    wherever q is p."""
    if noise is None:
        return torch.log_softmax(logits.float(), dim=-1)
    g = noise.to(logits.device)[..., vocab.to(logits.device)]  # [..., V'] the noise of each draft id's target id
    return torch.log_softmax(logits_to_probs(logits, sampling).log() + g, dim=-1)


def tree_shape_for(nodes: int) -> tuple[int, int]:
    """(depth, top_k) of an EAGLE tree of `nodes` draft tokens where the user names neither.
    Measured with the shipped EAGLE-3 head on Spec-Bench (docs/bench/heads.md, "Trees as wide as
    their budget"): at 64 nodes, depth 8 with 16 children drafts 3.11 tokens per pass against 2.92
    at depth 5 with 4; at 4 nodes the width makes no difference."""
    depth = min(8, max(5, round(math.log2(nodes)) + 2))  # about one level more per doubling of nodes
    top_k = min(16, max(DEFAULT_TOP_K, round(2 * math.sqrt(nodes))))  # wider as the tree's budget grows
    return depth, top_k


TREE_KINDS = ("dynamic", "static")
# The static shape's prior: how often the head's sibling of each rank is the target's choice
# (a fixed guess, the same at every depth; only the order it implies matters).
RANK_PRIOR = torch.tensor([0.6, 0.15, 0.07, 0.04, 0.03, 0.02, 0.015, 0.01]).log()


@dataclass
class TreeDraft:
    """A drafted tree in target ids, parents before children. head: each node's probability that
    its path is right by the head (calibrated; 0 for a node only the branch proposed); chain: the
    branch's nodes in the tree, root to leaf (a prefix of its chain: sizing may cut the rest)."""

    tokens: list[int]
    parents: list[int]
    head: list[float]
    chain: list[int]


def draft_tree(
    first: torch.Tensor,
    expand: Expand,
    shape: TreeShape,
    vocab: torch.Tensor,
    branch: tuple[list[int], list[float]] | None = None,
) -> TreeDraft:
    """The tree of `shape.kind`. vocab [V'] maps the head's vocabulary to the target's. branch:
    another drafter's chain (target ids) and the log of each node's chance that its path is
    right, merged in to compete with the head's nodes."""
    grow = grow_tree if shape.kind == "dynamic" else fill_static_tree
    ids, parents, scores = keep_most_confident(*grow(first, expand, shape), shape.nodes)
    tokens = vocab[torch.tensor(ids, dtype=torch.long, device=vocab.device)].tolist()
    scores = [s + shape.scale for s in scores]
    head, chain = list(scores), []
    if branch is not None and branch[0]:
        tokens, parents, scores, chain = merge_chain(tokens, parents, scores, *branch)
        head += [-math.inf] * (len(tokens) - len(head))
    nodes = shape.nodes if branch is not None else len(tokens)
    if shape.pass_ms:  # each node's confidence against what verifying it costs
        nodes = best_tree_size([math.exp(s) for s in sorted(scores, reverse=True)], dict(shape.pass_ms))
    kept = most_confident(scores, nodes)
    new_index = {old: new for new, old in enumerate(kept)}
    return TreeDraft(
        [tokens[n] for n in kept],
        renumbered(parents, kept),
        [math.exp(head[n]) for n in kept],
        [new_index[n] for n in chain if n in new_index],
    )


def head_cannot_pay(
    chain_scores: list[float],
    head_bound: float,
    nodes: int,
    pass_ms: dict[int, float],
    head_ms: float = 0.0,
    measured: tuple[float, float] | None = None,
) -> int | None:
    """The branch nodes to verify when no tree with the head's nodes can pay for their rows and for
    drafting them (head_ms, the head's measured step), whatever the head would say (each of its
    `nodes` scores at most head_bound, a log), or when its trees so far did not (measured: the
    head nodes accepted and verified per step that drafted them): then the head need not draft at
    all. None: a tree with head nodes might be worth more tokens per millisecond, so draft it."""
    chain = [math.exp(s) for s in chain_scores]
    alone = best_tree_size(chain, pass_ms)
    if measured is not None and not drafting_pays(*measured, head_ms, pass_ms):
        return alone
    bounded = sorted([*chain, *[math.exp(head_bound)] * nodes], reverse=True)
    with_head = best_tree_value(bounded, pass_ms, head_ms)
    return alone if with_head <= best_tree_value(chain[:alone], pass_ms) else None


def kept_without(scores: list[float], bound: float, copies: int, pass_ms: dict[int, float]) -> int | None:
    """The size of the best tree (by pass_ms) over `scores` and `copies` more nodes scoring `bound`
    (logs), when it holds none of those copies; None when it holds one. Nodes scoring at most
    the bound can then not enter the best tree either: with every one at the bound the best
    tree can only be worth more, and it chose a prefix of nodes above them."""
    bounded = sorted([*scores, *[bound] * copies], reverse=True)
    n = best_tree_size([math.exp(s) for s in bounded], pass_ms)
    return n if n <= sum(1 for s in scores if s > bound) else None


def chain_draft(chain: list[int], n: int) -> TreeDraft:
    """The first n tokens of a branch chain, alone, as a tree."""
    return TreeDraft(chain[:n], list(range(-1, n - 1)), [0.0] * n, list(range(n)))


def merge_chain(
    tokens: list[int], parents: list[int], scores: list[float], chain: list[int], chain_scores: list[float]
) -> tuple[list[int], list[int], list[float], list[int]]:
    """The tree with a chain of tokens hung under its root -> (tokens, parents, scores, the chain's
    nodes). Where the chain follows the tree's nodes it shares them (a shared node keeps the
    higher score), then it grows new nodes. Both kinds of score fall along a path, so the merged
    scores do too."""
    tokens, parents, scores = list(tokens), list(parents), list(scores)
    node, nodes = -1, []
    for token, score in zip(chain, chain_scores):
        child = next((n for n in range(len(tokens)) if parents[n] == node and tokens[n] == token), None)
        if child is None:
            child = len(tokens)
            tokens.append(token), parents.append(node), scores.append(score)
        else:
            scores[child] = max(scores[child], score)
        node = child
        nodes.append(child)
    return tokens, parents, scores, nodes


def static_shape(shape: TreeShape) -> tuple[list[int], list[int]]:
    """(sibling rank of each node, parents): the dynamic rule over RANK_PRIOR, `shape.nodes` of them."""
    prior = RANK_PRIOR[: shape.top_k]
    ranks, parents, scores = grow_tree(prior, lambda frontier, tokens, parents: prior.expand(len(frontier), -1), shape)
    return keep_most_confident(ranks, parents, scores, shape.nodes)[:2]


def fill_static_tree(first: torch.Tensor, expand: Expand, shape: TreeShape) -> tuple[list[int], list[int], list[float]]:
    """The static shape, each node the head's candidate of its rank under its parent -> (tokens,
    parents, the prior's score of each node's place in the shape)."""
    ranks, parents = static_shape(shape)
    level = depths(parents)
    tokens = [-1] * len(ranks)
    for node in (n for n in range(len(ranks)) if parents[n] < 0):
        tokens[node] = int(first.topk(ranks[node] + 1).indices[ranks[node]])
    for depth in range(1, max(level, default=0)):
        # Nodes come level by level: every node up to this level has its token.
        known = sum(1 for d in level if d <= depth)
        frontier = sorted({parents[n] for n in range(len(ranks)) if level[n] == depth + 1})
        logp = expand(frontier, tokens[:known], parents[:known])  # [F, V']
        for row, parent in enumerate(frontier):
            order = logp[row].topk(shape.top_k).indices
            for child in (n for n in range(len(ranks)) if parents[n] == parent):
                tokens[child] = int(order[ranks[child]])
    return tokens, parents, path_scores(ranks, parents)


def path_scores(ranks: list[int], parents: list[int]) -> list[float]:
    """Each node's log-prior: the sum of RANK_PRIOR over the ranks on its path."""
    scores: list[float] = []
    for rank, parent in zip(ranks, parents):
        scores.append(float(RANK_PRIOR[rank]) + (scores[parent] if parent >= 0 else 0.0))
    return scores


def grow_tree(first: torch.Tensor, expand: Expand, shape: TreeShape) -> tuple[list[int], list[int], list[float]]:
    """first [V'] log-probs of the root's children -> (tokens, parents, scores) of every node grown
    (keep the best `shape.nodes` of them), tokens as indices into the head's vocabulary, parents
    before children, scores the log of each path's confidence."""
    tokens: list[int] = []
    parents: list[int] = []
    scores: list[float] = []
    values, ids = first.topk(min(shape.top_k, first.shape[-1]))
    frontier = []
    for value, token in zip(values.tolist(), ids.tolist()):
        frontier.append(len(tokens))
        tokens.append(token), parents.append(-1), scores.append(value)
    for _ in range(shape.depth - 1):
        # A child scores at most its parent, and comes after every node grown so far: a frontier
        # node scoring no more than the `nodes`-th best so far can have no kept descendant.
        if len(scores) >= shape.nodes:
            floor = sorted(scores, reverse=True)[shape.nodes - 1]
            frontier = [n for n in frontier if scores[n] > floor]
        if shape.pass_ms:  # nor is one whose descendants could not pay for their rows
            frontier = [n for n in frontier if descendants_could_pay(scores, scores[n], shape)]
        if not frontier:
            break
        logp = expand(frontier, tokens, parents)  # [F, V']
        child_values, child_ids = logp.topk(min(shape.top_k, logp.shape[-1]), dim=-1)  # [F, top_k]
        total = torch.tensor([scores[n] for n in frontier])[:, None] + child_values  # [F, top_k]
        grown = []
        for row, node in enumerate(frontier):
            for value, token in zip(total[row].tolist(), child_ids[row].tolist()):
                grown.append(len(tokens))
                tokens.append(token), parents.append(node), scores.append(value)
        frontier = sorted(grown, key=lambda n: -scores[n])[: shape.top_k]
    return tokens, parents, scores


def descendants_could_pay(scores: list[float], bound: float, shape: TreeShape) -> bool:
    """Whether `shape.nodes` nodes scoring at most `bound` could be among those a tree sized by
    shape.pass_ms keeps, beside the best `shape.nodes` grown so far (`scores`, before the head's
    scale)."""
    best = [s + shape.scale for s in sorted(scores, reverse=True)[: shape.nodes]]
    return kept_without(best, bound + shape.scale, shape.nodes, dict(shape.pass_ms)) is None


def keep_most_confident(
    tokens: list[int], parents: list[int], scores: list[float], nodes: int
) -> tuple[list[int], list[int], list[float]]:
    """The `nodes` highest-scoring nodes (ties: the earlier node), renumbered in their old order.
    Ancestors score at least as high as their descendants and come first, so they are kept too."""
    kept = most_confident(scores, nodes)
    return [tokens[n] for n in kept], renumbered(parents, kept), [scores[n] for n in kept]


def most_confident(scores: list[float], nodes: int) -> list[int]:
    """The indices of the `nodes` highest scores (ties: the earlier node), in their old order."""
    return sorted(sorted(range(len(scores)), key=lambda n: (-scores[n], n))[:nodes])


def renumbered(parents: list[int], kept: list[int]) -> list[int]:
    """The parents of the `kept` nodes (each kept with its ancestors), as indices among them."""
    new_index = {old: new for new, old in enumerate(kept)}
    return [new_index[parents[n]] if parents[n] >= 0 else -1 for n in kept]
