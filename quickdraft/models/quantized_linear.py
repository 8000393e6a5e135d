"""Linear layers over int8 or int4 weights, computed by PyTorch's own CPU kernels.

Why these kernels: in a trial over the default target's 120 layer matrices (2 threads, cold
caches) one-token products took 14.1 ms with prepacked bf16 weights, 10.4 ms with per-channel
int8 and 4.4 ms with group-wise int4; whole passes are in BENCHMARKS.md (runner bench). Both
kernels want bf16 activations (their fp32 paths are not vectorised: 10-30x slower), and both
compute each row of a pass independently of the others (tests/test_quantize.py), so a verify
pass gives every token bit-for-bit the result a one-token pass gives it: greedy speculation
stays exactly plain greedy decoding.
"""

from __future__ import annotations

import torch

from quickdraft.models.quantize import Int4Weight, quantize_int4, quantize_int8

INT4_OUT_MULTIPLE = 16  # the int4 kernel's packed layout needs outputs in multiples of 16
INT4_GROUPS = (32, 64, 128, 256)  # the group sizes the int4 kernel takes


class Int8Linear:
    """y = x (q * scale)^T + b with an int8 weight [out, in] and a scale per output channel."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        quantized = quantize_int8(weight)
        self.q = quantized.q  # [out, in] int8
        self.scales = quantized.scales.to(dtype)  # [out]
        self.bias = None if bias is None else bias.to(dtype)
        self.out_features, self.in_features = weight.shape

    @property
    def nbytes(self) -> int:
        """Weight bytes a pass reads: the int8 values and their scales."""
        return self.q.numel() + self.scales.numel() * self.scales.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """[n, in] -> [n, out]."""
        y = torch.ops.aten._weight_int8pack_mm(x, self.q, self.scales)
        return y if self.bias is None else y + self.bias


class Int4Linear:
    """y = x W^T + b with W = (q - 8) * scale + zero per group of inputs, q packed two per byte."""

    def __init__(self, weight: Int4Weight, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(weight.q.to(torch.int32), 1)  # [out, in/2]
        # The kernel's layout: [in / group, out, (scale, zero)].
        pairs = torch.stack([weight.scales, weight.zeros], dim=-1)  # [out, in / group, 2]
        self.scales_and_zeros = pairs.transpose(0, 1).contiguous().to(dtype)
        self.group = weight.group
        self.bias = None if bias is None else bias.to(dtype)
        self.out_features, self.in_features = weight.q.shape

    @property
    def nbytes(self) -> int:
        """Weight bytes a pass reads: two 4-bit values a byte, and each group's scale and zero."""
        return self.packed.numel() + self.scales_and_zeros.numel() * self.scales_and_zeros.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """[n, in] -> [n, out]."""
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, self.group, self.scales_and_zeros)
        return y if self.bias is None else y + self.bias


def int4_fits(out_features: int, in_features: int, group: int) -> bool:
    return out_features % INT4_OUT_MULTIPLE == 0 and group in INT4_GROUPS and in_features % group == 0


def quantized_linear(weight: torch.Tensor, bias: torch.Tensor | None, kind: str, dtype: torch.dtype,
                     blocks: Int4Weight | None = None, group: int = 32) -> Int8Linear | Int4Linear:
    """An int8 or int4 layer for an fp32 `weight` [out, in]. int4 takes the file's own `blocks`
    when given (no second rounding), and falls back to int8 for shapes its kernel cannot take."""
    if kind == "int4":
        if blocks is not None and int4_fits(*blocks.q.shape, blocks.group):
            return Int4Linear(blocks, bias, dtype)
        if int4_fits(*weight.shape, group):
            return Int4Linear(quantize_int4(weight, group), bias, dtype)
        return Int8Linear(weight, bias, dtype)
    if kind == "int8":
        return Int8Linear(weight, bias, dtype)
    raise ValueError(f"unknown quantized weight kind {kind!r}")
