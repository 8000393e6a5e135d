"""Medusa (Cai et al. 2024): heads on the target's last hidden state guess the tokens 2, 3, ...
positions ahead at once; their top guesses form a tree that the target verifies in one pass."""

from __future__ import annotations

import torch

from quickdraft.drafters.base import Draft
from quickdraft.drafters.head_tree import TreeShape, draft_tree
from quickdraft.heads.medusa import MedusaHeads
from quickdraft.sampling import SamplingParams
from quickdraft.tree import ancestors


class MedusaDrafter:
    """Head k, read at the state where the target predicted the newest token, guesses the token
    k + 1 places after it. The heads see no draft tokens, so each level's guesses are the same
    under every node; the tree keeps the paths whose guesses are jointly most likely."""

    needs_hidden = True

    def __init__(self, heads: MedusaHeads, top_k: int = 4, nodes: int = 4, tree: str = "dynamic") -> None:
        self.heads = heads
        self.top_k, self.nodes, self.tree = top_k, nodes, tree
        TreeShape(1, top_k, nodes, tree)  # refuse bad settings now, not at the first step
        self.state: torch.Tensor | None = None  # [H]: where the target predicted the newest token

    def begin(self, prompt_ids: list[int]) -> None:
        self.state = None

    def observe_hidden(self, hidden: torch.Tensor) -> None:
        self.state = hidden[-1].float()

    @torch.inference_mode()
    def propose(self, tokens: list[int], k: int, sampling: SamplingParams, generator: torch.Generator) -> Draft:
        if k < 1 or self.state is None:
            return Draft()
        logp = torch.log_softmax(self.heads(self.state), dim=-1)  # [heads, V']
        shape = TreeShape(min(k, self.heads.heads), self.top_k, self.nodes, self.tree)

        def expand(frontier: list[int], drafted: list[int], parents: list[int]) -> torch.Tensor:
            depth = len(ancestors(frontier[0], parents))  # the frontier is one level
            return logp[depth].expand(len(frontier), -1)  # [F, V']: head `depth` guesses one level deeper

        ids, parents = draft_tree(logp[0], expand, shape)
        return Draft(self.heads.vocab[ids].tolist(), None, parents)

    def rollback(self, tokens: list[int]) -> None:
        pass

    def observe(self, aux_logits: torch.Tensor) -> None:
        pass

