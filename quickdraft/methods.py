"""The drafting methods a user can name, their defaults, and one validated configuration.

Adding a method is one entry in METHODS: a builder from the loaded parts to a Drafter. Its
options are declared once in options.py; `configure` checks a user's settings against both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quickdraft.analysis import tree_budget
from quickdraft.backends.backend import Backend
from quickdraft.drafters import Drafter, DraftModelDrafter, LookaheadDrafter, NoDrafter, PromptLookupDrafter
from quickdraft.drafters.cross_vocab import CrossVocabDrafter, VocabMap
from quickdraft.drafters.eagle import EagleDrafter
from quickdraft.drafters.head_tree import DEFAULT_TOP_K, tree_shape_for
from quickdraft.drafters.lookup_branch import LookupBranch
from quickdraft.drafters.medusa import MedusaDrafter
from quickdraft.drafters.suffix import SuffixDrafter, SuffixPools
from quickdraft.errors import QuickdraftError
from quickdraft.heads.export import is_export
from quickdraft.heads.format import read_config
from quickdraft.heads.inference import draft_kernel, for_drafting
from quickdraft.heads.store import head_folder, load_head
from quickdraft.models.layer_subset import resolve_layers
from quickdraft.models.loading import LoadedModel, other_tokenizer
from quickdraft.options import OPTION, OPTIONS, checked, parse_spec


@dataclass
class Parts:
    """What drafters are built from: the loaded models, the target's backend, and a way to get
    another backend of the same kind, precision and device (a draft model, a layer subset)."""

    target: LoadedModel
    draft: LoadedModel | None
    target_backend: Backend
    backend_for: Callable[[LoadedModel, list[int] | None], Backend]
    shapes: Path | None = None  # where kernel choices measured on this machine are cached (None: measure none)


@dataclass(frozen=True)
class Method:
    build: Callable[[Parts, MethodConfig], Drafter]
    default_k: int
    needs_draft_model: bool = False
    speculative: bool = True
    drafts_trees: bool = False  # verifies token trees: acceptance is not the chain's alpha
    default_draft_length: str = "fixed"  # "cost" where K should follow the machine's pass costs
    needs_hidden: bool = False  # drafts from the target's hidden states


@dataclass(frozen=True)
class MethodConfig:
    """A method and every option's value, checked once: one typed field per option of OPTIONS, in
    its order (tests/test_options.py checks they match). given: the settings the user named, so
    another method can start from the same choices."""

    method: str
    k: int
    draft_length: str
    k_max: int
    confidence: float | None
    max_ngram: int
    min_ngram: int
    layers: int | tuple[int, ...] | str | None
    window: int
    ngram: int
    candidates: int
    max_match: int
    spec_factor: float
    min_prob: float
    shared_tokens: int
    share_prompts: bool
    head: str | None
    tree_top_k: int | None
    tree_nodes: int | None
    tree: str
    lookup: bool
    full_vocab: bool
    sampler: str
    backend: str
    precision: str | None
    device: str
    context: int | None
    given: tuple[tuple[str, Any], ...] = ()

    @property
    def definition(self) -> Method:
        return METHODS[self.method]

    def settings(self) -> dict[str, Any]:
        """Every option's value, by name."""
        return {option.name: getattr(self, option.name) for option in OPTIONS}

    def label(self) -> str:
        """METHOD[:key=value,...] of what the user set (the spec that gives this config back)."""
        text = ",".join(f"{key}={'+'.join(map(str, v)) if isinstance(v, tuple) else v}" for key, v in self.given)
        return f"{self.method}:{text}" if text else self.method


def configure(method: str | None, has_draft_model: bool, **settings: Any) -> MethodConfig:
    """The one place settings are validated: the method (a name or a METHOD:key=value spec), option
    names, values and bounds, whether the method reads each option, whether it needs a draft model."""
    if method is not None and ":" in method:
        [(_, method, from_spec)] = parse_spec(method)
        twice = sorted(set(from_spec) & {k for k, v in settings.items() if v is not None})
        if twice:
            raise QuickdraftError(f"option {twice[0]!r} is given twice (in the method spec and on its own)", twice[0])
        settings = settings | from_spec
    name = method or default_method(has_draft_model)
    definition = get_method(name)
    given = checked(settings)
    for key in given:
        readers = OPTION[key].methods
        if readers and name not in readers and definition.speculative:
            raise QuickdraftError(
                f"option {key!r} does not apply to method {name!r} (it is for {', '.join(readers)})", key
            )
    if definition.needs_draft_model and not has_draft_model:
        raise QuickdraftError(f'method "{name}" needs a draft model (pass draft=... or --draft)', "method")
    values = {option.name: option.default for option in OPTIONS} | given
    values["k"] = (values["k"] if values["k"] is not None else default_k(name, values)) if definition.speculative else 0
    values["draft_length"] = values["draft_length"] or definition.default_draft_length
    return MethodConfig(name, **values, given=tuple(given.items()))


def default_k(name: str, values: dict[str, Any]) -> int:
    """The method's K; EAGLE's tree of nodes the user fixed drafts deeper as they grow."""
    if name == "eagle" and values["tree_nodes"]:
        return tree_shape_for(values["tree_nodes"])[0]
    return METHODS[name].default_k


def tree_top_k(config: MethodConfig, nodes: int) -> int:
    """The user's children per node, else EAGLE's width for its tree size (fixed or the budget),
    else Medusa's 4."""
    if config.tree_top_k is not None:
        return config.tree_top_k
    return tree_shape_for(nodes)[1] if config.method == "eagle" else DEFAULT_TOP_K


def _build_draft(parts: Parts, config: MethodConfig) -> Drafter:
    backend = parts.backend_for(parts.draft, None)
    if not other_tokenizer(parts.target, parts.draft):
        return DraftModelDrafter(backend, config.confidence)  # the same ids (load() checked the sizes)
    # Another tokenizer: draft over the tokens both vocabularies spell the same (built once per pair).
    key = ("cross-vocab", id(parts.draft))
    if key not in parts.target.heads:
        parts.target.heads[key] = VocabMap.build(parts.target.tokenizer, parts.draft.tokenizer, backend.vocab_size)
    return CrossVocabDrafter(
        backend, parts.draft.tokenizer, parts.target.heads[key], parts.target_backend.vocab_size, config.confidence
    )


def default_self_spec_layers(target: LoadedModel) -> int:
    """A quarter of the layers (at least 1): a cheap start; layers="auto" measures the best depth."""
    return max(1, target.layers // 4)


def _build_self_spec(parts: Parts, config: MethodConfig) -> Drafter:
    choice = config.layers if config.layers is not None else default_self_spec_layers(parts.target)
    if choice == "auto":
        raise QuickdraftError(
            "layers='auto' is resolved by quickdraft.load (it calibrates); pass a depth here", "layers"
        )
    layers = resolve_layers(parts.target.layers, choice if isinstance(choice, int) else list(choice))
    return DraftModelDrafter(parts.backend_for(parts.target, layers), config.confidence)


def shared_head(kind: str, parts: Parts, config: MethodConfig):
    """The trained head, loaded (and made a drafting copy) once per target, folder and device."""
    device = parts.target_backend.device
    folder = head_folder(kind, parts.target, config.head)
    key = (kind, str(folder.resolve()), config.full_vocab, str(device))
    if key not in parts.target.heads:
        head = load_head(kind, parts.target, folder, config.full_vocab)
        # On a CPU, int8 or int4 drafting copies (whichever PyTorch kernel is faster here); elsewhere
        # the head runs as trained.
        parts.target.heads[key] = (
            for_drafting(head, draft_kernel(head, parts.shapes)) if device.type == "cpu" else head.to(device).eval()
        )
    return parts.target.heads[key]


def reads_inner_layers(target: LoadedModel, config: MethodConfig) -> bool:
    """Whether the method drafts from the target's inner layers (an EAGLE-3 head), which the
    llama.cpp backend does not return. Reads the head's config only."""
    if config.method != "eagle":
        return False
    folder = head_folder("eagle", target, config.head)
    return is_export(folder) or "features" in read_config(folder)["layer"]  # an exported head is EAGLE-3


def tree_nodes(parts: Parts, config: MethodConfig) -> tuple[int, dict[int, float] | None]:
    """The user's tree size (fixed), else the budget the target's measured pass costs allow and
    those costs: each step then keeps the nodes that pay for their rows."""
    if config.tree_nodes:
        return config.tree_nodes, None
    pass_ms = getattr(parts.target_backend, "pass_ms", None)
    return tree_budget(pass_ms), pass_ms


def lookup_branch(config: MethodConfig) -> LookupBranch | None:
    return LookupBranch(config.max_ngram, config.min_ngram, config.k_max) if config.lookup else None


def _build_medusa(parts: Parts, config: MethodConfig) -> Drafter:
    nodes, pass_ms = tree_nodes(parts, config)
    return MedusaDrafter(
        shared_head("medusa", parts, config),
        tree_top_k(config, nodes),
        nodes,
        config.tree,
        pass_ms,
        lookup_branch(config),
    )


def _build_eagle(parts: Parts, config: MethodConfig) -> Drafter:
    nodes, pass_ms = tree_nodes(parts, config)
    return EagleDrafter(
        shared_head("eagle", parts, config),
        parts.target_backend.max_length,
        tree_top_k(config, nodes),
        nodes,
        config.tree,
        pass_ms,
        lookup_branch(config),
    )


def _build_suffix(parts: Parts, config: MethodConfig) -> Drafter:
    return SuffixDrafter(
        config.max_match,
        config.spec_factor,
        config.min_prob,
        SuffixPools(config.shared_tokens, config.share_prompts),
        getattr(parts.target_backend, "pass_ms", None),
    )


METHODS: dict[str, Method] = {
    "none": Method(lambda parts, config: NoDrafter(), default_k=0, speculative=False),
    "draft": Method(_build_draft, default_k=4, needs_draft_model=True),
    "prompt-lookup": Method(
        lambda parts, config: PromptLookupDrafter(config.max_ngram, config.min_ngram),
        default_k=8,
        default_draft_length="cost",
    ),
    "self-spec": Method(_build_self_spec, default_k=4),
    "lookahead": Method(
        lambda parts, config: LookaheadDrafter(config.window, config.ngram, config.candidates),
        default_k=2,  # caps each verified n-gram's length; N - 1 is the most it can use
        drafts_trees=True,
    ),
    # K is the tree's depth; its size follows the match and the measured pass costs.
    "suffix": Method(_build_suffix, default_k=24, drafts_trees=True),
    # K is the tree's depth; tree_nodes its size after reranking.
    "medusa": Method(_build_medusa, default_k=3, drafts_trees=True, needs_hidden=True),
    "eagle": Method(_build_eagle, default_k=5, drafts_trees=True, needs_hidden=True),
}


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise QuickdraftError(f"unknown method {name!r}; choose one of: {', '.join(METHODS)}", "method")
    return METHODS[name]


def default_method(has_draft_model: bool) -> str:
    """The fastest method available (BENCHMARKS.md): a draft model if given, else prompt lookup."""
    return "draft" if has_draft_model else "prompt-lookup"


__all__ = ["METHODS", "Method", "MethodConfig", "Parts", "configure", "default_method", "get_method"]
