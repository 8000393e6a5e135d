"""The check that an equality test exercised speculation: a drafter that proposed nothing, or only
wrong tokens, would pass "speculative output == plain output" as well as a working one.
scripts/check-tests-catch-stalls.py runs the tests marked `speculation` under such drafters."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from quickdraft.stats import Stats

# A prompt after which the tiny target (conftest's tiny_target) falls into greedy text that repeats
# itself (11 11 11 ..., then 16 7 16 7 ...): there prompt lookup's and Lookahead's copies are right.
# On most prompts that random model rarely repeats itself, and their drafts are rarely accepted.
LOOPING = [29, 14, 21, 2, 8, 19]

# The least share of a test's draft-verifying passes that must accept some of the draft. A wrong
# token is accepted only where it happens to be the target's choice: about one pass in V for a
# chain (measured 3-11% over the tiny models' 32 tokens, whose text has structure), so 15% (0.1
# where a test's own drafter is weaker; trees of several siblings: see the `chance` marker).
CHAIN_RATE = 0.15
# Over a real vocabulary (8,192 tokens and more) a wrong token is accepted about once in V
# passes: one accepting pass in a hundred is far above that.
REAL_VOCAB_RATE = 0.01
# Trees and Lookahead's n-gram candidates put several tokens before each pass, and neighbouring ids
# of a BPE vocabulary are often the same word spelled otherwise: shifted by one, they still land
# now and then (enough to pass 1% on the default target). The trained heads and Lookahead accept
# in 44-74% of passes there.
REAL_VOCAB_TREE_RATE = 0.2


def real_vocab_rate(method: str) -> float:
    """The least share of accepting passes for `method` over a real vocabulary."""
    return (
        REAL_VOCAB_TREE_RATE
        if method.split(":")[0] in ("lookahead", "medusa", "eagle", "eagle3", "suffix")
        else REAL_VOCAB_RATE
    )


@dataclass
class Speculation:
    """Totals over a test's outputs."""

    outputs: int
    drafted: int  # draft tokens proposed
    accepted: int  # draft tokens accepted
    passes: int  # target passes that verified a draft
    hits: int  # of those, the passes that accepted one or more draft tokens

    @property
    def hit_rate(self) -> float:
        return self.hits / self.passes if self.passes else 0.0


def speculation(outputs: Iterable) -> Speculation:
    """Totals over GenerationOutputs, Generations or Stats."""
    stats = [out if isinstance(out, Stats) else out.stats for out in outputs]
    return Speculation(
        len(stats),
        sum(s.drafted_tokens for s in stats),
        sum(s.accepted_tokens for s in stats),
        sum(s.drafted_by_position[0] for s in stats if s.drafted_by_position),
        sum(s.accepted_by_position[0] for s in stats if s.accepted_by_position),
    )


def speculated(outputs: Iterable, min_rate: float = CHAIN_RATE) -> bool:
    """Whether assert_speculated(outputs, min_rate) would pass (for tests that try spare prompts until it does)."""
    s = speculation(outputs)
    return s.drafted > 0 and s.accepted > 0 and s.hit_rate >= min_rate


def assert_speculated(outputs: Iterable, min_rate: float = CHAIN_RATE, label: object = "") -> None:
    """Drafts were proposed and accepted over `outputs`: drafted > 0, accepted > 0, and at least
    `min_rate` of the target passes that verified a draft accepted some of it. A drafter of wrong
    tokens gets about one such pass in V by chance (V: the vocabulary; 3-11% measured over the tiny
    models' 32 tokens; more under sampling, where a wrong token is accepted with its probability)."""
    s = speculation(outputs)
    where = f" ({label})" if label != "" else ""  # e.g. the method, where a test checks several
    check = f"[speculation check] over {s.outputs} outputs{where}:"
    assert s.drafted > 0, f"{check} no draft tokens proposed: speculation never ran"
    assert s.accepted > 0, f"{check} none of {s.drafted} draft tokens accepted"
    assert s.hit_rate >= min_rate, (
        f"{check} {s.hits} of {s.passes} passes with drafts accepted some "
        f"({s.hit_rate:.0%}), below the {min_rate:.0%} this test's inputs give"
    )
