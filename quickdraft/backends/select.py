"""Which backend runs a model, on which device: built once per loaded model and reused."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from transformers import PretrainedConfig

from quickdraft.backends.base import Backend
from quickdraft.backends.choice import BackendChoice, Timings, cached_backend_choice, observe, time_pairs
from quickdraft.backends.hf import HFBackend
from quickdraft.backends.llama_cpp import LlamaCppBackend, llama_cpp_installed
from quickdraft.backends.native import NativeBackend
from quickdraft.backends.static import StaticBackend
from quickdraft.backends.shapes import (
    cached_choice,
    check_in_place_trees,
    measure_dense_kernel,
    measure_pad_plan,
    measure_pass_costs,
    measure_row_plan,
)
from quickdraft.errors import QuickdraftError
from quickdraft.memory import GIB, available_memory, backend_weight_bytes, human, shape_from_config
from quickdraft.models.layer_subset import layer_subset_model
from quickdraft.models.loading import LoadedModel, default_cache_dir, file_key
from quickdraft.models.native import GEMMA3, SUPPORTED_ARCHITECTURES, NativeWeights, supports
from quickdraft.models.precision import PRECISIONS, get_precision

LLAMA_CPP = "llama.cpp"
GGUF = "gguf"  # the llama.cpp backend's precision: the GGUF file's own tensor types
STATIC = "static"
BACKENDS = ("auto", "native", "hf", LLAMA_CPP, STATIC)
STATIC_ROWS = 64  # rows of every static pass: EAGLE-2's 60-node trees fit, and on a GPU 64 rows cost what 1 does
STATIC_GRID = (1, 2, 4, 8, 16, 32, 64)  # pass sizes timed on the static backend (its tree budget comes from them)
# Pass sizes timed on the native backend: every small size, because CPU kernels cost in steps
# (PyTorch's int4 kernel takes rows four at a time: 5 rows cost about what 8 do).
NATIVE_COST_GRID = (1, 2, 3, 4, 5, 6, 8, 12, 16)
DEVICES = ("auto", "cpu", "cuda")
# auto times llama.cpp against a native fp32 copy of a GGUF target (built for the timing) only when
# that copy is small: at most TIMED_NATIVE_BYTES and TIMED_NATIVE_SHARE of the free memory. A larger
# copy reads over 2 GiB a token, which no CPU's bandwidth turns into a win over the file's own
# 4- to 8-bit types, and building it costs more than the timing can save.
TIMED_NATIVE_BYTES = 2 << 30
TIMED_NATIVE_SHARE = 0.5


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
    if precision == GGUF:
        if kind not in ("auto", LLAMA_CPP):
            raise QuickdraftError(f"precision gguf is the llama.cpp backend's (backend='llama.cpp' or 'auto'), "
                                  f"not the {kind} backend's")
        return
    get_precision(precision)
    if kind == LLAMA_CPP:
        raise QuickdraftError(f"the llama.cpp backend computes with the GGUF file's own types; precision {precision} "
                              f"needs the native backend")
    if precision != "fp32" and kind == "hf":
        raise QuickdraftError(f"precision {precision} needs the native backend (backend='auto' or 'native')")
    if precision not in ("fp32", "bf16") and kind == STATIC:
        raise QuickdraftError(f"the static backend runs dense weights (fp32 or bf16), not {precision}")


def check_llama_cpp(loaded: LoadedModel, device: torch.device) -> Path:
    """The GGUF file llama.cpp can run for `loaded`, or a clear error."""
    if not llama_cpp_installed():
        raise QuickdraftError("backend 'llama.cpp' needs llama-cpp-python (./setup.sh builds it; or "
                              "pip install llama-cpp-python==0.3.36)")
    if loaded.gguf is None:
        raise QuickdraftError(f"backend 'llama.cpp' runs GGUF files; {loaded.name!r} was not loaded from one")
    if device.type != "cpu":
        raise QuickdraftError(f"the llama.cpp backend runs on the CPU here, not on {device}")
    return loaded.gguf


def resolve_kind(loaded: LoadedModel, kind: str, precision: str | None, device: str | torch.device,
                 measure: bool = True, cache_dir: str | os.PathLike | None = None,
                 inner_layers: bool = False) -> str:
    """Which backend runs `loaded`: "llama.cpp", "static", "native" or "hf". auto: on a CUDA device,
    static (fixed shapes, CUDA graphs) where the architecture is supported and the precision dense;
    llama.cpp for a GGUF target when llama-cpp-python is installed, no native precision was asked
    for, the device is the CPU, unless native measured clearly faster (backends/choice.py: paired
    one-token passes, once per machine and file, kept; timed only where a native fp32 copy is
    small, see timed_against_native); else native where the architecture is supported;
    else hf. inner_layers: the method reads inner layers' states (EAGLE-3), which llama.cpp does
    not return: auto passes it by, and asking for it is refused."""
    check_backend_kind(kind)
    device = resolve_device(device)
    if kind == STATIC or (kind == "auto" and device.type == "cuda" and static_supports(loaded.config)
                          and precision in (None, "fp32", "bf16")):
        check_precision(precision or default_precision(device), STATIC)
        if not static_supports(loaded.config):
            raise QuickdraftError(f"the static backend supports "
                                  f"{', '.join(a for a in SUPPORTED_ARCHITECTURES if a != GEMMA3)}; "
                                  f"{loaded.name!r} is {loaded.config.model_type!r}")
        return STATIC
    if kind == LLAMA_CPP or precision == GGUF:
        if inner_layers:
            raise QuickdraftError("this EAGLE-3 head drafts from the target's inner layers, which the llama.cpp "
                                  "backend does not return; use backend='native' (or 'auto')")
        check_precision(precision or GGUF, kind)
        check_llama_cpp(loaded, device)
        return LLAMA_CPP
    if (kind == "auto" and precision is None and loaded.gguf is not None and device.type == "cpu"
            and llama_cpp_installed() and not inner_layers):
        if not timed_against_native(loaded):
            return LLAMA_CPP
        key = ("auto", str(device))
        if measure and key not in loaded.backends:
            loaded.backends[key] = _choose_llama_cpp(loaded, device, cache_dir)
        if measure and loaded.backends[key].llama_cpp:
            return LLAMA_CPP
    return "native" if uses_native(loaded, kind, precision or default_precision(device)) else "hf"


def backend_reason(loaded: LoadedModel, kind: str, precision: str | None, device: str | torch.device,
                   chosen: str, inner_layers: bool = False) -> str:
    """Why `chosen` runs `loaded` (for --verbose): asked for, or what auto saw."""
    if kind != "auto":
        return f"{chosen}: asked for (backend={kind})"
    choice = auto_choice(loaded, device)
    if choice is not None:
        return choice.reason
    if chosen == STATIC:
        return "static: a CUDA device and an architecture and precision it supports"
    if loaded.gguf is None:
        why = "not a GGUF file"
    elif precision is not None:
        why = f"precision {precision} asked for"
    elif resolve_device(device).type != "cpu":
        why = "llama.cpp runs on the CPU only"
    elif not llama_cpp_installed():
        why = "llama-cpp-python is not installed"
    elif inner_layers:
        why = "the EAGLE-3 head reads inner layers, which llama.cpp does not return"
    elif chosen == LLAMA_CPP:
        return (f"llama.cpp: a GGUF file, not timed against native: a native fp32 copy would take "
                f"{human(native_fp32_bytes(loaded))}, over {human(TIMED_NATIVE_BYTES)} or half the memory free")
    else:
        why = "backend timing is off (measure_shapes=False)"
    return f"{chosen}: {why}" + ("" if chosen == "native" else "; the native backend does not support it")


def static_supports(config: PretrainedConfig) -> bool:
    """The static backend: the native architectures but Gemma 3 (its fixed-shape attention has no windows yet)."""
    return supports(config) and config.model_type != GEMMA3


def timed_against_native(loaded: LoadedModel) -> bool:
    """Whether auto times llama.cpp against a native fp32 copy of `loaded` (which it builds for the
    timing): when the copy is small (TIMED_NATIVE_BYTES); else a GGUF file runs on llama.cpp
    untimed (its own kernels over the file's own types)."""
    size = native_fp32_bytes(loaded)
    return size <= TIMED_NATIVE_BYTES and size <= TIMED_NATIVE_SHARE * available_memory()


def native_fp32_bytes(loaded: LoadedModel) -> int:
    """What the native backend's fp32 weights of `loaded` take on this CPU (memory.py's plan)."""
    return backend_weight_bytes(shape_from_config(loaded.config), "native", "fp32")


def choice_signature(gguf: Path, precision: str) -> dict:
    """What auto's llama.cpp-or-native verdict is kept under (with the machine): the file and precision."""
    return {"choice": "llama.cpp or native (paired one-token passes)", "file": file_key(gguf), "precision": precision}


def _choose_llama_cpp(loaded: LoadedModel, device: torch.device, cache_dir: str | os.PathLike | None) -> BackendChoice:
    """auto's verdict for a GGUF target (backends/choice.py), kept per machine and file, from
    llama.cpp's backend timed against a native one made for the timing alone (its plain kernels,
    no timed shapes), dropped afterwards."""
    precision = default_precision(device)

    def paired() -> Timings:
        fast = make_backend(loaded, LLAMA_CPP, GGUF, str(device), cache_dir=cache_dir)
        weights = NativeWeights.from_source(loaded.config, loaded.weights, precision, device=device)
        native = NativeBackend(weights, loaded.name, loaded.tokenizer, loaded.eos_ids)
        print("quickdraft: timing llama.cpp against the native backend (once per machine and file)", file=sys.stderr)
        return time_pairs(fast, native, torch.get_num_threads())

    return cached_backend_choice(shapes_folder(cache_dir), choice_signature(loaded.gguf, precision),
                                 paired, precision)


def auto_choice(loaded: LoadedModel, device: str | torch.device) -> BackendChoice | None:
    """The verdict auto made for `loaded` on `device` in this process (None: it made none)."""
    return loaded.backends.get(("auto", str(resolve_device(device))))


def observe_passes(loaded: LoadedModel, device: str | torch.device, cache_dir: str | os.PathLike | None,
                   one_token_seconds: list[float]) -> bool:
    """After a run on auto's choice: drop the kept verdict if the run contradicts it (see choice.observe)."""
    choice = auto_choice(loaded, device)
    if choice is None or loaded.gguf is None:
        return False
    signature = choice_signature(loaded.gguf, default_precision(resolve_device(device)))
    return observe(shapes_folder(cache_dir), signature, choice, one_token_seconds)


def uses_native(loaded: LoadedModel, kind: str, precision: str | None = None) -> bool:
    """auto: native when the architecture is supported (at `precision`); native: required; hf: never."""
    check_backend_kind(kind)
    if kind == "native" and not supports(loaded.config):
        raise QuickdraftError(f"the native backend supports {', '.join(SUPPORTED_ARCHITECTURES)}; "
                              f"{loaded.name!r} is {loaded.config.model_type!r} (use backend='hf')")
    return kind == "native" or (kind == "auto" and supports(loaded.config, precision))


def make_backend(loaded: LoadedModel, kind: str = "auto", precision: str = "fp32", device: str = "cpu",
                 layers: list[int] | None = None, measure: bool = True,
                 cache_dir: str | os.PathLike | None = None, context: int | None = None) -> Backend:
    """The backend for `loaded` (only `layers` of it, for self-speculation), made once per setting
    and kept in `loaded.backends`: every decoder over the model shares it. measure: time pass
    shapes on this machine (once, cached under cache_dir) and use the fastest. context: the
    llama.cpp backend's KV cells (None: llama_cpp.DEFAULT_CELLS at most)."""
    check_precision(precision, kind)
    device = resolve_device(device)
    if kind == LLAMA_CPP or precision == GGUF:
        return _llama_cpp_backend(loaded, device, layers, measure, cache_dir, context)
    if kind == STATIC:
        return _static_backend(loaded, precision, device, layers, measure, cache_dir)
    native = uses_native(loaded, kind, precision)
    key = ("native" if native else "hf", precision, str(device), tuple(layers) if layers else None, measure)
    if key in loaded.backends:
        return loaded.backends[key]
    folder = shapes_folder(cache_dir)
    if layers is not None:  # a layer subset shares the whole model's weights and measured shapes
        whole = make_backend(loaded, kind, precision, str(device), None, measure, cache_dir)
    if native:
        if layers is not None:
            backend = NativeBackend(whole.weights, loaded.name, loaded.tokenizer, loaded.eos_ids, layers, whole.plan,
                                    whole.in_place_trees)
        else:
            weights = native_weights(loaded, precision, device, folder if measure else None)
            backend = NativeBackend(weights, loaded.name, loaded.tokenizer, loaded.eos_ids)
            if measure:
                backend.plan = measure_row_plan(weights, folder)
                backend.in_place_trees = check_in_place_trees(weights, folder)
                shape = {"threads": torch.get_num_threads(), "layers": len(weights.layers),
                         "hidden": backend.hidden_size, "vocab": backend.vocab_size, "max_length": backend.max_length}
                backend.pass_ms = measure_pass_costs(backend, folder, shape, grid=NATIVE_COST_GRID)
    else:
        if precision != "fp32":
            raise QuickdraftError(f"precision {precision} needs the native backend, which does not support "
                                  f"{loaded.config.model_type!r}")
        if device.type != "cpu":
            loaded.model.to(device)  # transformers runs the model where its weights are
        if layers is not None:
            # The view's cache uses the full model's layout: each kept layer writes its own slot.
            backend = HFBackend(layer_subset_model(loaded.model, layers), loaded.name, loaded.tokenizer,
                                loaded.eos_ids, cache_config=loaded.model.config, plan=whole.plan)
        else:
            backend = HFBackend(loaded.model, loaded.name, loaded.tokenizer, loaded.eos_ids)
            if measure:
                backend.plan = measure_pad_plan(backend, folder)
    loaded.backends[key] = backend
    return backend


def _llama_cpp_backend(loaded: LoadedModel, device: torch.device, layers: list[int] | None, measure: bool,
                       cache_dir: str | os.PathLike | None, context: int | None = None) -> Backend:
    """llama.cpp runs whole GGUF models, on as many threads as torch uses (the CLI's --threads); a
    layer subset (self-speculation) runs on the native backend with the file's own 4-bit blocks
    (fp32 for an architecture it runs at fp32 only, Gemma 3: a drafter's precision is not exactness)."""
    gguf = check_llama_cpp(loaded, device)
    if layers is not None:
        precision = "int4" if supports(loaded.config, "int4") else "fp32"
        return make_backend(loaded, "native", precision, str(device), layers, measure, cache_dir)
    threads = torch.get_num_threads()
    key = (LLAMA_CPP, threads, context)
    if key not in loaded.backends:
        backend = LlamaCppBackend(gguf, loaded.name, loaded.tokenizer, loaded.eos_ids, threads, cells=context)
        folder, signature = shapes_folder(cache_dir), {"file": file_key(gguf), "threads": threads}
        # Exactness, not speed: checked whatever measure says (seconds, once per machine and file).
        backend.exact_rows = int(cached_choice(folder, {"check": "llama.cpp exact rows", **signature},
                                               backend.measure_exact_rows))
        if measure:
            backend.pass_ms = measure_pass_costs(backend, folder, signature)
        loaded.backends[key] = backend
    return loaded.backends[key]


def _static_backend(loaded: LoadedModel, precision: str, device: torch.device, layers: list[int] | None,
                    measure: bool, cache_dir: str | os.PathLike | None) -> Backend:
    """Fixed-shape passes (CUDA graphs on a GPU) over dense weights shared with any layer subset;
    measure: time its passes of STATIC_GRID tokens (the cost model and the tree budget read them)."""
    key = (STATIC, precision, str(device), tuple(layers) if layers else None, measure)
    if key not in loaded.backends:
        weights = native_weights(loaded, precision, device, dense="linear")
        backend = StaticBackend(weights, loaded.name, loaded.tokenizer, loaded.eos_ids, layers, rows=STATIC_ROWS)
        if measure:
            backend.pass_ms = measure_pass_costs(backend, shapes_folder(cache_dir),
                                                 {"rows": STATIC_ROWS, "layers": layers}, grid=STATIC_GRID)
        loaded.backends[key] = backend
    return loaded.backends[key]


def shapes_folder(cache_dir: str | os.PathLike | None) -> Path:
    """Where measured pass shapes and costs are cached."""
    return (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "pass_shapes"


def native_weights(loaded: LoadedModel, precision: str, device: torch.device,
                   shapes: Path | None = None, dense: str = "bf16") -> NativeWeights:
    """Weights at `precision` on `device`, read once from the model's source; int4 from a GGUF file
    takes the file's own 4-bit blocks. shapes: where measured kernel choices live (bf16 on a CPU: multiplied as bf16 or
    widened to fp32, whichever this machine does faster); None: `dense` (see NativeWeights.from_model)."""
    if shapes is not None and precision == "bf16" and device.type == "cpu":
        dense = measure_dense_kernel(loaded.tensor, shapes)
    key = (precision, str(device), dense)
    if key not in loaded.native:
        loaded.native[key] = NativeWeights.from_source(loaded.config, loaded.weights, precision, device=device,
                                                       dense_kernel=dense, progress=loaded.weights.nbytes() > GIB)
    return loaded.native[key]


__all__ = ["BACKENDS", "DEVICES", "GGUF", "LLAMA_CPP", "PRECISIONS", "STATIC", "auto_choice", "backend_reason",
           "check_backend_kind", "check_precision", "choice_signature", "default_precision", "make_backend",
           "native_weights", "observe_passes", "resolve_device", "resolve_kind", "static_supports", "uses_native"]
