"""The drafter interface: a shared part that proposes drafts for many sequences at once, and
per-sequence state that it hands out at begin() and is given back in every call.

A drafter object is built once per decoder from parts loaded once per process (a draft
backend, trained heads, options); it never holds a sequence's state itself, so one drafter
serves every sequence of its method, and a step drafts for all of them in one call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from quickdraft.noise import PositionNoise
from quickdraft.sampling import SamplingParams
from quickdraft.tree import chain_parents, depths


@dataclass
class Draft:
    """Draft tokens (a chain or a tree) and the distributions they were drawn from.

    probs is [K, V] (q at each draft position) for drafters that sample, or None for
    deterministic drafters, whose q is one-hot on the drafted token.
    parents: None for a chain; else the tree (see tree.py), verified with one-hot q.
    aux_tokens: extra inputs the target runs in the same pass for the drafter's own use
    (Lookahead's Jacobi window); they are never accepted. aux_offsets are their positions
    after the root, aux_mask [A, A] who among them attends to whom (all see the root and
    the prefix). Their logits come back in the step's outcome.
    """

    tokens: list[int] = field(default_factory=list)
    probs: torch.Tensor | None = None
    parents: list[int] | None = None
    aux_tokens: list[int] = field(default_factory=list)
    aux_offsets: list[int] = field(default_factory=list)
    aux_mask: torch.Tensor | None = None

    @property
    def is_chain(self) -> bool:
        return self.parents is None and not self.aux_tokens

    def fitted(self, room: int) -> Draft:
        """This draft cut to `room` inputs after the root (near the end of the context): aux
        tokens go first, then the last tree nodes (parents come before children, so the
        nodes left are still a tree)."""
        if len(self.tokens) + len(self.aux_tokens) <= room:
            return self
        m = min(len(self.tokens), room)
        probs = None if self.probs is None else self.probs[:m]
        return Draft(self.tokens[:m], probs, None if self.parents is None else self.parents[:m])

    def within_depth(self, most: int) -> tuple[Draft, list[int] | None]:
        """This draft without its nodes deeper than `most` (a backend's tree window) -> (the draft,
        each kept node's index in this one; None: nothing cut). Aux tokens stay."""
        parents = self.parents if self.parents is not None else chain_parents(len(self.tokens))
        level = depths(parents)
        kept = [i for i in range(len(parents)) if level[i] <= most]
        if len(kept) == len(parents):
            return self, None
        index = {old: new for new, old in enumerate(kept)}  # ancestors are never deeper: all kept
        probs = None if self.probs is None else self.probs[kept]
        return Draft(
            [self.tokens[i] for i in kept],
            probs,
            [index.get(parents[i], -1) for i in kept],
            self.aux_tokens,
            self.aux_offsets,
            self.aux_mask,
        ), kept


@dataclass
class DraftRequest:
    """One sequence asking for up to k draft tokens to follow `tokens` (prompt + every accepted token)."""

    state: Any  # what the drafter's begin() returned for this sequence
    tokens: list[int]
    k: int
    sampling: SamplingParams
    generator: torch.Generator
    reach: int | None = None  # the deepest a path can still be of use (the output's or the cache's end); None: k
    noise: PositionNoise | None = None  # sampling by Gumbel-max: the target's noise, to draft argmax(log q + g)


@dataclass
class StepOutcome:
    """What one target pass decided for a sequence; its drafter hears it once, after verification.

    hidden: the target's last hidden states [1 + accepted, H] (after its final norm; with the
    drafter's taps, those layers' inputs [1 + accepted, len(taps) H]) at the root and along the
    accepted path: row i is where the target predicted tokens[-(1 + accepted) + i]
    (drafters with needs_hidden only). aux_logits: the target's logits [A, V] at the draft's aux
    tokens (drafts that had some)."""

    tokens: list[int]  # the sequence after the step
    path: tuple[int, ...]  # indices of the accepted draft nodes, root to leaf
    hidden: torch.Tensor | None = None
    aux_logits: torch.Tensor | None = None


class Drafter(Protocol):
    """Anything that guesses the next tokens, for any number of sequences."""

    needs_hidden: bool  # True: begin() and every outcome carry the target's hidden states
    taps: tuple[int, ...]  # with needs_hidden: those target layers' inputs side by side instead (EAGLE-3)

    def begin(self, prompt_ids: list[int], hidden: torch.Tensor | None) -> Any:
        """A new sequence's state (e.g. a draft cache prefilled with the prompt). hidden: the
        target's states [len(prompt) - 1, H] over the prompt (row i predicted prompt[i + 1]),
        when needs_hidden and the prompt has more than one token."""
        ...

    def propose(self, requests: list[DraftRequest]) -> list[Draft]:
        """One draft per request, in order (drafters with a model batch them into shared passes)."""
        ...

    def update(self, state: Any, outcome: StepOutcome) -> None:
        """Learn what the target accepted: roll back caches, grow pools, take hidden states."""
        ...

    def finish(self, state: Any, tokens: list[int]) -> None:
        """The sequence ended (end of text, a stop string or its length; not a failure): `tokens`
        is its prompt and output, for a drafter that learns from earlier sequences."""
        ...

    def for_tenant(self, tenant: str | None) -> Drafter:
        """This drafter for sequences of `tenant` (the server's API key), for a drafter that learns
        across sequences: no tenant's sequences draft from another's."""
        ...


class SequenceDrafter:
    """Defaults for drafters that draft each sequence on its own from its tokens, with no state."""

    needs_hidden = False
    taps: tuple[int, ...] = ()

    def begin(self, prompt_ids: list[int], hidden: torch.Tensor | None) -> Any:
        return None

    def propose(self, requests: list[DraftRequest]) -> list[Draft]:
        return [self.draft(request) for request in requests]

    def draft(self, request: DraftRequest) -> Draft:
        raise NotImplementedError

    def update(self, state: Any, outcome: StepOutcome) -> None:
        pass

    def finish(self, state: Any, tokens: list[int]) -> None:
        pass

    def for_tenant(self, tenant: str | None) -> Drafter:
        return self  # learns nothing across sequences: one for every tenant


class NoDrafter(SequenceDrafter):
    """Method "none": proposes nothing, so every target pass emits exactly one token."""

    def draft(self, request: DraftRequest) -> Draft:
        return Draft()
