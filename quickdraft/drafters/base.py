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

    def fitted(self, room: int) -> Draft:
        """This draft cut to `room` inputs after the root (near the end of the context): aux
        tokens go first, then the last tree nodes (parents come before children, so the
        nodes left are still a tree)."""
        if len(self.tokens) + len(self.aux_tokens) <= room:
            return self
        m = min(len(self.tokens), room)
        probs = None if self.probs is None else self.probs[:m]
        return Draft(self.tokens[:m], probs, None if self.parents is None else self.parents[:m])


class Drafter(Protocol):
    """Anything that guesses the next tokens. One instance serves one sequence at a time."""

    needs_hidden: bool  # True: the engine passes the target's hidden states to observe_hidden

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

    def observe_hidden(self, hidden: torch.Tensor) -> None:
        """The target's last hidden states [m, H] (after its final norm) at the m positions before
        the sequence's last m tokens: row i is where the target predicted tokens[-m + i]. Called
        after begin (the prompt) and after rollback (the root and the accepted path), only when
        needs_hidden."""
        ...


class TokenDrafter:
    """Defaults for drafters that read only tokens: no aux tokens, no hidden states, no state to roll back."""

    needs_hidden = False

    def rollback(self, tokens: list[int]) -> None:
        pass

    def observe(self, aux_logits: torch.Tensor) -> None:
        pass

    def observe_hidden(self, hidden: torch.Tensor) -> None:
        pass


class NoDrafter(TokenDrafter):
    """Method "none": proposes nothing, so every target pass emits exactly one token."""

    def begin(self, prompt_ids: list[int]) -> None:
        pass

    def propose(
        self, tokens: list[int], k: int, sampling: SamplingParams, generator: torch.Generator
    ) -> Draft:
        return Draft()
