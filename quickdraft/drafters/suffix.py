"""Suffix decoding (SuffixDecoding, arXiv 2411.04975): drafts from everything already written.

Two stores are matched each step: the sequence's own prompt and output so far, and the finished
outputs of earlier sequences of the same tenant (the server's API key). From the longest suffix of
the text that occurred before, a tree of what followed grows best first by how often each
continuation did, stopped by a least chance and by a budget proportional to the match's length:
long where the pattern is sure, nothing where it is not. The better tree of the two stores by
expected accepted tokens is drafted, cut to the nodes worth their rows at the target's measured
pass costs. No model; q is one-hot, so verification accepts a node with the target's p.

Tenants never draft from each other's outputs: how fast a request runs would tell what others
were sent. The pools live in one SuffixPools that every copy of a drafter for a tenant shares.
"""

from __future__ import annotations

from dataclasses import dataclass

from quickdraft.analysis import MOST_TREE_NODES, best_tree_size
from quickdraft.drafters.drafter import Draft, DraftRequest, SequenceDrafter, StepOutcome
from quickdraft.drafters.suffix_store import Continuations, SuffixStore


class SuffixPools:
    """Each tenant's store of earlier sequences (None: the tenant of a caller that names none), each
    holding at most `capacity` tokens; prompts: keep prompts beside outputs."""

    def __init__(self, capacity: int, prompts: bool = False) -> None:
        self.capacity = capacity
        self.prompts = prompts
        self._stores: dict[str | None, SuffixStore] = {}

    def store(self, tenant: str | None) -> SuffixStore:
        if tenant not in self._stores:
            self._stores[tenant] = SuffixStore(self.capacity)
        return self._stores[tenant]

    @property
    def tokens_held(self) -> int:
        return sum(store.tokens_held for store in self._stores.values())

    @property
    def nbytes(self) -> int:
        return sum(store.nbytes for store in self._stores.values())

    @property
    def tenants(self) -> int:
        return len(self._stores)


@dataclass
class SuffixState:
    """One sequence: its own text (prompt and accepted tokens) and its prompt's length."""

    own: SuffixStore
    prompt_length: int
    known: int  # tokens of the sequence in `own`


class SuffixDrafter(SequenceDrafter):
    """longest: the longest suffix matched; factor: nodes per matched token; least: a node's least
    estimated chance; pass_ms: the target's measured pass costs (None: trees as the budget allows)."""

    def __init__(
        self,
        longest: int,
        factor: float,
        least: float,
        pools: SuffixPools,
        pass_ms: dict[int, float] | None = None,
        tenant: str | None = None,
    ) -> None:
        self.longest, self.factor, self.least = longest, factor, least
        self.pools, self.tenant = pools, tenant
        self.pass_ms = dict(pass_ms) if pass_ms else None

    def for_tenant(self, tenant: str | None) -> SuffixDrafter:
        """This drafter drafting from (and adding to) `tenant`'s earlier sequences only."""
        if tenant == self.tenant:
            return self
        return SuffixDrafter(self.longest, self.factor, self.least, self.pools, self.pass_ms, tenant)

    def begin(self, prompt_ids: list[int], hidden=None) -> SuffixState:
        own = SuffixStore()
        own.extend(prompt_ids)
        return SuffixState(own, len(prompt_ids), len(prompt_ids))

    def draft(self, request: DraftRequest) -> Draft:
        state: SuffixState = request.state
        self._catch_up(state, request.tokens)
        depth = request.k if request.reach is None else min(request.k, request.reach)
        if depth < 1:
            return Draft()
        context = request.tokens[-self.longest :]
        most = min(MOST_TREE_NODES, max(self.pass_ms) - 1) if self.pass_ms else MOST_TREE_NODES
        trees = [
            store.speculate(context, self.longest, self.factor, most, depth, self.least)
            for store in self._stores(state)
        ]
        best = max(trees, key=lambda tree: tree.score, default=Continuations())
        n = best_tree_size(best.probs, self.pass_ms) if self.pass_ms else len(best.tokens)
        return Draft(best.tokens[:n], None, best.parents[:n]) if n else Draft()

    def update(self, state: SuffixState, outcome: StepOutcome) -> None:
        self._catch_up(state, outcome.tokens)

    def finish(self, state: SuffixState, tokens: list[int]) -> None:
        """The sequence ended: its output (and with prompts, its prompt) joins the tenant's pool."""
        if self.pools.capacity == 0:
            return
        shared = self.pools.store(self.tenant)
        if self.pools.prompts:
            shared.add(tokens[: state.prompt_length])
        shared.add(tokens[state.prompt_length :])

    def _stores(self, state: SuffixState) -> list[SuffixStore]:
        return [state.own] if self.pools.capacity == 0 else [state.own, self.pools.store(self.tenant)]

    @staticmethod
    def _catch_up(state: SuffixState, tokens: list[int]) -> None:
        if len(tokens) > state.known:
            state.own.extend(tokens[state.known :])
            state.known = len(tokens)
