"""How many tokens to draft each step: fixed, adaptive (grow/shrink), or chosen by a cost model.

A policy is made fresh for every generation; the engine asks next_k() before a step and
reports the step back with update(). The engine still caps K at the tokens left to produce.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from quickdraft.analysis import time_per_token
from quickdraft.errors import QuickdraftError
from quickdraft.stats import StepRecord


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


class CostModelK:
    """Pick the K that maximises expected tokens per second, from what the steps measured.

    alpha: accepted / tested drafts (a chain tests drafts up to and including its first
    rejection, so this is the per-token acceptance of the i.i.d. model).
    T_draft: seconds per draft token. T_target(K) = base + slope * K, fitted by least squares
    to the measured passes; until two different K have been seen the slope is assumed to be
    prior_slope * base (a verify pass of 8 tokens costing 1.3x a 1-token pass).
    """

    def __init__(self, k_start: int, k_min: int = 1, k_max: int = 16, prior_alpha: float = 0.5,
                 prior_slope: float = 0.04) -> None:
        self.k = k_start
        self.k_min, self.k_max = k_min, k_max
        self.prior_slope = prior_slope
        self.accepted, self.tested = prior_alpha * 2, 2.0  # a weak prior: two pseudo-tests
        self.draft_seconds, self.draft_tokens = 0.0, 0
        self._n = self._sx = self._sy = self._sxx = self._sxy = 0.0  # regression sums

    @property
    def alpha(self) -> float:
        return self.accepted / self.tested

    def next_k(self) -> int:
        if self._n == 0:
            return self.k
        base, slope = self._target_cost()
        t_draft = self.draft_seconds / self.draft_tokens if self.draft_tokens else 0.0
        alpha = min(self.alpha, 0.999)
        candidates = range(self.k_min, self.k_max + 1)
        self.k = min(candidates, key=lambda k: time_per_token(alpha, k, t_draft, base + slope * k))
        return self.k

    def update(self, step: StepRecord) -> None:
        drafted = len(step.draft_tokens)
        self.accepted += step.accepted
        self.tested += step.accepted + (1 if step.accepted < drafted else 0)
        self.draft_seconds += step.draft_time
        self.draft_tokens += drafted
        x, y = float(drafted), step.verify_time
        self._n += 1
        self._sx += x
        self._sy += y
        self._sxx += x * x
        self._sxy += x * y

    def _target_cost(self) -> tuple[float, float]:
        """(base, slope) of T_target(K) = base + slope * K."""
        variance = self._n * self._sxx - self._sx**2
        if variance > 1e-9:
            slope = (self._n * self._sxy - self._sx * self._sy) / variance
            base = (self._sy - slope * self._sx) / self._n
            if base > 0 and slope >= 0:
                return base, slope
        mean_k, mean_t = self._sx / self._n, self._sy / self._n
        base = mean_t / (1.0 + self.prior_slope * mean_k)
        return base, self.prior_slope * base


DRAFT_LENGTHS = ("fixed", "adaptive", "cost")


def make_draft_length(kind: str, k: int, k_max: int = 16) -> DraftLength:
    """A fresh policy for one generation; k is the starting (or fixed) K."""
    if kind == "fixed":
        return FixedK(k)
    if kind == "adaptive":
        return AdaptiveK(k, k_max=max(k, k_max))
    if kind == "cost":
        return CostModelK(k, k_max=max(k, k_max))
    raise QuickdraftError(f"unknown draft length policy {kind!r}; choose one of: {', '.join(DRAFT_LENGTHS)}")
