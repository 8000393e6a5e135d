"""EAGLE (Li et al. 2024) with EAGLE-2's dynamic tree: a one-layer head runs ahead of the target
on the target's own hidden states, then on its own predictions, growing a tree of drafts.

The head keeps a KV cache of pairs (f_t, x_{t+1}) for every position the target has verified
(f_t: the target's state at t, x_{t+1}: the token that followed). Drafting first feeds the pairs
the last pass produced; its last output predicts the state after the newest token, whose top
tokens are the tree's first level. A node's own pair (its parent's predicted state, its token)
then predicts its children. Tree entries are dropped after each proposal: only pairs built
from the target's states stay in the cache.
"""

from __future__ import annotations

import torch

from quickdraft.drafters.base import Draft
from quickdraft.drafters.head_tree import TreeShape, draft_tree
from quickdraft.heads.eagle import EagleHead
from quickdraft.sampling import SamplingParams
from quickdraft.tree import ancestors


class EagleDrafter:
    needs_hidden = True

    def __init__(self, head: EagleHead, top_k: int = 4, nodes: int = 4, tree: str = "dynamic") -> None:
        self.head = head
        self.top_k, self.nodes, self.tree = top_k, nodes, tree
        TreeShape(1, top_k, nodes, tree)  # refuse bad settings now, not at the first step
        self.tokens: list[int] = []
        self.keys: torch.Tensor | None = None  # [1, KV, C, D]: the pairs at positions 0..C-1
        self.values: torch.Tensor | None = None
        self.pending: list[tuple[torch.Tensor, list[int]]] = []  # (f rows [m, H], the m tokens after them)
        self.state: torch.Tensor | None = None  # [H]: the head's prediction after the newest token

    @property
    def cached(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def begin(self, prompt_ids: list[int]) -> None:
        self.tokens = list(prompt_ids)
        self.keys = self.values = None
        self.pending = []
        self.state = None

    def observe_hidden(self, hidden: torch.Tensor) -> None:
        self.pending.append((hidden.float(), self.tokens[len(self.tokens) - hidden.shape[0] :]))

    def rollback(self, tokens: list[int]) -> None:
        self.tokens = list(tokens)  # the cache holds verified pairs only: nothing to drop

    def observe(self, aux_logits: torch.Tensor) -> None:
        pass

    @torch.inference_mode()
    def propose(self, tokens: list[int], k: int, sampling: SamplingParams, generator: torch.Generator) -> Draft:
        if self.pending:
            self.state = self._commit()
        if self.state is None or k < 1:  # no verified state yet (a one-token prompt)
            return Draft()
        state = self.state  # [H]: predicted state after the newest token
        root = self.cached  # pairs cached: positions 0..root-1; the newest token sits at `root`
        outputs: dict[int, torch.Tensor] = {}  # node -> predicted state after it
        fed: list[int] = []  # tree nodes whose keys follow the cache, in order
        tree_keys, tree_values = self.keys, self.values

        def expand(frontier: list[int], drafted: list[int], parents: list[int]) -> torch.Tensor:
            nonlocal tree_keys, tree_values
            b = len(frontier)
            states = torch.stack([state if parents[n] < 0 else outputs[parents[n]] for n in frontier])  # [F, H]
            ids = self.head.vocab[torch.tensor([drafted[n] for n in frontier])]  # [F]
            depth = len(ancestors(frontier[0], parents))
            positions = torch.full((b,), root + depth - 1)  # a node's pair sits where its parent's token does
            mask = torch.ones(b, tree_keys.shape[2] + b, dtype=torch.bool)  # [F, cached + fed + F]
            for row, node in enumerate(frontier):
                lineage = set(ancestors(node, parents))
                mask[row, root : root + len(fed)] = torch.tensor([n in lineage for n in fed], dtype=torch.bool)
                mask[row, root + len(fed) :] = False
                mask[row, root + len(fed) + row] = True
            out, k_new, v_new = self.head(states[None], ids[None], positions[None], mask[None],
                                          (tree_keys, tree_values))
            tree_keys, tree_values = torch.cat([tree_keys, k_new], 2), torch.cat([tree_values, v_new], 2)
            for row, node in enumerate(frontier):
                outputs[node] = out[0, row]
            fed.extend(frontier)
            return torch.log_softmax(self.head.logits(out[0]), dim=-1)  # [F, V']

        first = torch.log_softmax(self.head.logits(state), dim=-1)  # [V']
        ids, parents = draft_tree(first, expand, TreeShape(k, self.top_k, self.nodes, self.tree))
        return Draft(self.head.vocab[ids].tolist(), None, parents)

    def _commit(self) -> torch.Tensor:
        """Feed the pending verified pairs into the cache; the last output (predicted next state)."""
        hidden = torch.cat([h for h, _ in self.pending])  # [p, H]
        ids = torch.tensor([t for _, ts in self.pending for t in ts])  # [p]
        self.pending = []
        p, start = hidden.shape[0], self.cached
        positions = torch.arange(start, start + p)
        mask = torch.ones(p, start + p, dtype=torch.bool).tril(diagonal=start)  # [p, C + p] causal
        past = None if self.keys is None else (self.keys, self.values)
        out, k_new, v_new = self.head(hidden[None], ids[None], positions[None], mask[None], past)
        self.keys = k_new if self.keys is None else torch.cat([self.keys, k_new], 2)
        self.values = v_new if self.values is None else torch.cat([self.values, v_new], 2)
        return out[0, -1]
