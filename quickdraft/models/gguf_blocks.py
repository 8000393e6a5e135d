"""Read a GGUF file's 4-bit blocks (Q4_0, Q4_1, Q4_K) as int4 weights, without a detour through fp32.

A Q4_1 block is 32 weights w = d * q + m (q in 0..15, d and m fp16); Q4_0 is w = d * (q - 8).
A Q4_K super-block is 256 weights in 8 groups of 32, w = (d * sc) * q - (dmin * mn), with 6-bit
sc and mn per group and fp16 d and dmin per super-block. All three are exactly the int4 runtime
form (q - 8) * scale + zero with groups of 32. models/weights.py puts the rows in transformers'
order (it permutes Llama's q and k rows).
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType

from quickdraft.models.quantize import Int4Weight

BLOCK = 32  # weights per int4 group (a Q4_0/Q4_1 block; an eighth of a Q4_K super-block)
# Bytes per block: fp16 d (+ fp16 m) + 16 bytes of nibbles; Q4_K: fp16 d and dmin, 12 bytes of
# 6-bit scales and mins, 128 bytes of nibbles per 256 weights.
BLOCK_BYTES = {GGMLQuantizationType.Q4_0: 18, GGMLQuantizationType.Q4_1: 20, GGMLQuantizationType.Q4_K: 144}


def _fp16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The fp16 number at byte `at` of every block [..., bytes] -> fp32 [...]."""
    return blocks[..., at : at + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def unpack_int4_blocks(raw: np.ndarray, kind: GGMLQuantizationType) -> Int4Weight:
    """Rows of Q4_0/Q4_1/Q4_K bytes [out, blocks * bytes] -> Int4Weight [out, in], groups of 32."""
    out_features = raw.shape[0]
    blocks = raw.reshape(out_features, -1, BLOCK_BYTES[kind])  # [out, blocks, bytes]
    if kind == GGMLQuantizationType.Q4_K:
        return _unpack_q4_k(blocks)
    d = _fp16(blocks, 0)  # [out, groups]
    if kind == GGMLQuantizationType.Q4_1:
        m, nibbles = _fp16(blocks, 2), blocks[..., 4:]
    else:
        m, nibbles = -8 * d, blocks[..., 2:]  # Q4_0: w = d q - 8 d
    # Byte j holds weight j in its low nibble and weight j + 16 in its high nibble.
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1).reshape(out_features, -1)  # [out, in]
    return Int4Weight(torch.from_numpy(q.astype(np.uint8)), torch.from_numpy(d), torch.from_numpy(m + 8 * d), BLOCK)


def _unpack_q4_k(blocks: np.ndarray) -> Int4Weight:
    """Q4_K super-blocks [out, supers, 144] -> Int4Weight (ggml's dequantize_row_q4_K, as groups)."""
    out_features, supers = blocks.shape[:2]
    d, dmin = _fp16(blocks, 0), _fp16(blocks, 2)  # [out, supers]
    packed = blocks[..., 4:16].astype(np.uint16)  # [out, supers, 12]: ggml's get_scale_min_k4
    low, high = packed[..., 0:4], packed[..., 8:12]
    sc = np.concatenate([low & 63, (high & 0x0F) | ((low >> 6) << 4)], axis=-1)  # [out, supers, 8]
    mn = np.concatenate([packed[..., 4:8] & 63, (high >> 4) | ((packed[..., 4:8] >> 6) << 4)], axis=-1)
    nibbles = blocks[..., 16:].reshape(out_features, supers, 4, 1, 32)  # 64 weights per 32 bytes
    # In each 64 weights, the first 32 are the low nibbles, the next 32 the high ones.
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=3).reshape(out_features, -1)  # [out, in]
    scales = (d[..., None] * sc).reshape(out_features, -1)  # [out, groups]
    mins = (dmin[..., None] * mn).reshape(out_features, -1)
    return Int4Weight(
        torch.from_numpy(q.astype(np.uint8)),
        torch.from_numpy(scales.astype(np.float32)),
        torch.from_numpy((8 * scales - mins).astype(np.float32)),
        BLOCK,
    )
