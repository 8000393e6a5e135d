"""The drafting methods a user can name, and the default K of each.

Adding a method is one entry in METHODS: a builder from the loaded models to a Drafter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from quickdraft.drafters import DraftModelDrafter, Drafter, LookaheadDrafter, NoDrafter, PromptLookupDrafter
from quickdraft.drafters.eagle import EagleDrafter
from quickdraft.drafters.medusa import MedusaDrafter
from quickdraft.errors import QuickdraftError
from quickdraft.heads.inference import for_drafting
from quickdraft.heads.store import load_head
from quickdraft.models.layer_subset import decoder_layers, resolve_layers
from quickdraft.models.loading import LoadedModel
from quickdraft.models.runner import Runner


@dataclass(frozen=True)
class DrafterOptions:
    """The user's settings for every drafter; each builder reads the ones it needs."""

    max_ngram: int = 3  # prompt lookup: longest n-gram matched
    min_ngram: int = 2  # prompt lookup: shortest n-gram matched
    confidence: float | None = None  # draft models: stop drafting below this top probability
    layers: int | tuple[int, ...] | None = None  # self-spec: first L layers, or the layers kept
    window: int = 4  # lookahead: Jacobi window width W
    ngram: int = 3  # lookahead: n-gram size N
    candidates: int = 4  # lookahead: n-grams verified per pass G
    head: str | None = None  # eagle/medusa: folder of a trained head (None: the one shipped for the target)
    tree_top_k: int = 4  # eagle/medusa: children per expanded node, nodes expanded per level
    tree_nodes: int = 4  # eagle/medusa: draft tokens verified per pass (the fastest of 4/8/16 here)
    tree: str = "dynamic"  # eagle/medusa: "dynamic" (EAGLE-2) or "static" (a fixed shape of sibling ranks)
    full_vocab: bool = False  # eagle/medusa: draft over the target's whole vocabulary, not the head's slice


RunnerFactory = Callable[..., Runner]  # (loaded model, layers=None) -> a runner for it
Builder = Callable[[LoadedModel, LoadedModel | None, DrafterOptions, RunnerFactory], Drafter]


@dataclass(frozen=True)
class Method:
    build: Builder
    default_k: int
    needs_draft_model: bool = False
    speculative: bool = True
    drafts_trees: bool = False  # verifies token trees: acceptance is not the chain's alpha
    default_draft_length: str = "fixed"  # "cost" where K should follow the machine's pass costs
    needs_hidden: bool = False  # drafts from the target's hidden states


def _build_draft(target: LoadedModel, draft: LoadedModel | None, options: DrafterOptions,
                 make_runner: RunnerFactory) -> Drafter:
    assert draft is not None, "Decoder refuses method draft without a draft model"
    return DraftModelDrafter(make_runner(draft), options.confidence)


def default_self_spec_layers(target: LoadedModel) -> int:
    """A quarter of the layers (at least 1): a cheap start; layers="auto" measures the best depth."""
    return max(1, len(decoder_layers(target.model)) // 4)


def _build_self_spec(target: LoadedModel, draft: LoadedModel | None, options: DrafterOptions,
                     make_runner: RunnerFactory) -> Drafter:
    spec = options.layers if options.layers is not None else default_self_spec_layers(target)
    layers = resolve_layers(target.model, spec if isinstance(spec, int) else list(spec))
    return DraftModelDrafter(make_runner(target, layers=layers), options.confidence)


def _build_medusa(target: LoadedModel, draft: LoadedModel | None, options: DrafterOptions,
                  make_runner: RunnerFactory) -> Drafter:
    head = load_head("medusa", target, options.head, options.full_vocab)
    return MedusaDrafter(for_drafting(head), options.tree_top_k, options.tree_nodes, options.tree)


def _build_eagle(target: LoadedModel, draft: LoadedModel | None, options: DrafterOptions,
                 make_runner: RunnerFactory) -> Drafter:
    head = load_head("eagle", target, options.head, options.full_vocab)
    return EagleDrafter(for_drafting(head), options.tree_top_k, options.tree_nodes, options.tree)


METHODS: dict[str, Method] = {
    "none": Method(lambda target, draft, options, make_runner: NoDrafter(), default_k=0, speculative=False),
    "draft": Method(_build_draft, default_k=4, needs_draft_model=True),
    "prompt-lookup": Method(
        lambda target, draft, options, make_runner: PromptLookupDrafter(options.max_ngram, options.min_ngram),
        default_k=8,
        default_draft_length="cost",
    ),
    "self-spec": Method(_build_self_spec, default_k=4),
    "lookahead": Method(
        lambda target, draft, options, make_runner: LookaheadDrafter(options.window, options.ngram,
                                                                     options.candidates),
        default_k=2,  # caps each verified n-gram's length; N - 1 is the most it can use
        drafts_trees=True,
    ),
    # K is the tree's depth; tree_nodes its size after reranking.
    "medusa": Method(_build_medusa, default_k=3, drafts_trees=True, needs_hidden=True),
    "eagle": Method(_build_eagle, default_k=5, drafts_trees=True, needs_hidden=True),
}


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise QuickdraftError(f"unknown method {name!r}; choose one of: {', '.join(METHODS)}")
    return METHODS[name]


def default_method(has_draft_model: bool) -> str:
    """The fastest method available (BENCHMARKS.md): a draft model if given, else prompt lookup."""
    return "draft" if has_draft_model else "prompt-lookup"

