"""A prompt-lookup branch for head trees: what followed the last n-gram earlier in the text,
hung under the tree's root beside the head's guesses.

Heads guess open-ended text well and copies poorly (a translation, a quoted passage); prompt
lookup is the reverse. One tree holds both, and verification keeps whichever path is right, so
a step costs one target pass either way. The branch's confidence is the sequence's own record
(tree_record.py): how often the target took its chains' tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from quickdraft.drafters.prompt_lookup import check_ngrams, lookup_continuation
from quickdraft.drafters.tree_record import TreeRecord


@dataclass(frozen=True)
class LookupBranch:
    """most: the longest chain, whatever the tree's depth (a copy can run far; sizing by the
    measured pass costs decides how much of it pays)."""

    max_ngram: int = 3
    min_ngram: int = 2
    most: int = 16

    def __post_init__(self) -> None:
        check_ngrams(self.max_ngram, self.min_ngram)

    def propose(self, record: TreeRecord, tokens: list[int], room: int) -> tuple[list[int], list[float]]:
        """Up to `most` tokens (and `room`) to follow `tokens`, with the log of each one's chance that
        its whole path is right."""
        k = min(self.most, room)
        chain = lookup_continuation(tokens, k, self.max_ngram, self.min_ngram) if k >= 1 else []
        return chain, record.branch_scores(len(chain))
