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
# Rows rounded at a time: each row is rounded on its own, so this changes no value, and it bounds
# the fp32 temporaries of a large matrix (an 8B model's fused gate/up is 470 MB at fp32).
ROWS_AT_ONCE = 1024


@dataclass
class Int8Weight:
    q: torch.Tensor  # [out, in] int8
    scales: torch.Tensor  # [out] fp32

    @classmethod
    def empty(cls, shape: tuple[int, int]) -> Int8Weight:
        return cls(torch.empty(shape, dtype=torch.int8), torch.empty(shape[0]))

    def rows(self, start: int, stop: int) -> Int8Weight:
        """A view of output rows start..stop (writing it writes this weight)."""
        return Int8Weight(self.q[start:stop], self.scales[start:stop])


@dataclass
class Int4Weight:
    q: torch.Tensor  # [out, in] uint8, values 0..15
    scales: torch.Tensor  # [out, in / group] fp32
    zeros: torch.Tensor  # [out, in / group] fp32: the value of q = 8
    group: int

    @classmethod
    def empty(cls, shape: tuple[int, int], group: int) -> Int4Weight:
        groups = (shape[0], shape[1] // group)
        return cls(torch.empty(shape, dtype=torch.uint8), torch.empty(groups), torch.empty(groups), group)

    def rows(self, start: int, stop: int) -> Int4Weight:
        """A view of output rows start..stop (writing it writes this weight)."""
        return Int4Weight(self.q[start:stop], self.scales[start:stop], self.zeros[start:stop], self.group)


def quantize_int8(weight: torch.Tensor, out: Int8Weight | None = None) -> Int8Weight:
    """Round each output channel to 255 levels symmetric about 0 (the largest |w| maps to 127).
    out: where to write (rows of a fused weight; made when None)."""
    out = out if out is not None else Int8Weight.empty(tuple(weight.shape))
    for start in range(0, weight.shape[0], ROWS_AT_ONCE):
        w = weight[start : start + ROWS_AT_ONCE].float()
        scales = (w.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)  # [rows]
        out.q[start : start + ROWS_AT_ONCE] = torch.round(w / scales[:, None]).clamp(-127, 127)
        out.scales[start : start + ROWS_AT_ONCE] = scales
    return out


def dequantize_int8(weight: Int8Weight) -> torch.Tensor:
    return weight.q.float() * weight.scales[:, None]


def quantize_int4(weight: torch.Tensor, group: int = INT4_GROUP, out: Int4Weight | None = None) -> Int4Weight:
    """Round each group of `group` inputs to 16 levels spanning its own [min, max] (asymmetric:
    a group's values are rarely centred on 0, so a zero point buys a bit of precision).
    out: where to write (rows of a fused weight; made when None)."""
    out_features, in_features = weight.shape
    if in_features % group:
        raise ValueError(f"int4 groups of {group} need an input size divisible by it, not {in_features}")
    out = out if out is not None else Int4Weight.empty((out_features, in_features), group)
    for start in range(0, out_features, ROWS_AT_ONCE):
        rows = slice(start, start + ROWS_AT_ONCE)
        w = weight[rows].float().reshape(-1, in_features // group, group)  # [rows, groups, group]
        low, high = w.amin(dim=-1), w.amax(dim=-1)  # [rows, groups]
        scales = ((high - low) / 15).clamp(min=torch.finfo(torch.float32).tiny)
        q = torch.round((w - low[..., None]) / scales[..., None]).clamp(0, 15)
        out.q[rows] = q.reshape(-1, in_features)
        out.scales[rows], out.zeros[rows] = scales, low + 8 * scales
    return out


def dequantize_int4(weight: Int4Weight) -> torch.Tensor:
    out_features, in_features = weight.q.shape
    q = weight.q.float().reshape(out_features, in_features // weight.group, weight.group)
    w = (q - 8) * weight.scales[..., None] + weight.zeros[..., None]
    return w.reshape(out_features, in_features)


def stack_int4(parts: list[Int4Weight]) -> Int4Weight:
    """Fuse several int4 weights over the same input along their outputs (q, k, v -> qkv)."""
    if len({p.group for p in parts}) != 1:
        raise ValueError("fused int4 weights need one group size")
    return Int4Weight(
        torch.cat([p.q for p in parts]),
        torch.cat([p.scales for p in parts]),
        torch.cat([p.zeros for p in parts]),
        parts[0].group,
    )
