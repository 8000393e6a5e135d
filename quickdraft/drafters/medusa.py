"""Medusa (Cai et al. 2024): heads on the target's last hidden state guess the tokens 2, 3, ...
positions ahead at once; their top guesses form a tree that the target verifies in one pass."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from quickdraft.drafters.drafter import Draft, DraftRequest, SequenceDrafter, StepOutcome
from quickdraft.drafters.head_tree import TreeShape, draft_tree, tilted
from quickdraft.drafters.lookup_branch import LookupBranch
from quickdraft.drafters.tree_record import TreeRecord
from quickdraft.heads.medusa_heads import MedusaHeads
from quickdraft.tree import ancestors


@dataclass
class MedusaState:
    hidden: torch.Tensor | None = None  # [H]: where the target predicted the newest token
    record: TreeRecord = field(default_factory=TreeRecord)


class MedusaDrafter(SequenceDrafter):
    """Head k, read at the state where the target predicted the newest token, guesses the token
    k + 1 places after it. The heads see no draft tokens, so each level's guesses are the same
    under every node; the tree keeps the paths whose guesses are jointly most likely. The heads
    run once for every sequence of a step."""

    needs_hidden = True

    def __init__(
        self,
        heads: MedusaHeads,
        top_k: int = 4,
        nodes: int = 4,
        tree: str = "dynamic",
        pass_ms: dict[int, float] | None = None,
        branch: LookupBranch | None = None,
    ) -> None:
        self.heads, self.branch = heads, branch
        self.top_k, self.nodes, self.tree = top_k, nodes, tree
        self.pass_ms = tuple(sorted((pass_ms or {}).items()))  # given: `nodes` is a cap, chosen per step
        TreeShape(1, top_k, nodes, tree)  # refuse bad settings now, not at the first step

    def begin(self, prompt_ids: list[int], hidden: torch.Tensor | None) -> MedusaState:
        return MedusaState(None if hidden is None or not hidden.shape[0] else hidden[-1].float())

    def update(self, state: MedusaState, outcome: StepOutcome) -> None:
        state.hidden = outcome.hidden[-1].float()
        state.record.learn(outcome.path)

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest]) -> list[Draft]:
        ready = [i for i, r in enumerate(requests) if r.k >= 1 and r.state.hidden is not None]
        drafts = [Draft() for _ in requests]
        if not ready:
            return drafts
        states = torch.stack([requests[i].state.hidden for i in ready])  # [B, H]
        logits = self.heads(states)  # [heads, B, V']
        for row, i in enumerate(ready):
            r = requests[i]
            ahead = range(len(r.tokens), len(r.tokens) + self.heads.heads)  # the positions head 0, 1, ... guess
            noise = None if r.noise is None else r.noise.rows(list(ahead))  # [heads, V]
            drafts[i] = self._tree(tilted(logits[:, row], self.heads.vocab, r.sampling, noise), r)
        return drafts

    def _tree(self, logp: torch.Tensor, request: DraftRequest) -> Draft:
        """logp [heads, V'] of one sequence -> its tree of guesses."""
        k, record = request.k, request.state.record
        shape = TreeShape(min(k, self.heads.heads), self.top_k, self.nodes, self.tree, self.pass_ms, record.head_scale)

        def expand(frontier: list[int], drafted: list[int], parents: list[int]) -> torch.Tensor:
            depth = len(ancestors(frontier[0], parents))  # the frontier is one level
            return logp[depth].expand(len(frontier), -1)  # [F, V']: head `depth` guesses one level deeper

        branch = None if self.branch is None else self.branch.propose(record, request.tokens, request.reach or k)
        record.latest = tree = draft_tree(logp[0], expand, shape, self.heads.vocab, branch)
        return Draft(tree.tokens, None, tree.parents) if tree.tokens else Draft()  # none: drafting does not pay
