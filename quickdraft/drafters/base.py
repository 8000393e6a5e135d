"""The drafter interface: propose draft tokens, then learn which were accepted."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from quickdraft.sampling import SamplingParams


@dataclass
class Draft:
    """Draft tokens (a chain or a tree) and the distributions they were drawn from.

    probs is [K, V] (q at each draft position) for drafters that sample, or None for
    deterministic drafters, whose q is one-hot on the drafted token.
    parents: None for a chain; else the tree (see tree.py), verified with one-hot q.
    aux_tokens: extra inputs the target runs in the same pass for the drafter's own use
    (Lookahead's Jacobi window); they are never accepted. aux_offsets are their positions
    after the root, aux_mask [A, A] who among them attends to whom (all see the root and
    the prefix). Their logits come back through the drafter's observe().
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


class Drafter(Protocol):
    """Anything that guesses the next tokens. One instance serves one sequence at a time."""

    def begin(self, prompt_ids: list[int]) -> None:
        """Start a new sequence (reset state, prefill any cache with the prompt)."""
        ...

    def propose(
        self, tokens: list[int], k: int, sampling: SamplingParams, generator: torch.Generator
    ) -> Draft:
        """Up to k draft tokens to follow `tokens` (the prompt plus everything accepted)."""
        ...

    def rollback(self, tokens: list[int]) -> None:
        """`tokens` is the sequence after verification: forget any state past its accepted part."""
        ...

    def observe(self, aux_logits: torch.Tensor) -> None:
        """The target's logits [A, V] at the draft's aux tokens (only called when it had some)."""
        ...


class NoDrafter:
    """Method "none": proposes nothing, so every target pass emits exactly one token."""

    def begin(self, prompt_ids: list[int]) -> None:
        pass

    def propose(
        self, tokens: list[int], k: int, sampling: SamplingParams, generator: torch.Generator
    ) -> Draft:
        return Draft()

    def rollback(self, tokens: list[int]) -> None:
        pass

    def observe(self, aux_logits: torch.Tensor) -> None:
        pass
