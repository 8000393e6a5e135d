"""GGUF files with random weights at chosen shapes, in a real file's architecture and tokenizer, and
their quantized copies made by llama.cpp's own quantizer: what tests and benchmarks run where no
model of that size or type is on hand (nothing is downloaded, nothing shipped)."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from tqdm import tqdm

from quickdraft.errors import QuickdraftError

VOCAB_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")
# The file types users' GGUFs have, by llama.cpp's names (its llama_ftype values).
Q4_0_BLOCK, Q4_0_BYTES = 32, 18  # weights per block; its bytes: an fp16 scale and 16 of nibbles
FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 8, "Q8_0": 7, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18}


@dataclass(frozen=True)
class GgufShape:
    """A decoder's sizes. window: the sliding window of architectures that have one (Gemma 3)."""

    hidden: int
    layers: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    context: int = 2048
    window: int | None = None

    def metadata(self, arch: str) -> dict[str, int]:
        """The GGUF keys that carry these sizes (the values that replace the real file's)."""
        keys = {
            "embedding_length": self.hidden,
            "block_count": self.layers,
            "feed_forward_length": self.ffn,
            "attention.head_count": self.heads,
            "attention.head_count_kv": self.kv_heads,
            "attention.key_length": self.head_dim,
            "attention.value_length": self.head_dim,
            "rope.dimension_count": self.head_dim,
            "context_length": self.context,
        }
        if self.window is not None:
            keys["attention.sliding_window"] = self.window
        return {f"{arch}.{key}": value for key, value in keys.items()}


def _tensor_shape(role: str, shape: GgufShape, vocab: int) -> tuple[int, ...]:
    """A tensor's numpy shape [out, in] (GGUF lists it the other way round) by its name's role."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    shapes = {
        "token_embd": (vocab, h),
        "output": (vocab, h),
        "attn_q": (q, h),
        "attn_k": (kv, h),
        "attn_v": (kv, h),
        "attn_output": (h, q),
        "ffn_gate": (shape.ffn, h),
        "ffn_up": (shape.ffn, h),
        "ffn_down": (h, shape.ffn),
        "attn_q_norm": (shape.head_dim,),
        "attn_k_norm": (shape.head_dim,),
    }
    if role in shapes:
        return shapes[role]
    if role.endswith("_norm"):  # attn_norm, ffn_norm, output_norm, post_attention_norm, post_ffw_norm
        return (h,)
    raise QuickdraftError(f"no random shape for GGUF tensor role {role!r}")


def _copy_fields(
    reader: gguf.GGUFReader, writer: gguf.GGUFWriter, replaced: dict[str, int], vocab: int | None, dtype: str
) -> None:
    """Every metadata key of the real file (its tokenizer, chat template, rope settings), with
    the sizes replaced, the file type set to `dtype`'s, and the vocabulary cut to its first `vocab`
    tokens if given."""
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        types = field.types
        value = field.contents()
        if vocab is not None and key in VOCAB_ARRAYS:
            value = value[:vocab]
        elif vocab is not None and key == "tokenizer.ggml.merges":
            continue  # merges of cut tokens would name tokens the file no longer has
        elif key in replaced:
            value = replaced[key]
        elif key == "general.file_type":
            value = FILE_TYPES[dtype]
        sub_type = types[-1] if types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, types[0], sub_type)
    for key, value in replaced.items():
        if key not in reader.fields:
            writer.add_uint32(key, value)


def random_gguf(
    like: str | Path,
    out: str | Path,
    shape: GgufShape,
    seed: int = 0,
    vocab: int | None = None,
    dtype: str = "F32",
    progress: bool = False,
) -> Path:
    """A GGUF at `out` with `like`'s architecture, tokenizer and tensor names, and random weights
    at `shape`: matrices ~ N(0, 1/fan_in) so activations keep their scale, embeddings scaled so
    next-token distributions are peaked rather than flat, norms at one. vocab: keep only the first
    tokens (a file for tests of everything but the tokenizer's merges). dtype: "F32", "F16" or
    "Q4_0" (random 4-bit blocks written as they are: a real-size file in seconds, no quantizer)
    for the matrices (norms stay F32, as converters write them). Tensors are made and written one
    at a time, so a model of any size needs memory for its largest tensor only."""
    if dtype not in ("F32", "F16", "Q4_0"):
        raise QuickdraftError(f"random GGUF files are written as F32, F16 or Q4_0, not {dtype!r}")
    reader = gguf.GGUFReader(str(like))
    arch = reader.fields["general.architecture"].contents()
    embedding = next(t for t in reader.tensors if t.name == "token_embd.weight")
    vocab = vocab or int(embedding.shape[1])
    writer = gguf.GGUFWriter(str(out), arch)
    replaced = shape.metadata(arch)
    if f"{arch}.vocab_size" in reader.fields:
        replaced[f"{arch}.vocab_size"] = vocab
    _copy_fields(reader, writer, replaced, vocab if vocab < int(embedding.shape[1]) else None, dtype)
    names = {re.sub(r"^blk\.\d+\.", "", t.name) for t in reader.tensors if t.name.startswith("blk.")}
    top = [t.name for t in reader.tensors if not t.name.startswith("blk.")]
    tensors = [
        (name, _tensor_shape(name.removesuffix(".weight").split(".")[-1], shape, vocab))
        for name in top + [f"blk.{i}.{n}" for i in range(shape.layers) for n in sorted(names)]
    ]
    matrix = np.float16 if dtype == "F16" else np.float32
    for name, size in tensors:
        if len(size) > 1 and dtype == "Q4_0":
            rows = (size[0], size[1] // Q4_0_BLOCK * Q4_0_BYTES)  # [out, bytes of a row's blocks]
            writer.add_tensor_info(
                name, rows, np.dtype(np.uint8), int(np.prod(rows)), raw_dtype=gguf.GGMLQuantizationType.Q4_0
            )
            continue
        kind = np.float32 if len(size) == 1 else matrix
        writer.add_tensor_info(name, size, np.dtype(kind), int(np.prod(size)) * np.dtype(kind).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, size in tqdm(
        tensors, desc=f"writing {Path(out).name}", unit="tensor", disable=not progress, file=sys.stderr
    ):
        if len(size) == 1:
            values = np.ones(size, dtype=np.float32)
        else:
            scale = 3.0 if name.startswith(("token_embd", "output.")) else 1.0  # logits of std ~3: peaked
            if dtype == "Q4_0":
                writer.write_tensor_data(_random_q4_0(rng, size, scale / np.sqrt(size[1])))
                continue
            values = rng.standard_normal(size, dtype=np.float32)
            values *= scale / np.sqrt(size[1])
            values = values.astype(matrix, copy=False)
        writer.write_tensor_data(values)
    writer.close()
    return Path(out)


def _random_q4_0(rng: np.random.Generator, size: tuple[int, int], std: float) -> np.ndarray:
    """Q4_0 blocks [out, in / 32 * 18] of weights d (q - 8), q uniform in 0..15, with one scale d
    that gives them standard deviation `std` (uniform q - 8 has std 4.61)."""
    out, blocks = size[0], size[1] // Q4_0_BLOCK
    raw = rng.integers(0, 256, (out, blocks, Q4_0_BYTES), dtype=np.uint8)
    raw[..., :2] = np.full((out, blocks, 1), std / 4.61, dtype=np.float16).view(np.uint8)
    return raw.reshape(out, blocks * Q4_0_BYTES)


def quantize_gguf(
    source: str | Path, out: str | Path, file_type: str, threads: int = 0, allow_requantize: bool = False
) -> Path:
    """`source` quantized to `file_type` (a FILE_TYPES name) by llama.cpp's quantizer, as
    llama-quantize does (its default mixture of tensor types for the K-quant file types).
    allow_requantize: `source` may itself be quantized (as llama-quantize --allow-requantize)."""
    from quickdraft.backends.llama_cpp import require_llama_cpp

    if file_type not in FILE_TYPES:
        raise QuickdraftError(f"file type {file_type!r} is not one of {', '.join(FILE_TYPES)}")
    lib = require_llama_cpp()
    params = lib.llama_model_quantize_default_params()
    params.ftype = FILE_TYPES[file_type]
    params.nthread = threads
    params.allow_requantize = allow_requantize
    if lib.llama_model_quantize(str(source).encode(), str(out).encode(), params) != 0:
        raise QuickdraftError(f"llama.cpp could not quantize {source} to {file_type}")
    return Path(out)
