"""Which backend runs a model, on which device: built once per loaded model and reused."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from quickdraft.backends.base import Backend
from quickdraft.backends.hf import HFBackend
from quickdraft.backends.native import NativeBackend
from quickdraft.backends.shapes import measure_dense_kernel, measure_pad_plan, measure_row_plan
from quickdraft.errors import QuickdraftError
from quickdraft.models.gguf_blocks import cached_int4_blocks
from quickdraft.models.layer_subset import layer_subset_model
from quickdraft.models.loading import LoadedModel, default_cache_dir
from quickdraft.models.native import SUPPORTED_ARCHITECTURES, NativeWeights, supports
from quickdraft.models.precision import PRECISIONS, get_precision

BACKENDS = ("auto", "native", "hf")
DEVICES = ("auto", "cpu", "cuda")


def resolve_device(device: str | torch.device) -> torch.device:
    """"auto": the GPU when CUDA is present, else the CPU; "cuda" (or "cuda:N") must be present."""
    name = str(device)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name != "cpu" and not name.startswith("cuda"):
        raise QuickdraftError(f"unknown device {name!r}; choose one of: {', '.join(DEVICES)}")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise QuickdraftError(f"device {name!r} asked for, but this machine has no CUDA device (use cpu or auto)")
    return torch.device(name)


def default_precision(device: torch.device) -> str:
    """bf16 on a GPU (its fast path), fp32 on a CPU (exact against transformers)."""
    return "bf16" if device.type == "cuda" else "fp32"


def check_backend_kind(kind: str) -> None:
    if kind not in BACKENDS:
        raise QuickdraftError(f"unknown backend {kind!r}; choose one of: {', '.join(BACKENDS)}")


def check_precision(precision: str, kind: str) -> None:
    get_precision(precision)
    if precision != "fp32" and kind == "hf":
        raise QuickdraftError(f"precision {precision} needs the native backend (backend='auto' or 'native')")


def uses_native(loaded: LoadedModel, kind: str) -> bool:
    """auto: native when the architecture is supported; native: required; hf: never."""
    check_backend_kind(kind)
    if kind == "native" and not supports(loaded.model):
        raise QuickdraftError(f"the native backend supports {', '.join(SUPPORTED_ARCHITECTURES)}; "
                              f"{loaded.name!r} is {loaded.model.config.model_type!r} (use backend='hf')")
    return kind == "native" or (kind == "auto" and supports(loaded.model))


def make_backend(loaded: LoadedModel, kind: str = "auto", precision: str = "fp32", device: str = "cpu",
                 layers: list[int] | None = None, measure: bool = True,
                 cache_dir: str | os.PathLike | None = None) -> Backend:
    """The backend for `loaded` (only `layers` of it, for self-speculation), made once per setting
    and kept in `loaded.backends`: every decoder over the model shares it. measure: time pass
    shapes on this machine (once, cached under cache_dir) and use the fastest."""
    check_precision(precision, kind)
    device = resolve_device(device)
    native = uses_native(loaded, kind)
    key = ("native" if native else "hf", precision, str(device), tuple(layers) if layers else None, measure)
    if key in loaded.backends:
        return loaded.backends[key]
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if layers is not None:  # a layer subset shares the whole model's weights and measured shapes
        whole = make_backend(loaded, kind, precision, str(device), None, measure, cache_dir)
    if native:
        if layers is not None:
            backend = NativeBackend(whole.weights, loaded.name, loaded.tokenizer, loaded.eos_ids, layers, whole.plan)
        else:
            weights = native_weights(loaded, precision, device, folder / "pass_shapes" if measure else None)
            backend = NativeBackend(weights, loaded.name, loaded.tokenizer, loaded.eos_ids)
            if measure:
                backend.plan = measure_row_plan(weights, folder / "pass_shapes")
    else:
        if precision != "fp32":
            raise QuickdraftError(f"precision {precision} needs the native backend, which does not support "
                                  f"{loaded.model.config.model_type!r}")
        if device.type != "cpu":
            loaded.model.to(device)  # transformers runs the model where its weights are
        if layers is not None:
            # The view's cache uses the full model's layout: each kept layer writes its own slot.
            backend = HFBackend(layer_subset_model(loaded.model, layers), loaded.name, loaded.tokenizer,
                                loaded.eos_ids, cache_config=loaded.model.config, plan=whole.plan)
        else:
            backend = HFBackend(loaded.model, loaded.name, loaded.tokenizer, loaded.eos_ids)
            if measure:
                backend.plan = measure_pad_plan(backend, folder / "pass_shapes")
    loaded.backends[key] = backend
    return backend


def native_weights(loaded: LoadedModel, precision: str, device: torch.device,
                   shapes: Path | None = None) -> NativeWeights:
    """Weights at `precision` on `device`, extracted once; int4 from a GGUF file takes the file's own
    4-bit blocks. shapes: where measured kernel choices live (bf16 on a CPU: multiplied as bf16 or
    widened to fp32, whichever this machine does faster); None: bf16 as it is."""
    dense = "bf16"
    if shapes is not None and precision == "bf16" and device.type == "cpu":
        dense = measure_dense_kernel(loaded.model, shapes)
    key = (precision, str(device), dense)
    if key not in loaded.native:
        blocks = None
        if precision == "int4" and loaded.gguf is not None and loaded.converted is not None:
            blocks = cached_int4_blocks(loaded.gguf, loaded.model, loaded.converted / "int4_blocks.safetensors")
        loaded.native[key] = NativeWeights.from_model(loaded.model, precision, int4_blocks=blocks, device=device,
                                                      dense_kernel=dense)
    return loaded.native[key]


__all__ = ["BACKENDS", "DEVICES", "PRECISIONS", "check_backend_kind", "check_precision", "default_precision",
           "make_backend", "native_weights", "resolve_device", "uses_native"]
