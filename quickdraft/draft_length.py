"""How many tokens to draft each step: fixed, adaptive (grow/shrink), or chosen by a cost model (0: none).

A policy is made fresh for every generation; the engine asks next_k() before a step and
reports the step back with update(). The engine still caps K at the tokens left to produce.
What passes cost is a property of the machine, not of the text, so the cost model's timings
(PassCosts) are shared by every generation of a decoder; acceptance is learned per generation.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from quickdraft.analysis import time_per_token
from quickdraft.errors import QuickdraftError
from quickdraft.stats import StepRecord

DEFAULT_PRIOR_SLOPE = 0.04  # an 8-token pass costing 1.3x a 1-token one: a guess, until passes are timed


class DraftLength(Protocol):
    def next_k(self) -> int: ...

    def update(self, step: StepRecord) -> None: ...


@dataclass
class FixedK:
    """The same K every step."""

    k: int

    def next_k(self) -> int:
        return self.k

    def update(self, step: StepRecord) -> None:
        pass


@dataclass
class AdaptiveK:
    """Grow K after a fully accepted step, shrink it after a rejection, within [k_min, k_max]."""

    k: int
    k_min: int = 1
    k_max: int = 16
    grow: int = 2
    shrink: int = 1

    def next_k(self) -> int:
        return self.k

    def update(self, step: StepRecord) -> None:
        drafted = len(step.draft_tokens)
        if drafted == 0:
            return  # nothing was proposed, so nothing was learned
        if step.accepted == drafted:
            self.k = min(self.k_max, self.k + self.grow)
        else:
            self.k = max(self.k_min, self.k - self.shrink)


def _median(values: Iterable[float]) -> float:
    """The lower median: slow-downs only add time, so of the two middle values take the faster one."""
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


def _tested(accepted: int, drafted: int) -> int:
    """Drafts a chain tested: the accepted prefix plus the first rejection, if there was one."""
    return accepted + (1 if accepted < drafted else 0)


def _weighted_median(pairs: Iterable[tuple[float, float]]) -> float:
    """The (value, weight) pairs' value at half their total weight: a few light outliers cannot move it."""
    ordered = sorted(pairs)
    half, seen = sum(w for _, w in ordered) / 2, 0.0
    for value, weight in ordered:
        seen += weight
        if seen >= half:
            return value
    return ordered[-1][0]


def _resistant_line(points: Sequence[tuple[float, float, float]]) -> tuple[float, float] | None:
    """(base, slope) of Tukey's resistant line through (x, y, weight) points; None if not identified.

    The slope joins the weighted medians of the lower and upper halves (by weight) and the base is
    the weighted median residual, so a lightly sampled count whose median is itself an outlier
    cannot tilt the line the way it tilts least squares (its leverage grows with its distance)."""
    ordered = sorted(points)
    if len(ordered) < 2:
        return None
    half, seen, lower, upper = sum(w for _, _, w in ordered) / 2, 0.0, [], []
    for x, y, w in ordered:
        (lower if seen + w / 2 < half else upper).append((x, y, w))
        seen += w
    if not lower or not upper:
        return None
    dx = _weighted_median((x, w) for x, _, w in upper) - _weighted_median((x, w) for x, _, w in lower)
    dy = _weighted_median((y, w) for _, y, w in upper) - _weighted_median((y, w) for _, y, w in lower)
    if dy < 0:
        return None  # more tokens never make a pass cheaper: these medians are noise, not a slope
    slope = dy / dx
    return _weighted_median((y - slope * x, w) for x, y, w in ordered), slope


def _prior_line(x: float, y: float, prior_slope: float) -> tuple[float, float]:
    """The line through (x, y) whose slope is prior_slope * base: all that one point can tell."""
    base = y / (1.0 + prior_slope * x)
    return base, prior_slope * base


def _best_drafting_k(
    alpha: float, t_draft: float, base: float, slope: float, k_lo: int, k_hi: int
) -> tuple[int, float]:
    """The K in k_lo..k_hi with the least expected time per token under T_target(K) = base + slope * K,
    and that time. With linear costs and the geometric E the time per token falls, then rises, so the
    scan stops at the first K that does not improve (O(best K), whatever k_hi is)."""
    best_k, best_t = k_lo, time_per_token(alpha, k_lo, t_draft, base + slope * k_lo)
    for k in range(k_lo + 1, k_hi + 1):
        t = time_per_token(alpha, k, t_draft, base + slope * k)
        if t >= best_t or alpha**k < 1e-6:  # past the minimum, or one more draft adds ~nothing
            break
        best_k, best_t = k, t
    return best_k, best_t


class _Recent:
    """The last `size` (step, value) samples, none older than `horizon` steps, and their median.

    Bounded in count and in age, so a change in machine load shows within a window."""

    def __init__(self, size: int, horizon: int) -> None:
        self._items: deque[tuple[int, float]] = deque(maxlen=size)
        self._horizon = horizon
        self.median = 0.0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def newest(self) -> int:
        """The step of the newest sample."""
        return self._items[-1][0]

    def add(self, step: int, value: float) -> None:
        self._items.append((step, value))
        self.expire(step, force=True)

    def expire(self, step: int, force: bool = False) -> None:
        """Drop samples older than the horizon; refresh the median when anything changed."""
        changed = force
        while self._items and self._items[0][0] <= step - self._horizon:
            self._items.popleft()
            changed = True
        if changed and self._items:
            self.median = _median(value for _, value in self._items)


class PassCosts:
    """Recent verify seconds per drafted count and draft seconds per drafted position, in windows
    bounded in count (`window`) and age (`horizon` steps): shared by the generations of a decoder,
    so each one starts from what the machine measured before instead of from a guess."""

    def __init__(self, window: int = 24, horizon: int = 128) -> None:
        self.window, self.horizon = window, horizon
        self.verify: dict[int, _Recent] = {}  # drafted count -> recent verify seconds
        self.draft = _Recent(window, horizon)  # recent draft seconds per drafted position
        self.step = 0

    def add(self, drafted: int, verify_time: float, draft_time: float) -> None:
        self.step += 1
        for recent in self.verify.values():
            recent.expire(self.step)
        self.verify = {count: recent for count, recent in self.verify.items() if len(recent)}
        self.verify.setdefault(drafted, _Recent(self.window, self.horizon)).add(self.step, verify_time)
        if drafted:
            self.draft.add(self.step, draft_time / drafted)


class CostModelK:
    """Pick the K (0: no draft) with the least expected time per token, from what recent steps measured.

    alpha: accepted / tested draft positions (a chain tests drafts up to and including its first
    rejection), exponentially weighted, plus a weak prior of two pseudo-tests. T_draft: the median
    seconds per draft position. T_target(K) = base + slope * K: a resistant line through the median
    verify time of each drafted count with min_samples recent passes, weighted by their number; with
    fewer than two such counts the slope is prior_slope * base (an 8-token pass costing 1.3x a
    1-token one). K = 0 costs the median plain pass when there are min_samples of them, else base.
    Samples live in windows of `window` per count and age out after `horizon` steps, so K follows a
    change in machine load. Exploration is deterministic: while K = 0 wins, the best K > 0 is tried
    every probe_every steps (and again at once while a probe's tokens came cheaper than a plain
    pass); while drafting wins, K = 0 is measured when recent plain passes are too few.
    For trees, K and the counts are draft positions (depths), as the engine's K is the depth.
    """

    def __init__(
        self,
        k_start: int,
        k_min: int = 1,
        k_max: int = 16,
        prior_alpha: float = 0.5,
        prior_slope: float = DEFAULT_PRIOR_SLOPE,
        window: int = 24,
        horizon: int = 128,
        probe_every: int = 16,
        alpha_memory: float = 64.0,
        min_samples: int = 3,
        costs: PassCosts | None = None,
    ) -> None:
        self.k = k_start
        self.k_min, self.k_max = k_min, k_max
        self.prior_slope = prior_slope
        self.probe_every, self.min_samples = probe_every, min_samples
        self.prior_accepted, self.prior_tested = prior_alpha * 2, 2.0  # a weak prior: two pseudo-tests
        self.accepted = self.tested = 0.0  # exponentially weighted counts
        self._decay = 1.0 - 1.0 / alpha_memory  # per tested position
        self.costs = costs if costs is not None else PassCosts(window, horizon)
        self._since_plain = self._since_draft = 0  # steps since a pass with 0 / with > 0 drafted
        self._probe_plain: float | None = None  # the plain cost a pending K > 0 probe must beat
        self._follow_up = False  # the last probe paid: probe again

    @property
    def alpha(self) -> float:
        return (self.prior_accepted + self.accepted) / (self.prior_tested + self.tested)

    @property
    def _verify(self) -> dict[int, _Recent]:
        return self.costs.verify

    @property
    def _draft(self) -> _Recent:
        return self.costs.draft

    def next_k(self) -> int:
        if not self._verify:
            return self.k  # nothing measured yet: the caller's K
        k_lo = max(1, self.k_min)
        if self.k_max < k_lo:
            return 0
        base, slope = self._target_cost()
        plain = self._plain_cost(base)
        t_draft = self._draft.median if len(self._draft) else 0.0  # kept while K = 0: stale beats unknown
        k_best, t_best = _best_drafting_k(min(self.alpha, 0.999), t_draft, base, slope, k_lo, self.k_max)
        self._probe_plain = None
        # A probe costs its pass over a plain one: probing every probe_every * that ratio steps keeps
        # exploration near 1 / probe_every of the time where passes are dear (a pass of 9 tokens
        # costs 5 plain ones on llama.cpp on a 2-core CPU) as where they are nearly free.
        probe_due = self._since_draft >= self.probe_every * max(1.0, (base + slope * k_best) / plain)
        if t_best < plain:
            self.k = 0 if self._plain_due() else k_best
        elif probe_due or self._follow_up:
            self.k, self._probe_plain = k_best, plain  # alpha is only learned by drafting
        else:
            self.k = 0
        return self.k

    def update(self, step: StepRecord) -> None:
        drafted = step.draft_positions
        self.costs.add(drafted, step.verify_time, step.draft_time)
        if drafted == 0:
            self._since_plain, self._since_draft = 0, self._since_draft + 1
            return  # nothing drafted: nothing learned about alpha or draft cost
        self._since_plain, self._since_draft = self._since_plain + 1, 0
        tested = _tested(step.accepted, drafted)
        # Weighted per tested position, not per step: alpha follows the drafter's recent behaviour (the
        # last ~alpha_memory positions) yet does not forget while K = 0 tests nothing.
        fade = self._decay**tested
        self.accepted = self.accepted * fade + step.accepted
        self.tested = self.tested * fade + tested
        if self._probe_plain is not None:
            self._follow_up = (step.draft_time + step.verify_time) / (step.accepted + 1) < self._probe_plain
            self._probe_plain = None

    def _plain_due(self) -> bool:
        """Measure K = 0 while drafting, every probe_every // 4 steps, while recent plain passes are too
        few (they age out) or their median is implausible (dearer than a pass that drafts)."""
        plain = self._verify.get(0)
        if plain is None or len(plain) < self.min_samples or plain.median > self._cheapest_drafted():
            return self._since_plain >= max(1, self.probe_every // 4)
        return False

    def _plain_cost(self, base: float) -> float:
        """Seconds per plain pass: the median of recent ones when there are enough, else the intercept.

        Never above a drafted count's median: a 1-token pass is not dearer than a longer one, so a
        plain median above them is a burst of slow passes (it would lock K = 0 out until it ages)."""
        plain = self._verify.get(0)
        if plain is None or len(plain) < self.min_samples:
            return base
        return min(plain.median, self._cheapest_drafted())

    def _cheapest_drafted(self) -> float:
        """The least median verify time among drafted counts with enough samples (inf when none)."""
        return min(
            (r.median for c, r in self._verify.items() if c > 0 and len(r) >= self.min_samples), default=float("inf")
        )

    def _target_cost(self) -> tuple[float, float]:
        """(base, slope) of T_target(K) = base + slope * K, from the median verify time per drafted count.

        Plain passes (0 drafted) stay out of the line: they are priced by their own median, and a
        pass that drafts may cost more than the line through 0 says (a 1-token fast path)."""
        drafted = {c: r for c, r in self._verify.items() if c > 0}
        line = _resistant_line(
            [(float(c), r.median, float(len(r))) for c, r in drafted.items() if len(r) >= self.min_samples]
        )
        if line is not None and line[0] > 0:
            return line
        # One count cannot show the slope (and counts measured under different loads can show a
        # nonsense one): assume the prior slope, through the best-sampled count, the newest on a tie.
        if not drafted:
            return _prior_line(0.0, self._verify[0].median, self.prior_slope)
        count, recent = max(drafted.items(), key=lambda item: (len(item[1]), item[1].newest))
        return _prior_line(float(count), recent.median, self.prior_slope)


DRAFT_LENGTHS = ("fixed", "adaptive", "cost")


def prior_slope(pass_ms: dict[int, float] | None) -> float:
    """slope / base of T_target(K) = base + slope * K through measured pass costs (ms per pass of n = K + 1
    tokens): what the cost model assumes until its own passes show the slope."""
    if not pass_ms:
        return DEFAULT_PRIOR_SLOPE
    line = _resistant_line([(float(n - 1), ms, 1.0) for n, ms in pass_ms.items() if n >= 2])
    return line[1] / line[0] if line is not None and line[0] > 0 else DEFAULT_PRIOR_SLOPE


def make_draft_length(
    kind: str, k: int, k_max: int = 16, costs: PassCosts | None = None, slope: float = DEFAULT_PRIOR_SLOPE
) -> DraftLength:
    """A fresh policy for one generation; k is the starting (or fixed) K. costs: the timings the
    cost model shares with the decoder's other generations (None: its own). slope: the cost model's
    prior slope / base (see prior_slope)."""
    if kind == "fixed":
        return FixedK(k)
    if kind == "adaptive":
        return AdaptiveK(k, k_max=max(k, k_max))
    if kind == "cost":
        return CostModelK(k, k_max=max(k, k_max), prior_slope=slope, costs=costs)
    raise QuickdraftError(f"unknown draft length policy {kind!r}; choose one of: {', '.join(DRAFT_LENGTHS)}")
