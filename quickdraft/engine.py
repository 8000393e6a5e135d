"""The loop: propose -> verify -> accept -> roll back -> emit. One loop for every method.

A Generation holds one sequence. The target's KV cache always holds every token but the
last one; each step feeds that last token plus the K drafts in one target pass, so the
logits at K + 1 positions score every draft and give the token after them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from quickdraft.draft_length import DraftLength
from quickdraft.drafters.base import Draft, Drafter
from quickdraft.models.runner import Runner
from quickdraft.sampling import SamplingParams
from quickdraft.stats import Stats, StepRecord
from quickdraft.tree import chain_parents, depths, pass_layout
from quickdraft.verify import Verdict, verify_tree

StopCheck = Callable[[list[int]], bool]  # new token ids -> True when a stop string appeared


@dataclass
class PassPlan:
    """A drafted step waiting for its target pass: what to feed and how to read the logits."""

    k: int  # draft tokens asked for
    root: int  # position (and cache slot) of the newest token, fed first
    draft: Draft
    inputs: list[int]  # [newest token, draft tokens..., aux tokens...]
    positions: list[int] | None  # explicit positions for trees and aux tokens (None: consecutive)
    mask: torch.Tensor | None  # [n, cached + n] for trees and aux tokens (None: causal)
    parents: list[int] | None  # the draft as a tree (chains with aux tokens too); None: a plain chain
    started: float
    drafted: float


class Generation:
    """One sequence being decoded. Call step() until done; read tokens and stats."""

    def __init__(
        self,
        target: Runner,
        drafter: Drafter,
        prompt_ids: list[int],
        *,
        draft_length: DraftLength,
        max_new_tokens: int,
        sampling: SamplingParams,
        generator: torch.Generator,
        eos_ids: frozenset[int] = frozenset(),
        stop_check: StopCheck | None = None,
    ) -> None:
        self.target = target
        self.drafter = drafter
        self.draft_length = draft_length
        self.max_new_tokens = max_new_tokens
        self.sampling = sampling
        self.generator = generator
        self.eos_ids = eos_ids
        self.stop_check = stop_check
        self.tokens = list(prompt_ids)  # prompt + accepted tokens
        self.prompt_length = len(prompt_ids)
        self.steps: list[StepRecord] = []
        self.stats = Stats(prompt_tokens=len(prompt_ids))
        self.finish_reason: str | None = None
        self._started = time.perf_counter()
        self._prefill()

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def new_tokens(self) -> list[int]:
        return self.tokens[self.prompt_length :]

    def _prefill(self) -> None:
        # Everything but the last prompt token goes into the caches; the first step feeds it.
        start = time.perf_counter()
        self.target.reset()
        if self.prompt_length > 1:
            self.target.forward(self.tokens[:-1], all_logits=False)
        self.drafter.begin(self.tokens)
        if self.drafter.needs_hidden and self.prompt_length > 1:
            self.drafter.observe_hidden(self.target.hidden)  # [prompt - 1, H]
        self.stats.prefill_time = time.perf_counter() - start

    def step(self) -> StepRecord:
        """One target pass; returns what it did."""
        plan = self.plan()
        return self.complete(plan, self.target.forward(plan.inputs, positions=plan.positions, mask=plan.mask))

    def plan(self) -> PassPlan:
        """Draft, and lay out the target pass that verifies the draft (run it, then complete())."""
        assert not self.done, "generation already finished"
        remaining = self.max_new_tokens - len(self.new_tokens)
        room = self.target.max_length - len(self.tokens)  # cache slots left after the last token
        # Drafts past the end of the output can never be used; the target pass yields one more.
        k = max(0, min(self.draft_length.next_k(), remaining - 1, room))
        root = len(self.tokens) - 1  # the newest token: its position and its cache slot
        start = time.perf_counter()
        draft = self.drafter.propose(self.tokens, k, self.sampling, self.generator).fitted(room)
        inputs = [self.tokens[-1], *draft.tokens, *draft.aux_tokens]
        if draft.is_chain:  # the runner's causal default
            return PassPlan(k, root, draft, inputs, None, None, None, start, time.perf_counter())
        parents = draft.parents if draft.parents is not None else chain_parents(len(draft.tokens))
        mask, offsets = pass_layout(parents, draft.aux_offsets, draft.aux_mask)  # [n, n], [n]
        cached = torch.ones(len(inputs), self.target.length, dtype=torch.bool)  # the prefix
        return PassPlan(k, root, draft, inputs, [root + o for o in offsets], torch.cat([cached, mask], dim=1),
                        parents, start, time.perf_counter())

    def complete(self, plan: PassPlan, logits: torch.Tensor) -> StepRecord:
        """Verify the draft with the target's logits [n, V] for plan.inputs; accept, roll back, emit."""
        draft, root = plan.draft, plan.root
        verdict = self._verify(plan, logits)
        verified = time.perf_counter()

        proposed = [*(draft.tokens[i] for i in verdict.path), verdict.next_token]
        emitted = self._emit(proposed)
        if not self.done:
            # Roll back: the target keeps the prefix, the root and the accepted path; the drafter
            # drops whatever it holds past the accepted tokens.
            self.target.keep([*range(root + 1), *(root + 1 + i for i in verdict.path)])
            self.drafter.rollback(self.tokens)
            if self.drafter.needs_hidden:  # where the target predicted each emitted token
                self.drafter.observe_hidden(self.target.hidden[[0, *(1 + i for i in verdict.path)]])
        record = StepRecord(
            k=plan.k,
            draft_tokens=list(draft.tokens),
            accepted=len(verdict.path),
            next_token=verdict.next_token,
            bonus=verdict.bonus,
            emitted=emitted,
            draft_time=plan.drafted - plan.started,
            verify_time=verified - plan.drafted,
            tree_depth=None if draft.parents is None else max(depths(draft.parents), default=0),
        )
        self.steps.append(record)
        self.stats.add_step(record)
        self.draft_length.update(record)
        self.stats.wall_time = time.perf_counter() - self._started
        if self.done:
            self.stats.finish_reason = self.finish_reason
        return record

    def _verify(self, plan: PassPlan, logits: torch.Tensor) -> Verdict:
        """The rejection sampler over the pass's logits (a chain is a tree; aux tokens go to the drafter)."""
        draft = plan.draft
        parents = plan.parents if plan.parents is not None else chain_parents(len(draft.tokens))
        if draft.aux_tokens:
            self.drafter.observe(logits[len(draft.tokens) + 1 :])
        return verify_tree(draft.tokens, parents, logits[: len(draft.tokens) + 1], self.sampling, self.generator,
                           draft.probs)

    def _emit(self, proposed: list[int]) -> list[int]:
        """Append tokens one by one, stopping exactly at max_new_tokens, EOS or a stop string."""
        emitted = []
        for token in proposed:
            self.tokens.append(token)
            emitted.append(token)
            if token in self.eos_ids:
                self.finish_reason = "eos"
            elif self.stop_check is not None and self.stop_check(self.new_tokens):
                self.finish_reason = "stop"
            elif len(self.new_tokens) >= self.max_new_tokens:
                self.finish_reason = "length"
            if self.done:
                break
        return emitted

    def __iter__(self) -> Iterator[StepRecord]:
        while not self.done:
            yield self.step()
