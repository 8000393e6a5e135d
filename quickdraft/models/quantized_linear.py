"""Linear layers over int8 or int4 weights, computed by PyTorch's own CPU kernels.

Why these kernels: in a trial over the default target's 120 layer matrices (2 threads, cold
caches) one-token products took 14.1 ms with prepacked bf16 weights, 10.4 ms with per-channel
int8 and 4.4 ms with group-wise int4; whole passes are in docs/bench/precisions.md (runner bench). Both
kernels want bf16 activations (their fp32 paths are not vectorised: 10-30x slower), and both
compute each row of a pass independently of the others (tests/test_quantize.py), so a verify
pass gives every token bit-for-bit the result a one-token pass gives it: greedy speculation
stays exactly plain greedy decoding.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from quickdraft.models.quantize import ROWS_AT_ONCE, Int4Weight, Int8Weight, quantize_int4, quantize_int8

INT4_OUT_MULTIPLE = 16  # the int4 kernel's packed layout needs outputs in multiples of 16
INT4_GROUPS = (32, 64, 128, 256)  # the group sizes the int4 kernel takes


class Int8Linear:
    """y = x (q * scale)^T + b with an int8 weight [out, in] and a scale per output channel."""

    def __init__(self, weight: Int8Weight, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        self.q = weight.q  # [out, in] int8
        self.scales = weight.scales.to(dtype)  # [out]
        self.bias = None if bias is None else bias.to(dtype)
        self.out_features, self.in_features = weight.q.shape

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
        # [out, in/2], packed a block of rows at a time (rows pack alone: equal to one call, and
        # the int32 copy the packer takes stays small)
        self.packed = torch.cat(
            [
                torch.ops.aten._convert_weight_to_int4pack_for_cpu(rows.to(torch.int32), 1)
                for rows in weight.q.split(ROWS_AT_ONCE)
            ]
        )
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


def quantized_linear(
    weight: torch.Tensor, bias: torch.Tensor | None, kind: str, dtype: torch.dtype, group: int = 32
) -> Int8Linear | Int4Linear:
    """An int8 or int4 layer for a float `weight` [out, in] (rounded from fp32 values); int4 falls
    back to int8 for shapes its kernel cannot take."""
    return fused_quantized_linear([weight], tuple(weight.shape), bias, kind, dtype, group)


def fused_quantized_linear(
    parts: Iterable[torch.Tensor],
    shape: tuple[int, int],
    bias: torch.Tensor | None,
    kind: str,
    dtype: torch.dtype,
    group: int = 32,
) -> Int8Linear | Int4Linear:
    """One layer for weights fused along outputs into `shape` [out, in], each part rounded as it
    comes (rows are rounded on their own, so this equals rounding the fused matrix): a generator
    of parts holds one at full width at a time."""
    if kind not in ("int4", "int8"):
        raise ValueError(f"unknown quantized weight kind {kind!r}")
    four = kind == "int4" and int4_fits(*shape, group)
    whole = Int4Weight.empty(shape, group) if four else Int8Weight.empty(shape)
    row = 0
    for part in parts:  # each written into its rows of the fused weight
        rows = whole.rows(row, row + part.shape[0])
        quantize_int4(part, group, out=rows) if four else quantize_int8(part, out=rows)
        row += part.shape[0]
    return Int4Linear(whole, bias, dtype) if four else Int8Linear(whole, bias, dtype)
