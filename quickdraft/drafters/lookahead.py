"""Lookahead decoding (Fu et al. 2024): Jacobi iteration makes n-grams, the target verifies them.

No draft model. Each target pass does two jobs at once:
- the lookahead branch: a window of W columns and N - 1 levels of guessed future tokens.
  Token (level l, column j) sits at position root + 1 + j + l and sees the prefix, level 0's
  columns before j and its own column's lower levels: one consistent guess per earlier
  position. Its output guesses the next position. The top level's outputs complete one
  N-gram per column (the column's N - 1 tokens plus the output), which goes into the pool,
  and become the window's new top level (the oldest level drops out);
- the verification branch: up to G pool n-grams that start with the newest token, merged
  into a token tree and verified like any draft (q one-hot), so output stays lossless.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from quickdraft.drafters.drafter import Draft, DraftRequest, SequenceDrafter, StepOutcome
from quickdraft.errors import QuickdraftError
from quickdraft.tree import trie_from_paths


@dataclass
class LookaheadState:
    """One sequence's Jacobi window and n-gram pool."""

    levels: list[list[int]]  # N - 1 levels of W guessed tokens, oldest first
    pool: dict[int, OrderedDict[tuple[int, ...], None]] = field(default_factory=dict)  # first token -> continuations


class LookaheadDrafter(SequenceDrafter):
    """window W, ngram N (N >= 2), candidates G: the paper's three knobs."""

    def __init__(self, window: int = 4, ngram: int = 3, candidates: int = 4, pool_size: int = 8) -> None:
        if window < 1 or ngram < 2 or candidates < 1:
            raise QuickdraftError(
                f"lookahead needs window >= 1, ngram >= 2, candidates >= 1; got {window}, {ngram}, {candidates}"
            )
        self.window, self.ngram, self.candidates, self.pool_size = window, ngram, candidates, pool_size
        self._mask, self._offsets = window_layout(window, ngram - 1)

    def begin(self, prompt_ids: list[int], hidden: torch.Tensor | None) -> LookaheadState:
        # Seed the window with prompt tokens (the paper starts from random tokens of the prompt).
        count = (self.ngram - 1) * self.window
        seed = (prompt_ids * (count // len(prompt_ids) + 1))[-count:]
        return LookaheadState([seed[i * self.window : (i + 1) * self.window] for i in range(self.ngram - 1)])

    def draft(self, request: DraftRequest) -> Draft:
        state, k = request.state, request.k
        continuations = list(state.pool.get(request.tokens[-1], {}))[-self.candidates :] if k > 0 else []
        draft_tokens, parents = trie_from_paths([list(c[:k]) for c in reversed(continuations)])
        aux = [token for level in state.levels for token in level]  # level-major
        return Draft(draft_tokens, None, parents, aux, list(self._offsets), self._mask)

    def update(self, state: LookaheadState, outcome: StepOutcome) -> None:
        """The aux logits [(N-1) * W, V]: grow the pool from the top level, then slide the window."""
        if outcome.aux_logits is None:
            return
        guesses = torch.argmax(outcome.aux_logits, dim=-1).view(self.ngram - 1, self.window).tolist()  # [N-1, W]
        top = guesses[-1]
        for column in range(self.window):
            gram = [level[column] for level in state.levels] + [top[column]]
            self._remember(state, gram[0], tuple(gram[1:]))
        state.levels = [*state.levels[1:], top]

    def _remember(self, state: LookaheadState, first: int, continuation: tuple[int, ...]) -> None:
        entries = state.pool.setdefault(first, OrderedDict())
        entries.pop(continuation, None)
        entries[continuation] = None  # newest last
        while len(entries) > self.pool_size:
            entries.popitem(last=False)


def window_layout(window: int, levels: int) -> tuple[torch.Tensor, list[int]]:
    """Mask [A, A] and position offsets (from the root) of the lookahead branch, level-major."""
    size = window * levels
    mask = torch.zeros(size, size, dtype=torch.bool)
    offsets = []
    for level in range(levels):
        for column in range(window):
            row = level * window + column
            offsets.append(1 + column + level)
            mask[row, :column] = True  # level 0, earlier columns: the positions before this column
            for lower in range(level + 1):
                mask[row, lower * window + column] = True  # this column, levels up to this one
    return mask, offsets
