"""Every method option a user can give, declared once: name, default, validation, help.

The Python API (`load`, `Decoder`, `with_method`), the CLI flags of generate, serve and bench,
`METHOD:key=value` specs (accepted by all three) and the server's `quickdraft` request object
are all built from OPTIONS, so a default or a bound lives in exactly one place (sampling and run
settings are declared the same way, in settings.py; the Option class is in option.py).
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Mapping
from typing import Any

from quickdraft.backends.kinds import BACKENDS, all_precisions
from quickdraft.errors import QuickdraftError
from quickdraft.option import Option

RENAMED = {"runner": "backend"}  # old name -> new: still taken for one release, with a warning (CHANGELOG.md)
MAX_K = 64  # draft tokens per pass: beyond this a pass costs more than any draft can repay
MAX_TREE_NODES = 256
SAMPLERS = ("gumbel", "rejection")


def parse_layers(text: str) -> int | list[int] | str:
    """'8' -> 8 (the first 8 layers); '0,1,5' or '0+1+5' -> [0, 1, 5] (layers kept); 'auto' -> calibrate."""
    if text == "auto":
        return text
    parts = text.replace("+", ",").split(",")
    try:
        return [int(part) for part in parts] if len(parts) > 1 else int(text)
    except ValueError:
        raise QuickdraftError(
            f"layers must be L, a list of layers (0,1,5 or 0+1+5) or auto; got {text!r}", "layers"
        ) from None


def _check_layers(value: Any) -> int | tuple[int, ...] | str:
    if value == "auto":
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return value  # the model's own layer count bounds it (models/layer_subset.py)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value):
        return tuple(value)
    raise QuickdraftError(f"layers must be L, a list of layers to keep or auto; got {value!r}", "layers")


HEADS = ("eagle", "medusa")
DRAFT_MODELS = ("draft", "self-spec")

OPTIONS: tuple[Option, ...] = (
    Option("k", "draft tokens per target pass (eagle/medusa: the tree's depth); default per method", low=1, high=MAX_K),
    Option(
        "draft_length",
        "fixed K; adaptive (grow after full accepts, shrink after rejections); cost (the K, "
        "or none, that maximises expected tokens/s from measured times); default: cost for prompt-lookup, "
        "else fixed",
        kind=str,
        choices=("fixed", "adaptive", "cost"),
    ),
    Option(
        "k_max",
        "upper bound on K for adaptive and cost; eagle/medusa: the lookup branch's longest chain",
        default=16,
        low=1,
        high=MAX_K,
    ),
    Option(
        "confidence",
        "draft models: stop drafting when the draft's top probability falls below this",
        kind=float,
        low=0.0,
        high=1.0,
        methods=DRAFT_MODELS,
    ),
    Option(
        "max_ngram",
        "prompt lookup (and eagle/medusa's lookup branch): longest n-gram to match",
        default=3,
        low=1,
        high=MAX_K,
        methods=("prompt-lookup", *HEADS),
    ),
    Option(
        "min_ngram",
        "prompt lookup (and eagle/medusa's lookup branch): shortest n-gram to match",
        default=2,
        low=1,
        high=MAX_K,
        methods=("prompt-lookup", *HEADS),
    ),
    Option(
        "layers",
        "self-spec: L (the first L layers), a list of layers to keep (0,1,5), or auto (calibrate); "
        "default a quarter of the layers",
        kind=str,
        methods=("self-spec",),
        parser=parse_layers,
        validate=lambda value: _check_layers(value),
    ),
    Option("window", "lookahead: Jacobi window width W", default=4, low=1, high=MAX_K, methods=("lookahead",)),
    Option("ngram", "lookahead: n-gram size N", default=3, low=2, high=16, methods=("lookahead",)),
    Option(
        "candidates", "lookahead: n-grams verified per pass G", default=4, low=1, high=MAX_K, methods=("lookahead",)
    ),
    Option(
        "max_match",
        "suffix: the longest suffix of the text (tokens) matched against what was written before",
        default=24,
        low=1,
        high=256,
        methods=("suffix",),
    ),
    Option(
        "spec_factor",
        "suffix: draft nodes per matched token (a match of n tokens drafts at most spec_factor x n nodes)",
        kind=float,
        default=1.0,
        low=0.0,
        high=float(MAX_TREE_NODES),
        open_ends=(True, False),
        methods=("suffix",),
    ),
    Option(
        "min_prob",
        "suffix: the least estimated chance for a node to be drafted (how often its continuation "
        "followed the matched text)",
        kind=float,
        default=0.1,
        low=0.0,
        high=1.0,
        open_ends=(False, False),
        methods=("suffix",),
    ),
    Option(
        "shared_tokens",
        "suffix: tokens of earlier sequences' outputs kept to draft from, per tenant (the server's API "
        "key); the oldest go first; 0: each sequence drafts from its own text only",
        default=200_000,
        low=0,
        methods=("suffix",),
    ),
    Option(
        "share_prompts",
        "suffix: keep earlier sequences' prompts beside their outputs",
        kind=bool,
        default=False,
        methods=("suffix",),
    ),
    Option(
        "head",
        "eagle/medusa: folder of a trained head (default: the one shipped for the embedded target)",
        kind=str,
        methods=HEADS,
        sweeps=False,
    ),
    Option(
        "tree_top_k",
        "eagle/medusa: children per expanded node and nodes expanded per tree level (default: 4; "
        "eagle: wider as tree_nodes grows, 8 at 16 nodes, 16 at 64, and K deeper, 6 and 8)",
        low=1,
        high=MAX_K,
        methods=HEADS,
    ),
    Option(
        "tree_nodes",
        "eagle/medusa: draft tokens verified per pass (default: at most as many as a pass "
        "takes for about the price of one token, measured: 4 on a CPU, up to 63 on a GPU; each step keeps "
        "those worth their measured cost)",
        low=1,
        high=MAX_TREE_NODES,
        methods=HEADS,
    ),
    Option(
        "tree",
        "eagle/medusa: dynamic (EAGLE-2: the most confident paths) or static (a fixed shape)",
        kind=str,
        default="dynamic",
        choices=("dynamic", "static"),
        methods=HEADS,
    ),
    Option(
        "lookup",
        "eagle/medusa: add prompt lookup's copy of earlier text to the tree as a branch that "
        "competes with the head's guesses for the verified rows (false: the head's guesses alone)",
        kind=bool,
        default=True,
        methods=HEADS,
    ),
    Option(
        "full_vocab",
        "eagle/medusa: draft over the whole vocabulary, not the head's most frequent tokens",
        kind=bool,
        default=False,
        methods=HEADS,
    ),
    Option(
        "sampler",
        "sampled decoding (temperature > 0): gumbel (each position's random numbers come from the seed and "
        "the position alone, so a seed gives plain decoding's text whatever the method, K, batch or load) or "
        "rejection (speculative sampling's min(1, p/q) test: the same distribution, but the text follows how "
        "many tokens were drafted)",
        kind=str,
        default="gumbel",
        choices=SAMPLERS,
    ),
    Option(
        "backend",
        "auto (on a GPU: static for Llama, Mistral, Qwen2; on a CPU: llama.cpp for a GGUF target "
        "when llama-cpp-python is installed and measured faster here, else native for Llama, Mistral, Qwen2; "
        "else transformers), native, hf (transformers), llama.cpp (GGUF files on llama.cpp's kernels) or static "
        "(fixed-shape passes, CUDA graphs on a GPU)",
        kind=str,
        default="auto",
        choices=BACKENDS,
        model=True,
    ),
    Option(
        "precision",
        "fp32, bf16, int8 (per-channel weights) or int4 (groups of 32; a GGUF's own 4-bit "
        "blocks) on the native backend; fp16 on the hf backend only; gguf: the GGUF file's own types (the "
        "llama.cpp backend); default fp32 on a CPU, bf16 on a GPU (hf: the checkpoint's own dtype)",
        kind=str,
        choices=all_precisions(),
        model=True,
    ),
    Option(
        "device",
        "auto (a CUDA GPU when present, else the CPU), cpu or cuda (cuda:N)",
        kind=str,
        default="auto",
        model=True,
        validate=lambda value: check_device(value),
    ),
    Option(
        "context",
        "llama.cpp backend: tokens its KV pool holds, shared by all sequences and allocated up "
        "front (default: the model's context length, at most 4096); other backends allocate each "
        "sequence's cache as it grows",
        low=1,
        model=True,
    ),
)
OPTION = {option.name: option for option in OPTIONS}
MODEL_OPTIONS = tuple(o.name for o in OPTIONS if o.model)


def current_name(name: str) -> str:
    """An option's name today: an old one (RENAMED) warns and gives its new one."""
    new = RENAMED.get(name)
    if new is None:
        return name
    # FutureWarning, not DeprecationWarning: Python shows it to the people calling the API by default.
    warnings.warn(
        f"option {name!r} is deprecated and is now called {new!r}; the old name stops working in the "
        "next release (see CHANGELOG.md)",
        FutureWarning,
        stacklevel=4,
    )
    return new


def current(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Settings under today's names (old names warn); an old and a new name for one option is an error."""
    for old, new in RENAMED.items():
        if old in settings and new in settings:
            raise QuickdraftError(f"option {old!r} is the old name of {new!r}; give only {new!r}", old)
    named = {}
    for name, value in settings.items():  # a loop, not a comprehension: the warning points at the caller
        named[current_name(name)] = value
    return named


def check_names(settings: Mapping[str, Any]) -> None:
    unknown = sorted(set(settings) - set(OPTION))
    if unknown:
        raise QuickdraftError(f"unknown option {unknown[0]!r}; options are: {', '.join(OPTION)}", unknown[0])


def checked(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Known names, allowed values (None values dropped: None means the default)."""
    check_names(settings)
    return {name: OPTION[name].check(value) for name, value in settings.items() if value is not None}


def check_device(value: Any) -> str:
    value = str(value)
    if value != "auto" and value != "cpu" and not value.startswith("cuda"):
        raise QuickdraftError(f"unknown device {value!r}; choose one of: auto, cpu, cuda", "device")
    return value


def parse_spec(spec: str, expand: bool = False) -> list[tuple[str, str, dict[str, Any]]]:
    """'METHOD[:key=value,...]' -> [(label, method, settings)]. With expand, a value 'a/b/c' gives one
    entry each (the bench's sweeps; not for a path such as head); without, the spec is one entry."""
    method, _, rest = spec.partition(":")
    choices: list[list[tuple[str, Any]]] = []
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not value:
            raise QuickdraftError(f"bad method setting {item!r} in {spec!r}; expected key=value")
        key = current_name(key)
        check_names({key: None})
        values = value.split("/") if expand and OPTION[key].sweeps else [value]
        choices.append([(key, OPTION[key].parse(v)) for v in values])
    expanded = []
    for combination in itertools.product(*choices):
        label = ",".join(f"{key}={_label(value)}" for key, value in combination)
        expanded.append((f"{method}:{label}" if label else method, method, dict(combination)))
    return expanded


def _label(value: Any) -> str:
    return "+".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
