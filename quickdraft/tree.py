"""Token trees as data: parent indices -> depths, ancestor paths and the attention mask.

A tree of M draft tokens hangs under the root (the newest accepted token). parents[i] is the
index of node i's parent, or -1 for a child of the root; parents come before children.
A chain is the tree parents = [-1, 0, 1, ..., M-2].

Worked example: parents [-1, 0, -1] is two branches: root -> a -> b, and root -> c.
Depths are [1, 2, 1]; node b attends to the root, a and itself; c to the root and itself.
"""

from __future__ import annotations

import torch


def chain_parents(m: int) -> list[int]:
    """The parents of a chain of m draft tokens."""
    return [i - 1 for i in range(m)]


def depths(parents: list[int]) -> list[int]:
    """Distance of each node from the root (children of the root have depth 1)."""
    result: list[int] = []
    for i, parent in enumerate(parents):
        assert parent < i, "parents must come before their children"
        result.append(1 if parent < 0 else result[parent] + 1)
    return result


def ancestors(node: int, parents: list[int]) -> list[int]:
    """The nodes from the root's child down to `node`, inclusive."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def tree_mask(parents: list[int]) -> torch.Tensor:
    """[M+1, M+1] bool: row/column 0 is the root; a node sees the root, its ancestors and itself."""
    m = len(parents)
    mask = torch.zeros(m + 1, m + 1, dtype=torch.bool)
    mask[:, 0] = True
    for i in range(m):
        mask[i + 1, [a + 1 for a in ancestors(i, parents)]] = True
    return mask


def children(parents: list[int]) -> list[list[int]]:
    """children[c + 1] lists the children of node c (children[0]: the root's), in index order."""
    result: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, parent in enumerate(parents):
        result[parent + 1].append(i)
    return result


def trie_from_paths(paths: list[list[int]]) -> tuple[list[int], list[int]]:
    """Merge token sequences that share prefixes into one tree -> (tokens, parents)."""
    tokens: list[int] = []
    parents: list[int] = []
    index: dict[tuple[int, int], int] = {}  # (parent, token) -> node
    for path in paths:
        parent = -1
        for token in path:
            key = (parent, token)
            if key not in index:
                index[key] = len(tokens)
                tokens.append(token)
                parents.append(parent)
            parent = index[key]
    return tokens, parents


def pass_layout(
    parents: list[int], aux_offsets: list[int], aux_mask: torch.Tensor | None
) -> tuple[torch.Tensor, list[int]]:
    """Mask [n, n] and position offsets [n] for one pass: root, tree nodes, then aux tokens.

    Aux tokens see the root and each other as aux_mask says, never the tree nodes.
    """
    m, a = len(parents), len(aux_offsets)
    mask = torch.zeros(1 + m + a, 1 + m + a, dtype=torch.bool)
    mask[: m + 1, : m + 1] = tree_mask(parents)
    if a:
        mask[m + 1 :, 0] = True
        mask[m + 1 :, m + 1 :] = aux_mask
    return mask, [0, *depths(parents), *aux_offsets]
