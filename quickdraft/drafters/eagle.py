"""EAGLE (Li et al. 2024) with EAGLE-2's dynamic tree: a small head (a decoder layer, or a few)
runs ahead of the target on the target's own hidden states, then on its own predictions,
growing a tree of drafts.

The head keeps a KV cache of pairs (f_t, x_{t+1}) for every position the target has verified
(f_t: the target's state at t, x_{t+1}: the token that followed). Drafting first feeds the pairs
the last pass produced; its last output predicts the state after the newest token, whose top
tokens are the tree's first level. A node's own pair (its parent's predicted state, its token)
then predicts its children. Tree entries are dropped after each proposal (a pointer move):
only pairs built from the target's states stay in the cache.

EAGLE-3 heads run the same way: their committed pairs hold the target's fused low, middle and
high layer features (the drafter's taps) instead of its last state, and a node's pair holds its
parent's output.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from quickdraft.backends.kv_cache import KVCache
from quickdraft.drafters.drafter import Draft, DraftRequest, SequenceDrafter, StepOutcome
from quickdraft.drafters.head_tree import TreeShape, chain_draft, draft_tree, head_cannot_pay, tilted
from quickdraft.drafters.lookup_branch import LookupBranch
from quickdraft.drafters.tree_record import TreeRecord
from quickdraft.heads.eagle3 import Eagle3Head
from quickdraft.heads.eagle_head import EagleHead
from quickdraft.tree import ancestors


@dataclass
class EagleState:
    """One sequence's head cache (verified pairs at positions 0..length-1) and what waits to go in."""

    cache: KVCache
    tokens: list[int]
    pending: list[tuple[torch.Tensor, list[int]]] = field(default_factory=list)  # (f rows [m, H], the m tokens after)
    predicted: torch.Tensor | None = None  # [H]: the head's prediction after the newest token
    record: TreeRecord = field(default_factory=TreeRecord)


class HeadCost:
    """What the head's drafting took a step (its pairs committed and its tree grown), in
    milliseconds: the median of the latest `window` steps that drafted (0 before any). The head
    rests where a tree of its nodes could not pay for this beside the rows it adds; it only
    changes drafts, never an output."""

    def __init__(self, window: int = 16) -> None:
        self.recent: deque[float] = deque(maxlen=window)

    @property
    def ms(self) -> float:
        return statistics.median(self.recent) if self.recent else 0.0

    def add(self, seconds: float) -> None:
        self.recent.append(seconds * 1e3)


class EagleDrafter(SequenceDrafter):
    needs_hidden = True

    def __init__(
        self,
        head: EagleHead | Eagle3Head,
        max_length: int,
        top_k: int = 4,
        nodes: int = 4,
        tree: str = "dynamic",
        pass_ms: dict[int, float] | None = None,
        branch: LookupBranch | None = None,
    ) -> None:
        self.head, self.max_length, self.branch = head, max_length, branch
        # EAGLE-3 reads the inputs of a low, a middle and a high target layer; EAGLE-1 the last state.
        self.taps = tuple(head.config.features) if isinstance(head, Eagle3Head) else ()
        self.top_k, self.nodes, self.tree = top_k, nodes, tree
        self.pass_ms = tuple(sorted((pass_ms or {}).items()))  # given: `nodes` is a cap, chosen per step
        self.cost = HeadCost()  # shared by the sequences: the same head, the same machine
        TreeShape(1, top_k, nodes, tree)  # refuse bad settings now, not at the first step

    def begin(self, prompt_ids: list[int], hidden: torch.Tensor | None) -> EagleState:
        state = EagleState(self.head.new_cache(self.max_length), list(prompt_ids))
        self._receive(state, hidden)
        return state

    def update(self, state: EagleState, outcome: StepOutcome) -> None:
        state.tokens = list(outcome.tokens)  # the cache holds verified pairs only: nothing to drop
        state.record.learn(outcome.path)
        self._receive(state, outcome.hidden)

    def _receive(self, state: EagleState, hidden: torch.Tensor | None) -> None:
        """Rows [m, H] where the target predicted the sequence's last m tokens: pairs to commit."""
        if hidden is not None and hidden.shape[0]:
            state.pending.append((hidden.float(), state.tokens[len(state.tokens) - hidden.shape[0] :]))

    @torch.inference_mode()
    def draft(self, request: DraftRequest) -> Draft:
        state, k = request.state, request.k
        record = state.record
        branch = (
            None if self.branch is None or k < 1 else self.branch.propose(record, request.tokens, request.reach or k)
        )
        if self.pass_ms and k >= 1 and not record.may_rest():
            record.checks()
        elif self.pass_ms and k >= 1:  # the head drafts where one of its nodes could pay
            chain, scores = branch or ([], [])
            alone = head_cannot_pay(
                scores, record.head_scale, self.nodes, dict(self.pass_ms), self.cost.ms, record.head_measured()
            )
            if alone is not None:  # its pending pairs wait for the next step that drafts
                record.latest = chain_draft(chain, alone)
                record.rested()
                return Draft(chain[:alone], None, record.latest.parents) if alone else Draft()
            record.pays()
        record.idle = 0
        started = time.perf_counter()
        if state.pending:
            state.predicted = self._commit(state)
        if state.predicted is None or k < 1:  # no verified state yet (a one-token prompt)
            return Draft()
        cache, device = state.cache, state.cache.device
        root = cache.length  # pairs cached: positions 0..root-1; the newest token sits at `root`
        ahead = len(request.tokens)  # the position of the tree's first level

        def guesses(logits: torch.Tensor, depth: int) -> torch.Tensor:  # [..., V'] log-probs at level depth + 1
            noise = None if request.noise is None else request.noise.row(ahead + depth)
            return tilted(logits, self.head.vocab, request.sampling, noise)

        outputs: dict[int, torch.Tensor] = {}  # node -> predicted state after it
        fed: list[int] = []  # tree nodes whose keys follow the committed pairs, in order

        def expand(frontier: list[int], drafted: list[int], parents: list[int]) -> torch.Tensor:
            b = len(frontier)
            states = torch.stack([state.predicted if parents[n] < 0 else outputs[parents[n]] for n in frontier])
            ids = self.head.vocab[torch.tensor([drafted[n] for n in frontier], device=device)]  # [F]
            depth = len(ancestors(frontier[0], parents))
            positions = torch.full(
                (b,), root + depth - 1, device=device
            )  # a node's pair sits where its parent's token does
            mask = torch.ones(b, cache.length + b, dtype=torch.bool)  # [F, committed + fed + F]
            for row, node in enumerate(frontier):
                lineage = set(ancestors(node, parents))
                mask[row, root : root + len(fed)] = torch.tensor([n in lineage for n in fed], dtype=torch.bool)
                mask[row, root + len(fed) :] = False
                mask[row, root + len(fed) + row] = True
            out = self.head(states[None], ids[None], positions[None], mask[None].to(device), cache)[0]  # [F, H]
            cache.advance(b)
            for row, node in enumerate(frontier):
                outputs[node] = out[row]
            fed.extend(frontier)
            return guesses(self.head.logits(out), depth)  # [F, V']: the children, one level deeper

        first = guesses(self.head.logits(state.predicted), 0)  # [V']
        try:
            shape = TreeShape(k, self.top_k, self.nodes, self.tree, self.pass_ms, record.head_scale)
            record.latest = draft_tree(first, expand, shape, self.head.vocab, branch)
        finally:
            cache.truncate(root)  # the tree's entries go: only verified pairs stay
            self.cost.add(time.perf_counter() - started)
        tree = record.latest
        return Draft(tree.tokens, None, tree.parents) if tree.tokens else Draft()  # none: drafting does not pay

    def _commit(self, state: EagleState) -> torch.Tensor:
        """Feed the pending verified pairs into the cache; the last output (predicted next state)."""
        cache = state.cache
        device = cache.device
        hidden = torch.cat([h for h, _ in state.pending]).to(device)  # [p, H]
        ids = torch.tensor([t for _, ts in state.pending for t in ts], device=device)  # [p]
        state.pending = []
        p, start = hidden.shape[0], cache.length
        positions = torch.arange(start, start + p, device=device)
        mask = torch.ones(p, start + p, dtype=torch.bool, device=device).tril(diagonal=start)  # [p, C + p] causal
        out = self.head(hidden[None], ids[None], positions[None], mask[None], cache)
        cache.advance(p)
        return out[0, -1]
