"""A prompt-lookup branch for head trees: what followed the last n-gram earlier in the text,
hung under the tree's root beside the head's guesses.

Heads guess open-ended text well and copies poorly (a translation, a quoted passage); prompt
lookup is the reverse. One tree holds both, and verification keeps whichever path is right, so
a step costs one target pass either way. The branch's confidence is the sequence's own record:
the share of its branch tokens the target accepted once their parent was accepted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from quickdraft.drafters.prompt_lookup import check_ngrams, lookup_continuation


@dataclass
class BranchRecord:
    """One sequence's branch history (starting from one accepted of two tried: an even guess)
    and its latest chain, to score against what the target accepts."""

    tried: int = 2
    accepted: int = 1
    chain: tuple[int, ...] = ()
    verified: int = 0  # how deep the latest chain's nodes were in the draft that was verified
    draft: tuple[int, ...] = ()  # that draft's tokens

    @property
    def rate(self) -> float:
        """Chance that a branch token is right given that its parent is (below 1: a miss is counted)."""
        return self.accepted / self.tried


@dataclass(frozen=True)
class LookupBranch:
    """most: the longest chain, whatever the tree's depth (a copy can run far; sizing by the
    measured pass costs decides how much of it pays)."""

    max_ngram: int = 3
    min_ngram: int = 2
    most: int = 16

    def __post_init__(self) -> None:
        check_ngrams(self.max_ngram, self.min_ngram)

    def propose(self, record: BranchRecord, tokens: list[int], room: int) -> tuple[list[int], list[float]]:
        """Up to `most` tokens (and `room`) to follow `tokens`, with the log of each one's chance that
        its whole path is right (the record's rate per token: a path of d tokens, rate^d)."""
        k = min(self.most, room)
        chain = lookup_continuation(tokens, k, self.max_ngram, self.min_ngram) if k >= 1 else []
        record.chain, record.verified = tuple(chain), 0
        log_rate = math.log(record.rate)
        return chain, [log_rate * depth for depth in range(1, len(chain) + 1)]

    @staticmethod
    def drafted(record: BranchRecord, tokens: list[int], parents: list[int]) -> None:
        """Note how much of the latest chain is in the draft being verified (sizing may cut it)."""
        node, depth = -1, 0
        for token in record.chain:
            node = next((n for n, (t, p) in enumerate(zip(tokens, parents)) if p == node and t == token), -1)
            if node < 0:
                break
            depth += 1
        record.verified, record.draft = depth, tuple(tokens)

    @staticmethod
    def learn(record: BranchRecord, path: tuple[int, ...]) -> None:
        """Count the latest chain's verified tokens whose parent was accepted, and those accepted
        (path: the accepted draft nodes, root to leaf)."""
        accepted_tokens = [record.draft[i] for i in path] if record.verified else []
        matched = 0
        while matched < min(record.verified, len(accepted_tokens)) and record.chain[matched] == accepted_tokens[matched]:
            matched += 1
        record.tried += min(record.verified, matched + 1)
        record.accepted += matched
        record.chain, record.verified, record.draft = (), 0, ()
