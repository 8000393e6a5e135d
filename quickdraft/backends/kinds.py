"""The backends, each described once: what it computes with, where, what it runs, and how its
memory is laid out. backends/select.py decides from these traits, memory.py counts from them, and
the options, the CLI and `quickdraft plan` take their names and choices from here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from transformers import PretrainedConfig

from quickdraft.backends.hf import HFBackend
from quickdraft.backends.llama_cpp import DEFAULT_CELLS, LlamaCppBackend, records_layer_inputs
from quickdraft.backends.native import NativeBackend
from quickdraft.backends.static import StaticBackend
from quickdraft.errors import QuickdraftError
from quickdraft.models.native_weights import GEMMA3, SUPPORTED_ARCHITECTURES, supports

AUTO, NATIVE, HF, LLAMA_CPP, STATIC = "auto", "native", "hf", "llama.cpp", "static"
GGUF = "gguf"  # the llama.cpp backend's precision: the GGUF file's own tensor types
DENSE = ("fp32", "bf16")
STATIC_ROWS = 64  # rows of every static pass: EAGLE-2's 60-node trees fit, and on a GPU 64 rows cost what 1 does


def static_supports(config: PretrainedConfig, precision: str | None = None) -> bool:
    """The static backend: the native architectures but Gemma 3 (its fixed-shape attention has no windows yet)."""
    return supports(config, precision) and config.model_type != GEMMA3


def any_architecture(config: PretrainedConfig, precision: str | None = None) -> bool:
    return True


def every_model(config: PretrainedConfig) -> bool:
    return True


@dataclass(frozen=True)
class BackendTraits:
    """One backend: its choices, what it runs, and the layout memory.py counts."""

    name: str
    backend: type  # the class that runs passes (select.make_backend builds it)
    summary: str  # one line for --help and `quickdraft plan`
    precisions: tuple[str, ...]  # what it may compute with
    devices: tuple[str, ...]  # device types it runs on
    architectures: Callable[[PretrainedConfig, str | None], bool]  # does it run this config (at a precision)
    architecture_names: str  # what `architectures` accepts, for errors
    needs_gguf: bool = False  # runs GGUF files only, which it opens itself
    inner_layers: Callable[[PretrainedConfig], bool] = every_model  # returns inner layers' states (EAGLE-3 reads them)
    subset: str | None = None  # the backend a layer subset of it runs on (self-speculation; None: itself)
    weights: str = "tensors"  # "file": the GGUF file mapped; "transformers": a transformers model; "tensors": its own
    kv: str = "fp32"  # how a token's keys and values are stored: "fp32", "f16" or "activations" (the precision's)
    kv_ones: bool = False  # values carry a ones column below fp32 (native's row-invariant attention)
    shared_kv: bool = False  # one KV pool for all sequences, allocated up front
    rows: int | None = None  # every pass has this many rows (its KV reserves them beside the context)
    pool_cells: int | None = None  # the shared pool's default size, at most the model's context
    packed: bool = False  # oneDNN keeps packed copies of fp32 linear weights on a CPU

    def check_precision(self, precision: str) -> None:
        if precision in self.precisions:
            return
        if self.precisions == (GGUF,):
            raise QuickdraftError(
                f"the {self.name} backend computes with the GGUF file's own types; precision "
                f"{precision} needs the native backend"
            )
        if precision == GGUF:
            raise QuickdraftError(
                f"precision gguf is the llama.cpp backend's (backend='llama.cpp' or 'auto'), "
                f"not the {self.name} backend's"
            )
        raise QuickdraftError(
            f"the {self.name} backend computes at {', '.join(self.precisions)}, not {precision}"
            + (
                "; use the native backend (backend='auto' or 'native')"
                if precision in TRAITS[NATIVE].precisions
                else ""
            )
        )

    def check_architecture(self, config: PretrainedConfig, name: str) -> None:
        if not self.architectures(config, None):
            raise QuickdraftError(
                f"the {self.name} backend supports {self.architecture_names}; {name!r} is "
                f"{getattr(config, 'model_type', None)!r}" + ("" if self.name == HF else " (use backend='hf')")
            )


TRAITS: dict[str, BackendTraits] = {
    traits.name: traits
    for traits in (
        BackendTraits(
            NATIVE,
            NativeBackend,
            "quickdraft's own passes, bit-exact rows at every precision",
            precisions=("fp32", "bf16", "int8", "int4"),
            devices=("cpu", "cuda"),
            architectures=supports,
            architecture_names=", ".join(SUPPORTED_ARCHITECTURES),
            kv_ones=True,
            packed=True,
        ),
        BackendTraits(
            HF,
            HFBackend,
            "transformers' own forward, in the checkpoint's dtype unless asked",
            precisions=("fp32", "bf16", "fp16"),
            devices=("cpu", "cuda"),
            architectures=any_architecture,
            architecture_names="every transformers causal LM",
            weights="transformers",
            kv="activations",
        ),
        BackendTraits(
            LLAMA_CPP,
            LlamaCppBackend,
            "GGUF files on llama.cpp's kernels",
            precisions=(GGUF,),
            devices=("cpu",),
            architectures=any_architecture,
            architecture_names="what llama.cpp runs",
            needs_gguf=True,
            inner_layers=records_layer_inputs,
            subset=NATIVE,
            weights="file",
            kv="f16",
            shared_kv=True,
            pool_cells=DEFAULT_CELLS,
        ),
        BackendTraits(
            STATIC,
            StaticBackend,
            "fixed-shape passes over dense weights (CUDA graphs on a GPU)",
            precisions=DENSE,
            devices=("cpu", "cuda"),
            architectures=static_supports,
            architecture_names=", ".join(a for a in SUPPORTED_ARCHITECTURES if a != GEMMA3),
            kv="activations",
            rows=STATIC_ROWS,
        ),
    )
}
BACKENDS = (AUTO, *TRAITS)


def traits_of(kind: str) -> BackendTraits:
    """The traits of a backend named by the user (not "auto"), or a clear error."""
    if kind not in TRAITS:
        raise QuickdraftError(f"unknown backend {kind!r}; choose one of: {', '.join(BACKENDS)}")
    return TRAITS[kind]


def traits_for(backend: object) -> BackendTraits:
    """The traits of a backend object (a layer subset's is its whole model's)."""
    for traits in TRAITS.values():
        if isinstance(backend, traits.backend):
            return traits
    raise QuickdraftError(f"{type(backend).__name__} is not one of quickdraft's backends")


def check_backend_kind(kind: str) -> None:
    if kind != AUTO:
        traits_of(kind)


def all_precisions() -> tuple[str, ...]:
    """Every precision some backend computes with (the option's choices)."""
    return tuple(dict.fromkeys(p for traits in TRAITS.values() for p in traits.precisions))


__all__ = [
    "AUTO",
    "BACKENDS",
    "BackendTraits",
    "DENSE",
    "GGUF",
    "HF",
    "LLAMA_CPP",
    "NATIVE",
    "STATIC",
    "STATIC_ROWS",
    "TRAITS",
    "all_precisions",
    "check_backend_kind",
    "static_supports",
    "traits_for",
    "traits_of",
]
