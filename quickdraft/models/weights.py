"""Where a model's tensors come from, one at a time: a GGUF file, a safetensors folder, or a loaded
transformers model.

A backend reads each tensor it needs under its transformers parameter name and turns it straight
into its own layout, so no step of loading holds a full fp32 copy of the model: a GGUF tensor is
de-quantized alone (or its 4-bit blocks taken as they are), a safetensors tensor is read from disk
in the checkpoint's own dtype.
"""

from __future__ import annotations

import ctypes
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

from quickdraft.errors import QuickdraftError
from quickdraft.models.gguf_blocks import BLOCK_BYTES, unpack_int4_blocks
from quickdraft.models.gguf_convert import GgufTensor, gguf_to_hf_names, read_table
from quickdraft.models.precision import precision_of
from quickdraft.models.quantize import ROWS_AT_ONCE, Int4Weight

EMBED, LM_HEAD = "model.embed_tokens.weight", "lm_head.weight"


class WeightSource(Protocol):
    """A model's tensors under transformers' parameter names, read one at a time."""

    def names(self) -> set[str]:
        """Every parameter name the source holds (a tied LM head is not listed)."""

    def get(self, name: str) -> torch.Tensor:
        """One tensor's values: fp32 from a GGUF file, the checkpoint's dtype from safetensors."""

    def shape(self, name: str) -> tuple[int, ...]:
        """A tensor's shape, without reading it."""

    def dtype(self, name: str) -> torch.dtype:
        """The dtype get() gives a tensor in (the checkpoint's own; fp32 from a GGUF file), without reading it."""

    def read_into(self, name: str, out: torch.Tensor) -> None:
        """One tensor's values written into `out` (its shape, any dtype), with no copy where the
        source can read straight into it."""

    def read(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        """One tensor in `dtype`, read straight into its own memory (a model's own tensor when it
        already has that dtype)."""

    def row_blocks(self, name: str, rows: int = ROWS_AT_ONCE) -> Iterator[torch.Tensor]:
        """A matrix's rows as get() gives them, `rows` at a time, each block read when it is asked
        for (the whole tensor at full width only where the source cannot read it in parts)."""

    def int4_blocks(self, name: str) -> Int4Weight | None:
        """The file's own 4-bit blocks of a weight (Q4_0, Q4_1, Q4_K), in transformers' row order
        (None: it has none)."""

    def nbytes(self) -> int:
        """Bytes the weights take where they are (the file, or memory)."""


def give_back_freed_memory() -> None:
    """Return the heap's freed pages to the OS (glibc's malloc_trim; elsewhere nothing). Reading a
    model frees a full-width temporary per matrix between the weights it keeps; without this the
    holes stay resident and loading's peak grows by a quarter of the weights."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def meta_model(config: PretrainedConfig) -> PreTrainedModel:
    """The transformers model of `config` with no storage: its parameter names and modules, for free."""
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def rotary_embedding(config: PretrainedConfig) -> torch.nn.Module:
    """The architecture's own rotary module (its frequencies, with any rope scaling applied), made
    from the config alone."""
    return type(meta_model(config).model.rotary_emb)(config=config)


def check_shapes(
    config: PretrainedConfig, source: WeightSource, where: str, model: PreTrainedModel | None = None
) -> None:
    """Every parameter the config's model has is in `source` at its shape, or one clear error that
    names the file and the tensor (a tied LM head may be absent). model: the config's meta_model,
    where the caller has made it already."""
    present = source.names()
    tied = getattr(config, "tie_word_embeddings", False)
    for name, tensor in (model or meta_model(config)).state_dict().items():
        if name not in present:
            if name == LM_HEAD and tied:
                continue
            raise QuickdraftError(f"{where} has no tensor {name}, which its config's {config.model_type} model needs")
        if tuple(source.shape(name)) != tuple(tensor.shape):
            raise QuickdraftError(
                f"{where}: tensor {name} has shape {list(source.shape(name))}, its config says {list(tensor.shape)}"
            )


def stored_name(source: WeightSource, config: PretrainedConfig, name: str) -> str:
    """The name `name`'s values are stored under: a tied LM head's are the embedding's."""
    if name == LM_HEAD and name not in source.names() and getattr(config, "tie_word_embeddings", False):
        return EMBED
    return name


def stored_precision(source: WeightSource) -> str:
    """The precision a checkpoint stores its weights in: its largest tensor's dtype (fp32 for a
    GGUF file, whose quantized tensors read as fp32)."""
    largest = max(source.names(), key=lambda name: math.prod(source.shape(name)))
    return precision_of(source.dtype(largest))


def tensor_or_tied(source: WeightSource, config: PretrainedConfig, name: str) -> torch.Tensor:
    """`name`'s tensor; a tied LM head is the embedding."""
    return source.get(stored_name(source, config, name))


def build_model(config: PretrainedConfig, source: WeightSource, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """The transformers model of `config` with every parameter read from `source`, one tensor at a
    time into its place (a tied LM head is the embedding)."""
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            stored = stored_name(source, config, name)
            if stored == name:  # (a tied head is tied below)
                source.read_into(name, tensor)
    model.tie_weights()
    return model


def fused(source: WeightSource, names: list[str], dtype: torch.dtype) -> torch.Tensor:
    """The matrices `names` [out_i, in] stacked along outputs [sum out_i, in] in `dtype`, each read
    into its own rows (no stacked copy); one matrix is the source's own tensor (a model's is shared)."""
    if len(names) == 1:
        return source.read(names[0], dtype)
    rows = [source.shape(name)[0] for name in names]
    out = torch.empty(sum(rows), source.shape(names[0])[1], dtype=dtype)
    for name, part in zip(names, out.split(rows)):
        source.read_into(name, part)
    return out


class ModuleWeights:
    """A loaded transformers model's parameters."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model

    @cached_property
    def _tensors(self) -> dict[str, torch.Tensor]:
        return dict(self.model.state_dict())

    def names(self) -> set[str]:
        names = set(self._tensors)
        head, embed = self._tensors.get(LM_HEAD), self._tensors.get(EMBED)
        if head is not None and embed is not None and head.data_ptr() == embed.data_ptr():
            names.discard(LM_HEAD)  # tied: the embedding is the head
        return names

    def get(self, name: str) -> torch.Tensor:
        return self._tensors[name].detach()

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._tensors[name].shape)

    def dtype(self, name: str) -> torch.dtype:
        return self._tensors[name].dtype

    def read_into(self, name: str, out: torch.Tensor) -> None:
        out.copy_(self.get(name))

    def read(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        return self.get(name).to(dtype)

    def row_blocks(self, name: str, rows: int = ROWS_AT_ONCE) -> Iterator[torch.Tensor]:
        yield from self.get(name).split(rows)

    def int4_blocks(self, name: str) -> Int4Weight | None:
        return None

    def nbytes(self) -> int:
        seen = {t.data_ptr(): t.numel() * t.element_size() for t in self._tensors.values()}
        return sum(seen.values())


# safetensors' dtype names -> torch dtypes (the ones checkpoints hold)
SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass(frozen=True)
class _Stored:
    """Where one safetensors tensor's bytes are."""

    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # byte offset in the file
    size: int  # bytes


class SafetensorsWeights:
    """A folder's *.safetensors files (one file or a sharded index). A tensor's bytes are read from
    the file into its own memory, not mapped: pages of a mapping count in the process's RSS while
    it is open, so a mapped read holds each tensor twice at the moment it is converted."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        else:
            files = sorted(p.name for p in folder.glob("*.safetensors"))
        self._stored: dict[str, _Stored] = {}
        for file in files:
            self._stored.update(_read_header(folder / file))

    def names(self) -> set[str]:
        return set(self._stored)

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self._stored:
            raise QuickdraftError(f"{self.folder} has no tensor {name}")
        return self._stored[name].shape

    def dtype(self, name: str) -> torch.dtype:
        self.shape(name)  # a clear error for a missing tensor
        return self._stored[name].dtype

    def get(self, name: str) -> torch.Tensor:
        return self.read(name, self._stored[name].dtype if name in self._stored else torch.float32)

    def read(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        out = torch.empty(self.shape(name), dtype=dtype)
        self.read_into(name, out)
        return out

    def read_into(self, name: str, out: torch.Tensor) -> None:
        stored = self._stored[name]
        if out.dtype != stored.dtype or not out.is_contiguous() or out.device.type != "cpu":
            out.copy_(self.get(name))
            return
        self._read_bytes(name, out, 0)

    def row_blocks(self, name: str, rows: int = ROWS_AT_ONCE) -> Iterator[torch.Tensor]:
        stored = self._stored[name]
        for start in range(0, stored.shape[0], rows):
            out = torch.empty((min(rows, stored.shape[0] - start), *stored.shape[1:]), dtype=stored.dtype)
            self._read_bytes(name, out, start * (stored.size // stored.shape[0]))
            yield out

    def _read_bytes(self, name: str, out: torch.Tensor, offset: int) -> None:
        """Fill `out` (contiguous, the stored dtype) from the tensor's bytes at `offset`."""
        stored = self._stored[name]
        with open(stored.file, "rb", buffering=0) as handle:
            handle.seek(stored.start + offset)
            read = handle.readinto(memoryview(out.view(-1).view(torch.uint8).numpy()))
        if read != out.numel() * out.element_size():
            raise QuickdraftError(
                f"{stored.file} ends inside tensor {name} (read {offset + read} of {stored.size} bytes): truncated?"
            )

    def int4_blocks(self, name: str) -> Int4Weight | None:
        return None

    def nbytes(self) -> int:
        return sum(path.stat().st_size for path in {stored.file for stored in self._stored.values()})


def _read_header(path: Path) -> dict[str, _Stored]:
    """A safetensors file's table: an 8-byte little-endian length, then that many bytes of JSON
    giving each tensor's dtype, shape and byte range after the header."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        if length <= 0 or 8 + length > size:
            raise QuickdraftError(f"{path} is not a safetensors file (its header does not fit it)")
        try:
            header = json.loads(handle.read(length))
        except ValueError as error:
            raise QuickdraftError(f"{path} has an unreadable safetensors header: {error}") from None
    stored = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if entry["dtype"] not in SAFETENSORS_DTYPES:
            raise QuickdraftError(f"{path}: tensor {name} has dtype {entry['dtype']}, which quickdraft does not read")
        begin, end = entry["data_offsets"]
        if 8 + length + end > size:
            raise QuickdraftError(
                f"{path} ends inside tensor {name} (bytes {8 + length + begin}-{8 + length + end} "
                f"of {size}): truncated?"
            )
        stored[name] = _Stored(
            path, SAFETENSORS_DTYPES[entry["dtype"]], tuple(entry["shape"]), 8 + length + begin, end - begin
        )
    return stored


class GgufWeights:
    """A GGUF file's tensors under transformers' names, each put through transformers' tensor
    processor for the architecture (Llama's q/k row order, Gemma's norm offsets) when read."""

    def __init__(self, path: Path, config: PretrainedConfig, model: PreTrainedModel | None = None) -> None:
        """model: the config's meta_model, where the caller has made it already."""
        self.path = path
        metadata, tensors = read_table(path)
        self.architecture = metadata["general.architecture"]
        self._config = config.to_dict()
        self._processor = TENSOR_PROCESSORS.get(self.architecture, TensorProcessor)(config=self._config)
        self._gguf_names = gguf_to_hf_names(model or meta_model(config), self.architecture, self._processor)
        by_name = {tensor.name: tensor for tensor in tensors}
        self._tensors: dict[str, GgufTensor] = {hf: by_name[g] for g, hf in self._gguf_names.items() if g in by_name}

    def names(self) -> set[str]:
        return set(self._tensors)

    def tensor(self, name: str) -> GgufTensor:
        if name not in self._tensors:
            raise QuickdraftError(f"{self.path} has no tensor for {name}")
        return self._tensors[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.tensor(name).shape

    def dtype(self, name: str) -> torch.dtype:
        return torch.float32  # de-quantized (or widened) on reading

    def read_into(self, name: str, out: torch.Tensor) -> None:
        """De-quantized ROWS_AT_ONCE rows at a time straight into `out` when the architecture's
        processor only reorders this tensor's rows (gguf-py's de-quantizer makes several
        full-size fp32 temporaries: 1.6 GB for a 1B model's embedding), else whole."""
        tensor = self.tensor(name)
        order = self._row_order(tensor)
        if order is None:
            out.copy_(self._processed(tensor, tensor.values()))
            return
        rows, start = out.view(-1, tensor.shape[-1]), 0
        for block in self._blocks(tensor, order, ROWS_AT_ONCE):
            rows[start : start + len(block)] = block.to(out.dtype)
            start += len(block)

    def get(self, name: str) -> torch.Tensor:
        return self.read(name, torch.float32)

    def read(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        out = torch.empty(self.shape(name), dtype=dtype)
        self.read_into(name, out)
        return out

    def row_blocks(self, name: str, rows: int = ROWS_AT_ONCE) -> Iterator[torch.Tensor]:
        """Each block from the stored rows that land in it (a reorder keeps them near: Llama's q
        and k move rows within a head), de-quantized; a tensor the processor does more to, whole."""
        tensor = self.tensor(name)
        order = self._row_order(tensor)
        if order is None:
            yield from self.get(name).split(rows)
            return
        yield from self._blocks(tensor, order, rows)

    @staticmethod
    def _blocks(tensor: GgufTensor, order: torch.Tensor, rows: int) -> Iterator[torch.Tensor]:
        """A matrix's rows in transformers' order, `rows` at a time, each de-quantized from the
        stored rows that land in it (order: where each stored row goes, from _row_order)."""
        placed = torch.argsort(order)  # out row r holds stored row placed[r]
        for start in range(0, tensor.shape[0], rows):
            block = placed[start : start + rows]
            first, last = int(block.min()), int(block.max()) + 1
            yield torch.from_numpy(tensor.rows(first, last))[block - first]

    def _processed(self, tensor: GgufTensor, values: np.ndarray) -> torch.Tensor:
        parsed: dict[str, dict] = {"config": self._config, "tensors": {}}
        result = self._processor.process(
            weights=values, name=tensor.name, tensor_key_mapping=self._gguf_names, parsed_parameters=parsed
        )
        return torch.from_numpy(np.array(result.weights, dtype=np.float32))

    def _row_order(self, tensor: GgufTensor) -> torch.Tensor | None:
        """Where the processor puts each stored row of a matrix (out[order[i]] = stored row i),
        found by processing the row indices; None when it does more than reorder rows (or the
        tensor is not a matrix)."""
        if len(tensor.shape) != 2:
            return None
        index = np.arange(tensor.shape[0], dtype=np.float32)[:, None]
        moved = np.asarray(self._processed(tensor, index))
        if moved.shape != index.shape or not np.array_equal(np.sort(moved[:, 0]), index[:, 0]):
            return None
        placed = torch.from_numpy(moved[:, 0].astype(np.int64))  # out row r holds stored row placed[r]
        order = torch.empty_like(placed)
        order[placed] = torch.arange(len(placed))
        return order

    def int4_blocks(self, name: str) -> Int4Weight | None:
        tensor = self.tensor(name)
        if tensor.kind not in BLOCK_BYTES:
            return None
        weight = unpack_int4_blocks(tensor.raw(), tensor.kind)
        # The processor's row permutation (Llama's q and k), applied to the row indices.
        rows = np.arange(weight.q.shape[0])[:, None]
        order = torch.from_numpy(np.ascontiguousarray(self._processor.process(rows, tensor.name).weights[:, 0]))
        return Int4Weight(weight.q[order], weight.scales[order], weight.zeros[order], weight.group)

    def nbytes(self) -> int:
        return self.path.stat().st_size
