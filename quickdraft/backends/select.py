"""Which backend runs a model, on which device: built once per loaded model and reused."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import NamedTuple

import torch
from transformers import PretrainedConfig

from quickdraft.backends.backend import Backend
from quickdraft.backends.choice import BackendChoice, Timings, cached_backend_choice, observe, time_pairs
from quickdraft.backends.hf import HFBackend
from quickdraft.backends.kernel_timing import (
    VERIFY_ROWS,
    check_in_place_trees,
    measure_dense_kernel,
    measure_pad_sizes,
    measure_pass_costs,
    measure_prompt_kernel,
    measure_row_kernels,
)
from quickdraft.backends.kinds import (
    AUTO,
    BACKENDS,
    GGUF,
    HF,
    LLAMA_CPP,
    NATIVE,
    STATIC,
    STATIC_ROWS,
    TRAITS,
    BackendTraits,
    check_backend_kind,
    static_supports,
    traits_of,
)
from quickdraft.backends.llama_cpp import LlamaCppBackend, installed_patches, llama_cpp_installed
from quickdraft.backends.native import NativeBackend
from quickdraft.backends.static import StaticBackend
from quickdraft.errors import QuickdraftError
from quickdraft.measured import cached_choice
from quickdraft.memory import GIB, available_memory, backend_weight_bytes, human, shape_from_config
from quickdraft.models.layer_subset import layer_subset_model
from quickdraft.models.linear import RowLinear
from quickdraft.models.loading import LoadedModel, default_cache_dir, file_key
from quickdraft.models.native_weights import NativeWeights, supports
from quickdraft.models.precision import PRECISIONS, get_precision

STATIC_GRID = (1, 2, 4, 8, 16, 32, 64)  # pass sizes timed on the static backend (its tree budget comes from them)
# Pass sizes timed on the native backend: every small size, because CPU kernels cost in steps
# (PyTorch's int4 kernel takes rows four at a time: 5 rows cost about what 8 do).
NATIVE_COST_GRID = (1, 2, 3, 4, 5, 6, 8, 12, 16)
DEVICES = (AUTO, "cpu", "cuda")
# auto times llama.cpp against a native fp32 copy of a GGUF target (built for the timing) only when
# that copy is small: at most TIMED_NATIVE_BYTES and TIMED_NATIVE_SHARE of the free memory. A larger
# copy reads over 2 GiB a token, which no CPU's bandwidth turns into a win over the file's own
# 4- to 8-bit types, and building it costs more than the timing can save.
TIMED_NATIVE_BYTES = 2 << 30
TIMED_NATIVE_SHARE = 0.5


def resolve_device(device: str | torch.device) -> torch.device:
    """ "auto": the GPU when CUDA is present, else the CPU; "cuda" (or "cuda:N") must be present."""
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


def check_precision(precision: str, kind: str) -> None:
    """A precision some backend has (auto), or one `kind` computes with."""
    if kind == AUTO:
        if precision != GGUF:
            get_precision(precision)
        return
    traits_of(kind).check_precision(precision)


def check_llama_cpp_installed() -> None:
    if not llama_cpp_installed():
        raise QuickdraftError(
            "backend 'llama.cpp' needs llama-cpp-python (./setup.sh builds it; or pip install llama-cpp-python==0.3.36)"
        )


def check_device(traits: BackendTraits, device: torch.device) -> None:
    if device.type not in traits.devices:
        raise QuickdraftError(f"the {traits.name} backend runs on {' or '.join(traits.devices)} here, not on {device}")


class Choice(NamedTuple):
    """Which backend runs a model, at which precision, and why (for --verbose and `quickdraft plan`)."""

    kind: str
    precision: str
    reason: str


def choose_backend(
    config: PretrainedConfig,
    gguf: Path | None,
    name: str,
    kind: str = AUTO,
    precision: str | None = None,
    device: str | torch.device = AUTO,
    inner_layers: bool = False,
    stored: str = "fp32",
    verdict: Callable[[], BackendChoice | None] | None = None,
) -> Choice:
    """The one place a backend is chosen, from the traits (backends/kinds.py). Asked for: that
    backend, checked (device, architecture, file, precision, inner layers). auto: on a CUDA
    device, static where the architecture is supported and the precision dense; on a CPU,
    llama.cpp for a GGUF target when llama-cpp-python is installed, no precision was asked for
    and the method does not read inner layers it does not return, unless `verdict` (llama.cpp timed against a
    native copy, backends/choice.py; asked only where that copy is small, timed_against_native)
    finds native clearly faster; else native where the architecture is supported, else hf.
    inner_layers: the method reads inner layers' states (EAGLE-3). stored: the checkpoint's own
    precision (LoadedModel.stored_precision), the hf backend's when none is asked for: a
    transformers model is built in the dtype it was saved in."""
    check_backend_kind(kind)
    device = device if isinstance(device, torch.device) else resolve_device(device)  # a device object: as given
    if precision is not None:
        check_precision(precision, kind)
    if kind != AUTO:
        return _asked(
            traits_of(kind), config, gguf, name, precision or (stored if kind == HF else None), device, inner_layers
        )
    if precision == GGUF:
        return _asked(TRAITS[LLAMA_CPP], config, gguf, name, precision, device, inner_layers, "precision gguf")
    default = precision or default_precision(device)
    if device.type == "cuda" and default in TRAITS[STATIC].precisions and static_supports(config, default):
        return Choice(STATIC, default, "static: a CUDA device and an architecture and precision it supports")
    why = _why_not_llama_cpp(config, gguf, precision, device, inner_layers)
    if why is None:
        if not timed_against_native(config):
            return Choice(
                LLAMA_CPP,
                GGUF,
                f"llama.cpp: a GGUF file, not timed against native: a native fp32 copy "
                f"would take {human(native_fp32_bytes(config))}, over "
                f"{human(TIMED_NATIVE_BYTES)} or half the memory free",
            )
        found = verdict() if verdict is not None else None
        if found is not None and found.llama_cpp:
            return Choice(LLAMA_CPP, GGUF, found.reason)
        why = found.reason if found is not None else "backend timing is off (measure_shapes=False)"
    if default in TRAITS[NATIVE].precisions and supports(config, default):
        return Choice(NATIVE, default, why if why.startswith(f"{NATIVE}:") else f"{NATIVE}: {why}")
    chosen = precision or stored  # transformers' model in the checkpoint's own dtype unless asked otherwise
    if chosen not in TRAITS[HF].precisions:
        raise QuickdraftError(
            f"the hf backend computes at {', '.join(TRAITS[HF].precisions)}, not {chosen}, and "
            f"the native backend does not support {name!r} ({config.model_type!r})"
        )
    missing = f"does not compute at {default}" if supports(config, None) else "does not support it"
    return Choice(HF, chosen, f"{HF}: {why}; the native backend {missing}")


def _asked(
    traits: BackendTraits,
    config: PretrainedConfig,
    gguf: Path | None,
    name: str,
    precision: str | None,
    device: torch.device,
    inner_layers: bool,
    why: str = "",
) -> Choice:
    """The backend the user named, or one clear error saying why it cannot run this."""
    if inner_layers and not traits.inner_layers(config):
        raise QuickdraftError(
            f"this EAGLE-3 head drafts from the target's inner layers, which the {traits.name} "
            f"backend does not return for {config.model_type!r} models; use backend='native' (or 'auto')"
        )
    if traits.needs_gguf:
        check_llama_cpp_installed()
        if gguf is None:
            raise QuickdraftError(f"backend {traits.name!r} runs GGUF files; {name!r} was not loaded from one")
    check_device(traits, device)
    traits.check_architecture(config, name)
    chosen = precision or (traits.precisions[0] if len(traits.precisions) == 1 else default_precision(device))
    traits.check_precision(chosen)
    return Choice(traits.name, chosen, f"{traits.name}: asked for ({why or f'backend={traits.name}'})")


def _why_not_llama_cpp(
    config: PretrainedConfig, gguf: Path | None, precision: str | None, device: torch.device, inner_layers: bool
) -> str | None:
    """Why auto does not consider llama.cpp for a target (None: it does)."""
    if gguf is None:
        return "not a GGUF file"
    if precision is not None:
        return f"precision {precision} asked for"
    if device.type not in TRAITS[LLAMA_CPP].devices:
        return "llama.cpp runs on the CPU only"
    if not llama_cpp_installed():
        return "llama-cpp-python is not installed"
    if inner_layers and not TRAITS[LLAMA_CPP].inner_layers(config):
        return f"the EAGLE-3 head reads inner layers, which llama.cpp does not return for {config.model_type!r} models"
    return None


def draft_backend(kind: str, precision: str, loaded: LoadedModel, device: torch.device) -> tuple[str, str]:
    """The backend and precision a draft model runs on beside a target on `kind` at `precision`:
    the same, unless the draft cannot run there (one that is not a GGUF file beside llama.cpp runs
    on auto's choice; an architecture the target's backend does not run, beside native or static,
    runs on hf)."""
    traits = TRAITS[kind]
    if traits.needs_gguf and loaded.gguf is None:
        return AUTO, default_precision(device)
    if not traits.architectures(loaded.config, None):
        return HF, loaded.stored_precision
    return kind, precision


def timed_against_native(config: PretrainedConfig) -> bool:
    """Whether auto times llama.cpp against a native fp32 copy of a GGUF target (which it builds for
    the timing): when the copy is small (TIMED_NATIVE_BYTES); else a GGUF file runs on llama.cpp
    untimed (its own kernels over the file's own types)."""
    size = native_fp32_bytes(config)
    return size <= TIMED_NATIVE_BYTES and size <= TIMED_NATIVE_SHARE * available_memory()


def native_fp32_bytes(config: PretrainedConfig) -> int:
    """What the native backend's fp32 weights of a model take on this CPU (memory.py's plan)."""
    return backend_weight_bytes(shape_from_config(config), NATIVE, "fp32")


def choice_signature(gguf: Path, precision: str) -> dict:
    """What auto's llama.cpp-or-native verdict is kept under (with the machine): the file and precision."""
    return {"choice": "llama.cpp or native (paired one-token passes)", "file": file_key(gguf), "precision": precision}


def auto_verdict(loaded: LoadedModel, device: torch.device, cache_dir: str | os.PathLike | None) -> BackendChoice:
    """auto's llama.cpp-or-native verdict for a GGUF target (backends/choice.py), made once per
    process and kept per machine and file, from llama.cpp's backend timed against a native one
    made for the timing alone (its plain kernels, no timed shapes), dropped afterwards."""
    key = (AUTO, str(device))
    if key not in loaded.backends:
        loaded.backends[key] = _timed_verdict(loaded, device, cache_dir)
    return loaded.backends[key]


def _timed_verdict(loaded: LoadedModel, device: torch.device, cache_dir: str | os.PathLike | None) -> BackendChoice:
    precision = default_precision(device)

    def paired() -> Timings:
        fast = make_backend(loaded, LLAMA_CPP, GGUF, str(device), cache_dir=cache_dir)
        weights = NativeWeights.from_source(loaded.config, loaded.weights, precision, device=device)
        native = NativeBackend(weights, loaded.name, loaded.tokenizer, loaded.eos_ids)
        print("quickdraft: timing llama.cpp against the native backend (once per machine and file)", file=sys.stderr)
        return time_pairs(fast, native, torch.get_num_threads())

    return cached_backend_choice(shapes_folder(cache_dir), choice_signature(loaded.gguf, precision), paired, precision)


def auto_choice(loaded: LoadedModel, device: str | torch.device) -> BackendChoice | None:
    """The verdict auto made for `loaded` on `device` in this process (None: it made none)."""
    return loaded.backends.get((AUTO, str(resolve_device(device))))


def observe_passes(
    loaded: LoadedModel, device: str | torch.device, cache_dir: str | os.PathLike | None, one_token_seconds: list[float]
) -> bool:
    """After a run on auto's choice: drop the kept verdict if the run contradicts it (see choice.observe)."""
    choice = auto_choice(loaded, device)
    if choice is None or loaded.gguf is None:
        return False
    signature = choice_signature(loaded.gguf, default_precision(resolve_device(device)))
    return observe(shapes_folder(cache_dir), signature, choice, one_token_seconds)


def make_backend(
    loaded: LoadedModel,
    kind: str = AUTO,
    precision: str = "fp32",
    device: str = "cpu",
    layers: list[int] | None = None,
    measure: bool = True,
    cache_dir: str | os.PathLike | None = None,
    context: int | None = None,
    kernel_rows: tuple[int, ...] = VERIFY_ROWS,
) -> Backend:
    """The backend for `loaded` (only `layers` of it, for self-speculation), made once per setting
    and kept in `loaded.backends`: every decoder over the model shares it. kind auto: native where
    the architecture is supported at `precision`, else hf (choose_backend decides; a timed
    llama.cpp verdict is the Decoder's). measure: time pass shapes on this machine (once, cached
    under cache_dir) and use the fastest. context: the llama.cpp backend's KV cells (None:
    llama_cpp.DEFAULT_CELLS at most). kernel_rows: the pass sizes a native bf16 kernel on a CPU is
    chosen for (shapes.VERIFY_ROWS for a target, DECODE_ROWS for a draft model)."""
    kind = choose_backend(
        loaded.config, loaded.gguf, loaded.name, kind, precision, device, stored=loaded.stored_precision
    ).kind
    device = resolve_device(device)
    traits = TRAITS[kind]
    if layers is not None and traits.subset is not None:
        return _subset_backend(loaded, traits, device, layers, measure, cache_dir)
    if kind == LLAMA_CPP:
        return _llama_cpp_backend(loaded, device, measure, cache_dir, context)
    if kind == STATIC:
        return _static_backend(loaded, precision, device, layers, measure, cache_dir)
    native = kind == NATIVE
    if not (native and precision == "bf16" and device.type == "cpu" and measure):
        kernel_rows = VERIFY_ROWS  # nothing is chosen by pass size: one backend serves every caller
    key = (kind, precision, str(device), tuple(layers) if layers else None, measure, kernel_rows)
    if key in loaded.backends:
        return loaded.backends[key]
    folder = shapes_folder(cache_dir)
    if layers is not None:  # a layer subset shares the whole model's weights and measured shapes
        whole = make_backend(loaded, kind, precision, str(device), None, measure, cache_dir, kernel_rows=kernel_rows)
    if native:
        if layers is not None:
            backend = NativeBackend(
                whole.weights,
                loaded.name,
                loaded.tokenizer,
                loaded.eos_ids,
                layers,
                whole.row_kernels,
                whole.in_place_trees,
            )
            backend.widen_prompts = whole.widen_prompts
        else:
            weights = native_weights(loaded, precision, device, folder if measure else None, kernel_rows=kernel_rows)
            backend = NativeBackend(weights, loaded.name, loaded.tokenizer, loaded.eos_ids)
            if measure:
                backend.row_kernels = measure_row_kernels(weights, folder)
                backend.in_place_trees = check_in_place_trees(weights, folder)
                # bf16 one row at a time (a CPU without bf16 arithmetic): prompts may go faster widened.
                backend.widen_prompts = isinstance(weights.layers[0].qkv, RowLinear) and measure_prompt_kernel(
                    loaded.tensor, folder
                )
                shape = {
                    "threads": torch.get_num_threads(),
                    "layers": len(weights.layers),
                    "hidden": backend.hidden_size,
                    "vocab": backend.vocab_size,
                    "max_length": backend.max_length,
                }
                backend.time_passes = partial(measure_pass_costs, folder=folder, signature=shape, grid=NATIVE_COST_GRID)
    else:
        model = loaded.transformers_model(get_precision(precision).dtype)  # in the precision chosen
        if device.type != "cpu":
            model.to(device)  # transformers runs the model where its weights are
        if layers is not None:
            # The view's cache uses the full model's layout: each kept layer writes its own slot.
            backend = HFBackend(
                layer_subset_model(model, layers),
                loaded.name,
                loaded.tokenizer,
                loaded.eos_ids,
                cache_config=model.config,
                pad_to=whole.pad_to,
            )
        else:
            backend = HFBackend(model, loaded.name, loaded.tokenizer, loaded.eos_ids)
            if measure:
                backend.pad_to = measure_pad_sizes(backend, folder)
    loaded.backends[key] = backend
    return backend


def _subset_backend(
    loaded: LoadedModel,
    traits: BackendTraits,
    device: torch.device,
    layers: list[int],
    measure: bool,
    cache_dir: str | os.PathLike | None,
) -> Backend:
    """A layer subset (self-speculation) of a backend that runs whole models only (llama.cpp) runs
    on traits.subset: native with the file's own 4-bit blocks (fp32 for an architecture it runs at
    fp32 only, Gemma 3: a drafter's precision is not exactness)."""
    precision = "int4" if supports(loaded.config, "int4") else "fp32"
    return make_backend(loaded, traits.subset, precision, str(device), layers, measure, cache_dir)


def _llama_cpp_backend(
    loaded: LoadedModel,
    device: torch.device,
    measure: bool,
    cache_dir: str | os.PathLike | None,
    context: int | None = None,
) -> Backend:
    """llama.cpp runs whole GGUF models, on as many threads as torch uses (the CLI's --threads)."""
    gguf = loaded.gguf
    threads = torch.get_num_threads()
    key = (LLAMA_CPP, threads, context)
    if key not in loaded.backends:
        folder, signature = shapes_folder(cache_dir), llama_cpp_signature(gguf, threads)
        # Exactness, not speed: checked whatever measure says, the first time a pass needs it
        # (seconds to a minute, once per machine and file).
        backend = LlamaCppBackend(
            gguf,
            loaded.name,
            loaded.tokenizer,
            loaded.eos_ids,
            threads,
            cells=context,
            check_exact_rows=partial(_kept_exact_rows, folder, signature),
        )
        if measure:
            backend.time_passes = partial(measure_pass_costs, folder=folder, signature=signature)
        loaded.backends[key] = backend
    return loaded.backends[key]


def llama_cpp_signature(gguf: Path, threads: int) -> dict:
    """What the llama.cpp backend's one-time check and timing are kept under: the file, the threads
    and the build's patches (a rebuilt llama.cpp has other kernels: it is checked and timed again)."""
    return {"file": file_key(gguf), "threads": threads, "build": sorted(installed_patches())}


def _kept_exact_rows(folder: Path, signature: dict, backend: LlamaCppBackend) -> int:
    """The llama.cpp backend's exactness check, run once per machine and file and kept."""
    return int(cached_choice(folder, {"check": "llama.cpp exact rows", **signature}, backend.measure_exact_rows))


def _static_backend(
    loaded: LoadedModel,
    precision: str,
    device: torch.device,
    layers: list[int] | None,
    measure: bool,
    cache_dir: str | os.PathLike | None,
) -> Backend:
    """Fixed-shape passes (CUDA graphs on a GPU) over dense weights shared with any layer subset;
    measure: time its passes of STATIC_GRID tokens (the cost model and the tree budget read them)."""
    key = (STATIC, precision, str(device), tuple(layers) if layers else None, measure)
    if key not in loaded.backends:
        weights = native_weights(loaded, precision, device, dense="linear")
        backend = StaticBackend(weights, loaded.name, loaded.tokenizer, loaded.eos_ids, layers, rows=STATIC_ROWS)
        if measure:
            backend.time_passes = partial(
                measure_pass_costs,
                folder=shapes_folder(cache_dir),
                signature={"rows": STATIC_ROWS, "layers": layers},
                grid=STATIC_GRID,
            )
        loaded.backends[key] = backend
    return loaded.backends[key]


def shapes_folder(cache_dir: str | os.PathLike | None) -> Path:
    """Where measured pass shapes and costs are cached."""
    return (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "pass_shapes"


def native_weights(
    loaded: LoadedModel,
    precision: str,
    device: torch.device,
    shapes: Path | None = None,
    dense: str = "bf16",
    kernel_rows: tuple[int, ...] = VERIFY_ROWS,
) -> NativeWeights:
    """Weights at `precision` on `device`, read once from the model's source; int4 from a GGUF file
    takes the file's own 4-bit blocks. shapes: where measured kernel choices live (bf16 on a CPU:
    bf16 columns or one row at a time, whichever this machine does faster at `kernel_rows` rows);
    None: `dense` (see NativeWeights.from_model)."""
    if shapes is not None and precision == "bf16" and device.type == "cpu":
        dense = measure_dense_kernel(loaded.tensor, shapes, kernel_rows)
    key = (precision, str(device), dense)
    if key not in loaded.native:
        loaded.native[key] = NativeWeights.from_source(
            loaded.config,
            loaded.weights,
            precision,
            device=device,
            dense_kernel=dense,
            progress=loaded.weights.nbytes() > GIB,
        )
    return loaded.native[key]


__all__ = [
    "BACKENDS",
    "DEVICES",
    "GGUF",
    "LLAMA_CPP",
    "PRECISIONS",
    "STATIC",
    "Choice",
    "auto_choice",
    "auto_verdict",
    "check_backend_kind",
    "check_precision",
    "choice_signature",
    "choose_backend",
    "default_precision",
    "draft_backend",
    "make_backend",
    "native_weights",
    "observe_passes",
    "resolve_device",
    "static_supports",
]
