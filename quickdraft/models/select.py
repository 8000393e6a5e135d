"""Which runner runs a model: the native one for supported architectures, else transformers."""

from __future__ import annotations

from quickdraft.errors import QuickdraftError
from quickdraft.models.gguf_blocks import cached_int4_blocks
from quickdraft.models.layer_subset import layer_subset_model
from quickdraft.models.loading import LoadedModel
from quickdraft.models.native import SUPPORTED_ARCHITECTURES, NativeRunner, NativeWeights, supports
from quickdraft.models.precision import get_precision
from quickdraft.models.runner import HFRunner, Runner

RUNNERS = ("auto", "native", "hf")


def check_runner_kind(kind: str) -> None:
    if kind not in RUNNERS:
        raise QuickdraftError(f"unknown runner {kind!r}; choose one of: {', '.join(RUNNERS)}")


def uses_native(loaded: LoadedModel, kind: str) -> bool:
    """auto: native when the architecture is supported; native: required; hf: never."""
    check_runner_kind(kind)
    if kind == "native" and not supports(loaded.model):
        raise QuickdraftError(f"the native runner supports {', '.join(SUPPORTED_ARCHITECTURES)}; "
                              f"{loaded.name!r} is {loaded.model.config.model_type!r} (use runner='hf')")
    return kind == "native" or (kind == "auto" and supports(loaded.model))


def check_precision(precision: str, kind: str) -> None:
    get_precision(precision)
    if precision != "fp32" and kind == "hf":
        raise QuickdraftError(f"precision {precision} needs the native runner (runner='auto' or 'native')")


def make_runner(loaded: LoadedModel, kind: str = "auto", layers: list[int] | None = None,
                precision: str = "fp32", keep_hidden: bool = False) -> Runner:
    """A runner for `loaded` (only `layers` of it, for self-speculation). Native weights are
    extracted once per loaded model and precision, and shared by every runner over them.
    keep_hidden: the runner keeps its last hidden states (native runners always do)."""
    check_precision(precision, kind)
    if uses_native(loaded, kind):
        if precision not in loaded.native:
            loaded.native[precision] = native_weights(loaded, precision)
        return NativeRunner(loaded.native[precision], layers)
    if precision != "fp32":
        raise QuickdraftError(f"precision {precision} needs the native runner, which does not support "
                              f"{loaded.model.config.model_type!r}")
    if layers is None:
        return HFRunner(loaded.model, keep_hidden=keep_hidden)
    # The view's cache uses the full model's layout: each kept layer writes its own slot.
    return HFRunner(layer_subset_model(loaded.model, layers), cache_config=loaded.model.config)


def native_weights(loaded: LoadedModel, precision: str) -> NativeWeights:
    """Weights at `precision`; int4 from a GGUF file takes the file's own 4-bit blocks."""
    blocks = None
    if precision == "int4" and loaded.gguf is not None and loaded.converted is not None:
        blocks = cached_int4_blocks(loaded.gguf, loaded.model, loaded.converted / "int4_blocks.safetensors")
    return NativeWeights.from_model(loaded.model, precision, int4_blocks=blocks)
