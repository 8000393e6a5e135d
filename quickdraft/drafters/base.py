"""The drafter interface: propose draft tokens, then learn which were accepted."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from quickdraft.sampling import SamplingParams


@dataclass
class Draft:
    """Draft tokens and the distributions they were drawn from.

    probs is [K, V] (q at each draft position) for drafters that sample, or None for
    deterministic drafters, whose q is one-hot on the drafted token.
    """

    tokens: list[int] = field(default_factory=list)
    probs: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.tokens)


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
