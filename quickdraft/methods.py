"""The drafting methods a user can name, and the default K of each.

Adding a method is one entry in METHODS: a builder from the loaded models to a Drafter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from quickdraft.drafters import DraftModelDrafter, Drafter, NoDrafter, PromptLookupDrafter
from quickdraft.errors import QuickdraftError
from quickdraft.models.runner import HFRunner, Runner


@dataclass(frozen=True)
class DrafterOptions:
    """Everything a drafter builder may need."""

    draft_runner: Runner | None = None
    max_ngram: int = 3
    min_ngram: int = 2
    confidence: float | None = None  # draft model: stop drafting below this top probability


@dataclass(frozen=True)
class Method:
    build: Callable[[DrafterOptions], Drafter]
    default_k: int
    needs_draft_model: bool = False
    speculative: bool = True


def _build_draft(options: DrafterOptions) -> Drafter:
    if options.draft_runner is None:
        raise QuickdraftError('method "draft" needs a draft model (pass draft=... or --draft)')
    return DraftModelDrafter(options.draft_runner, options.confidence)


METHODS: dict[str, Method] = {
    "none": Method(lambda options: NoDrafter(), default_k=0, speculative=False),
    "draft": Method(_build_draft, default_k=4, needs_draft_model=True),
    "prompt-lookup": Method(
        lambda options: PromptLookupDrafter(options.max_ngram, options.min_ngram), default_k=8
    ),
}


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise QuickdraftError(f"unknown method {name!r}; choose one of: {', '.join(METHODS)}")
    return METHODS[name]


def default_method(has_draft_model: bool) -> str:
    """The fastest method available (see BENCHMARKS.md): a draft model if given, else prompt lookup."""
    return "draft" if has_draft_model else "prompt-lookup"


def make_runner(model) -> Runner:
    """The runner for a loaded model."""
    return HFRunner(model)
