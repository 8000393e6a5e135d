"""Text a suffix drafter matches against: token sequences, where each token occurs, and the tree of
what followed a matched context, with how often each continuation did.

A SuffixStore holds whole sequences one after another, each closed by END (so no match or
continuation runs from one into the next), and for every token the positions it occurs at. The
longest suffix of a context that occurred earlier is found by narrowing the occurrences of its
last token one token further back at a time (numpy over the positions); the occurrences of that
suffix are what a suffix tree's matched node counts, and the tokens after them give the tree of
continuations, each node's count over the node's own count an estimate of the chance it follows.

With a capacity, the oldest sequences are dropped once the tokens held exceed it: their tokens
are skipped at once and the arrays rebuilt without them once they make up as much as the capacity
again, so memory stays under twice the capacity (plus the newest sequence).
"""

from __future__ import annotations

import heapq
from array import array
from dataclasses import dataclass, field

import numpy as np

END = -1  # closes each sequence
# The most a store with a capacity holds per token of it: the token (int32) and its place in a
# position list (int32), for the live tokens and as many dropped ones, arrays at most half empty.
BYTES_PER_TOKEN = 2 * 2 * (4 + 4)


@dataclass
class Continuations:
    """A speculation tree grown from a matched suffix: tokens, parents (-1: under the root) and each
    node's estimated chance that its path follows (nonincreasing: any prefix is a tree). match: the
    matched suffix's length; score: the expected accepted tokens, the sum of the chances."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    match: int = 0

    @property
    def score(self) -> float:
        return sum(self.probs)


class SuffixStore:
    """Sequences of token ids, searchable by suffix. capacity: tokens kept (None: all)."""

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is not None and capacity < 0:
            raise ValueError(f"a suffix store's capacity must be >= 0 tokens, got {capacity}")
        self.capacity = capacity
        self._tokens = np.empty(1024, dtype=np.int32)  # [held] with END after each closed sequence
        self._held = 0
        self._where: dict[int, array] = {}  # token -> positions it occurs at, ascending
        self._first = 0  # positions before this belong to dropped sequences
        self._ends: list[int] = []  # where each live closed sequence ends (its END's position + 1)
        self._open = False  # the last sequence is still growing (no END yet)

    @property
    def tokens_held(self) -> int:
        """Tokens of live sequences (the memory that counts against the capacity)."""
        return self._held - self._first

    @property
    def nbytes(self) -> int:
        """Bytes the store holds: its token array and its position lists."""
        return self._tokens.nbytes + sum(positions.itemsize * len(positions) for positions in self._where.values())

    def extend(self, tokens: list[int]) -> None:
        """Append tokens to the open sequence (starting one if none is open)."""
        self._open = True
        self._append(tokens)

    def add(self, tokens: list[int]) -> None:
        """One whole sequence, closed: later matches may run through it, never past its end."""
        if self._open:
            self._close()
        if self.capacity is not None and len(tokens) + 1 > self.capacity:
            tokens = tokens[len(tokens) + 1 - self.capacity :] if self.capacity > 1 else []
        if not tokens:
            return
        self._append(tokens)
        self._close()
        self._evict()

    def _append(self, tokens: list[int], indexed: bool = True) -> None:
        n = len(tokens)
        if self._held + n > len(self._tokens):
            grown = np.empty(max(2 * len(self._tokens), self._held + n), dtype=np.int32)
            grown[: self._held] = self._tokens[: self._held]
            self._tokens = grown
        self._tokens[self._held : self._held + n] = tokens
        if indexed:
            for offset, token in enumerate(tokens):
                positions = self._where.get(token)
                if positions is None:
                    positions = self._where[token] = array("i")
                positions.append(self._held + offset)
        self._held += n

    def _close(self) -> None:
        self._append([END], indexed=False)  # END is never matched
        self._ends.append(self._held)
        self._open = False

    def _evict(self) -> None:
        """Drop the oldest sequences past the capacity; rebuild once the dropped ones fill it."""
        if self.capacity is None:
            return
        while self._ends and self._held - self._first > self.capacity:
            self._first = self._ends.pop(0)
        if self._first >= max(self.capacity, 1):
            live = self._tokens[self._first : self._held].tolist()
            ends = [end - self._first for end in self._ends]
            self._tokens, self._held, self._where, self._first, self._ends = (
                np.empty(len(live) + 1024, np.int32),
                0,
                {},
                0,
                [],
            )
            start = 0
            for end in ends:
                self._append(live[start : end - 1])
                self._close()
                start = end

    def matches(self, context: list[int], longest: int) -> tuple[np.ndarray, np.ndarray]:
        """Where the longest suffixes of `context` (up to `longest` tokens) occurred earlier ->
        (the position after each occurrence of its last token that has a continuation [m], how
        many tokens of the context end there [m], at least 1). Of a token that occurs very often,
        its latest MOST_SCANNED occurrences are looked at: the cost of a step stays bounded
        however large the pool."""
        empty = np.empty(0, dtype=np.int64)
        positions = self._where.get(context[-1]) if context else None
        if positions is None:
            return empty, empty
        at = np.frombuffer(positions, dtype=np.int32)[-MOST_SCANNED:].astype(np.int64)  # [m]
        at = at[(at >= self._first) & (at + 1 < self._held)]
        at = at[self._tokens[at + 1] != END]  # something followed
        length = np.ones(len(at), dtype=np.int64)
        alive = np.arange(len(at))  # the occurrences still matching, fewer each token back
        for back in range(1, min(longest, len(context))):
            before = at[alive] - back
            ok = before >= self._first
            ok[ok] = self._tokens[before[ok]] == context[-1 - back]
            alive = alive[ok]
            if len(alive) == 0:
                break
            length[alive] += 1
        return at + 1, length

    def tree(self, starts: np.ndarray, match: int, budget: int, depth: int, least: float) -> Continuations:
        """The speculation tree over what followed `starts`: nodes taken best first by their
        count over len(starts), while at least `least`, at most `budget` of them and `depth` deep."""
        grown = Continuations(match=match)
        if budget < 1 or depth < 1 or len(starts) == 0:
            return grown
        total = len(starts)
        tokens, held = self._tokens, self._held
        frontier: list[tuple[float, int, int, int, np.ndarray]] = []  # (-chance, order, parent, level, starts)
        order = 0

        def branch(parent: int, level: int, at: np.ndarray) -> None:
            nonlocal order
            at = at[at + level < held]
            if len(at) == 0:
                return
            nexts = tokens[at + level]
            values, counts = np.unique(nexts, return_counts=True)
            kept = (counts >= least * total) & (values != END)  # before any Python loop: most are rare
            for value, count in zip(values[kept].tolist(), counts[kept].tolist()):
                heapq.heappush(frontier, (-count / total, order, parent, level, at[nexts == value]))
                order += 1

        branch(-1, 0, starts)
        while frontier and len(grown.tokens) < budget:
            chance, _, parent, level, at = heapq.heappop(frontier)
            grown.tokens.append(int(tokens[at[0] + level]))
            grown.parents.append(parent)
            grown.probs.append(-chance)
            if level + 1 < depth:
                branch(len(grown.tokens) - 1, level + 1, at)
        return grown

    def speculate(
        self, context: list[int], longest: int, factor: float, most: int, depth: int, least: float
    ) -> Continuations:
        """The best tree from this store for what follows `context`: for each distinct match length
        (longest first; a longer match is more specific, a shorter one has more occurrences), a
        tree of at most factor x match nodes (and `most`), and the one with the most expected
        accepted tokens wins. Counts come from the match's latest MOST_OCCURRENCES occurrences."""
        starts, length = self.matches(context, longest)
        best = Continuations()
        for match in np.unique(length)[::-1][:MATCH_LEVELS].tolist():
            budget = min(most, int(factor * match))
            if budget < 1 or budget <= best.score:  # a tree of n nodes expects at most n tokens
                continue
            grown = self.tree(starts[length >= match][-MOST_OCCURRENCES:], match, budget, depth, least)
            if grown.score > best.score:
                best = grown
        return best


MATCH_LEVELS = 4  # match lengths tried per store and step: the longest few decide; more costs time
MOST_SCANNED = 4096  # occurrences of the last token looked at per step (the latest)
MOST_OCCURRENCES = 256  # a tree counts the latest occurrences of its match only: as good an estimate, bounded cost
