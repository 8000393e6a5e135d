"""Read a GGUF file's 4-bit blocks (Q4_0, Q4_1) as int4 weights, without a detour through fp32.

A Q4_1 block is 32 weights w = d * q + m (q in 0..15, d and m fp16); Q4_0 is w = d * (q - 8).
Both are exactly the int4 runtime form (q - 8) * scale + zero. Rows come out in the order
transformers loaded the model in (it permutes Llama's q and k rows; we apply its own
permutation to the row indices), keyed by the transformers parameter name.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel
from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

from quickdraft.models.gguf_convert import gguf_to_hf_names, read_table
from quickdraft.models.quantize import Int4Weight

BLOCK = 32  # weights per GGUF block
BLOCK_BYTES = {GGMLQuantizationType.Q4_0: 18, GGMLQuantizationType.Q4_1: 20}  # fp16 d (+ fp16 m) + 16 bytes of nibbles


def unpack_q4_blocks(raw: np.ndarray, kind: GGMLQuantizationType) -> Int4Weight:
    """Rows of Q4_0/Q4_1 bytes [out, in / 32 * bytes] -> Int4Weight [out, in]."""
    out_features = raw.shape[0]
    blocks = raw.reshape(out_features, -1, BLOCK_BYTES[kind])  # [out, groups, bytes]
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # [out, groups]
    if kind == GGMLQuantizationType.Q4_1:
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        nibbles = blocks[..., 4:]
    else:
        m = -8 * d  # Q4_0: w = d q - 8 d
        nibbles = blocks[..., 2:]
    # Byte j holds weight j in its low nibble and weight j + 16 in its high nibble.
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1).reshape(out_features, -1)  # [out, in]
    return Int4Weight(torch.from_numpy(q.astype(np.uint8)), torch.from_numpy(d),
                      torch.from_numpy(m + 8 * d), BLOCK)


def read_int4_blocks(path: str | Path, model: PreTrainedModel) -> dict[str, Int4Weight]:
    """Every Q4_0/Q4_1 weight of the GGUF file `model` was loaded from, by parameter name."""
    metadata, tensors = read_table(path)
    architecture = metadata["general.architecture"]
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=model.config.to_dict())
    names = gguf_to_hf_names(model, architecture)
    blocks = {}
    for tensor in tensors:
        if tensor.kind not in BLOCK_BYTES or tensor.name not in names:
            continue
        weight = unpack_q4_blocks(np.asarray(tensor.raw), tensor.kind)
        rows = np.arange(weight.q.shape[0])[:, None]
        order = torch.from_numpy(np.ascontiguousarray(processor.process(rows, tensor.name).weights[:, 0]))
        blocks[names[tensor.name]] = Int4Weight(weight.q[order], weight.scales[order], weight.zeros[order], BLOCK)
    return blocks


def cached_int4_blocks(path: str | Path, model: PreTrainedModel, cache_file: Path) -> dict[str, Int4Weight]:
    """read_int4_blocks, kept as safetensors beside the converted model (reading a GGUF's
    metadata and tokenizer takes seconds; this file loads in a blink)."""
    if cache_file.is_file():
        flat = load_file(str(cache_file))
        stems = {key.rsplit(".", 1)[0] for key in flat}
        return {stem: Int4Weight(flat[f"{stem}.q"], flat[f"{stem}.scales"], flat[f"{stem}.zeros"], BLOCK)
                for stem in stems}
    blocks = read_int4_blocks(path, model)
    flat = {f"{name}.{part}": getattr(weight, part).contiguous()
            for name, weight in blocks.items() for part in ("q", "scales", "zeros")}
    staging = cache_file.with_suffix(".partial")
    save_file(flat, str(staging))
    staging.rename(cache_file)  # atomic: a half-written cache is never read
    return blocks
