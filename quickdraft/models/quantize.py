"""Weight-only quantization formats of the native backend, as pure functions.

int8: one symmetric scale per output channel, w ~ q * scale with q in [-127, 127].
int4: one scale and zero point per group of `group` inputs of a channel, w ~ (q - 8) * scale + zero
with q in [0, 15]; this is the form PyTorch's CPU int4 kernel dequantizes, and GGUF's Q4_0
(w = d (q - 8)) and Q4_1 (w = d q + m) blocks map onto it exactly: scale = d, zero = m + 8 d.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

INT4_GROUP = 32  # inputs per scale: GGUF's block size, and accurate enough for a 135M model


@dataclass
class Int8Weight:
    q: torch.Tensor  # [out, in] int8
    scales: torch.Tensor  # [out] fp32


@dataclass
class Int4Weight:
    q: torch.Tensor  # [out, in] uint8, values 0..15
    scales: torch.Tensor  # [out, in / group] fp32
    zeros: torch.Tensor  # [out, in / group] fp32: the value of q = 8
    group: int


def quantize_int8(weight: torch.Tensor) -> Int8Weight:
    """Round each output channel to 255 levels symmetric about 0 (the largest |w| maps to 127)."""
    w = weight.float()
    scales = (w.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)  # [out]
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return Int8Weight(q, scales)


def dequantize_int8(weight: Int8Weight) -> torch.Tensor:
    return weight.q.float() * weight.scales[:, None]


def quantize_int4(weight: torch.Tensor, group: int = INT4_GROUP) -> Int4Weight:
    """Round each group of `group` inputs to 16 levels spanning its own [min, max] (asymmetric:
    a group's values are rarely centred on 0, so a zero point buys a bit of precision)."""
    out_features, in_features = weight.shape
    if in_features % group:
        raise ValueError(f"int4 groups of {group} need an input size divisible by it, not {in_features}")
    w = weight.float().reshape(out_features, in_features // group, group)  # [out, groups, group]
    low, high = w.amin(dim=-1), w.amax(dim=-1)  # [out, groups]
    scales = ((high - low) / 15).clamp(min=torch.finfo(torch.float32).tiny)
    q = torch.round((w - low[..., None]) / scales[..., None]).clamp(0, 15)
    return Int4Weight(q.to(torch.uint8).reshape(out_features, in_features), scales, low + 8 * scales, group)


def dequantize_int4(weight: Int4Weight) -> torch.Tensor:
    out_features, in_features = weight.q.shape
    q = weight.q.float().reshape(out_features, in_features // weight.group, weight.group)
    w = (q - 8) * weight.scales[..., None] + weight.zeros[..., None]
    return w.reshape(out_features, in_features)


def stack_int4(parts: list[Int4Weight]) -> Int4Weight:
    """Fuse several int4 weights over the same input along their outputs (q, k, v -> qkv)."""
    if len({p.group for p in parts}) != 1:
        raise ValueError("fused int4 weights need one group size")
    return Int4Weight(torch.cat([p.q for p in parts]), torch.cat([p.scales for p in parts]),
                      torch.cat([p.zeros for p in parts]), parts[0].group)
