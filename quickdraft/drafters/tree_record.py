"""What one sequence's verified trees have taught its drafter: how far to trust the head's
confidence, and how often the lookup branch's copies were right.

A head's confidence in a path is its own estimate; measured on Spec-Bench at int4, the shipped
EAGLE-3 head expected about twice the tokens it got accepted on translation, summaries and RAG,
and about what it got on math. Trees sized by measured pass costs pay for rows on that
estimate, so each sequence scales it by what the target has accepted so far.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from quickdraft.drafters.head_tree import TreeDraft

# A head left idle (none of its nodes could pay) still drafts every this many steps, so that its
# record keeps up with the text (an idle head learns nothing).
RECHECK_EVERY = 8
MOST_REST = 64
# Trees with head nodes verified before what they got accepted is trusted to say whether the
# head pays for its drafting.
MEASURED_STEPS = 4


@dataclass
class Rate:
    """Tokens the target accepted of those it was shown with their parent accepted; it starts
    from one of two (an even guess), so it stays strictly between 0 and 1."""

    accepted: int = 1
    tried: int = 2

    @property
    def value(self) -> float:
        return self.accepted / self.tried


@dataclass
class TreeRecord:
    """head_expected / head_accepted: the head's nodes' summed confidence and how many of them the
    target accepted (from an even start of one each). first / next: the branch's first token,
    and a later one given that those before it were right (a copy that has started tends to go
    on). latest: the tree now being verified."""

    head_expected: float = 1.0
    head_accepted: float = 1.0
    first: Rate = field(default_factory=Rate)
    next: Rate = field(default_factory=Rate)
    latest: TreeDraft | None = None
    idle: int = 0  # steps since the head last drafted
    rest: int = RECHECK_EVERY  # steps it may rest at most: doubled each time a check found it still does not pay
    checked: bool = False  # the head's last draft was a check (it had rested as long as it may)
    head_steps: int = 0  # verified trees that held head nodes
    head_rows: int = 0  # head nodes those trees verified
    head_tokens: int = 0  # and of them, the ones accepted

    def may_rest(self) -> bool:
        """Whether the head may skip this step (it drafted within the last `rest` steps)."""
        return self.idle < self.rest - 1

    def rested(self) -> None:
        """The head skips this step: right after a check that found it still does not pay, it may
        rest twice as long (at most MOST_REST steps) before the next check."""
        if self.idle == 0 and self.checked:
            self.rest = min(2 * self.rest, MOST_REST)
        self.checked = False
        self.idle += 1

    def checks(self) -> None:
        """The head drafts this step because it rested as long as it may."""
        self.checked = True

    def pays(self) -> None:
        """The head drafts this step because it might pay: checks come every RECHECK_EVERY steps again."""
        self.rest, self.checked = RECHECK_EVERY, False

    def head_measured(self, least: int = MEASURED_STEPS) -> tuple[float, float] | None:
        """Head nodes accepted and verified per tree that held any, once `least` such trees were
        verified (None before)."""
        if self.head_steps < least:
            return None
        return self.head_tokens / self.head_steps, self.head_rows / self.head_steps

    @property
    def head_scale(self) -> float:
        """The log factor on the head's path confidences: what it got over what it expected (never
        raised above its own estimate, so a path's chance stays at most 1)."""
        return math.log(min(1.0, self.head_accepted / self.head_expected))

    def branch_scores(self, length: int) -> list[float]:
        """The log chance that each node of a branch chain of `length` is right with its whole path."""
        first, later = math.log(self.first.value), math.log(self.next.value)
        return [first + later * d for d in range(length)]

    def learn(self, path: tuple[int, ...]) -> None:
        """Score the latest tree against the nodes the target accepted (root to leaf)."""
        tree, self.latest = self.latest, None
        if tree is None or not tree.tokens:
            return
        accepted = set(path)
        self.head_expected += sum(tree.head)
        self.head_accepted += sum(1 for n in path if tree.head[n] > 0)
        rows = sum(1 for confidence in tree.head if confidence > 0)
        if rows:
            self.head_steps, self.head_rows = self.head_steps + 1, self.head_rows + rows
            self.head_tokens += sum(1 for n in path if tree.head[n] > 0)
        if tree.chain:
            matched = next((i for i, n in enumerate(tree.chain) if n not in accepted), len(tree.chain))
            self.first.tried += 1
            self.first.accepted += matched > 0
            shown = min(len(tree.chain), matched + 1) - 1  # later chain tokens shown with their parent right
            self.next.tried += shown
            self.next.accepted += max(0, matched - 1)
