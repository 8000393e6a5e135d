"""y = x W^T + b on the CPU with the weight prepacked once for the math library.

Why: a plain F.linear repacks its weight for every call. For one-token passes in fp32 that
is cheap on some CPUs (MKL takes a gemv path), but for the multi-token verify passes of
speculative decoding it costs as much as the arithmetic; in bf16 oneDNN's AMX kernels want
their own blocked layout. Measured on an Intel Xeon over the default target's 121 weights
(cold caches): fp32, 8 rows 57 -> 38 ms; bf16, 1 to 16 rows 25 -> 18 ms (docs/bench/history.md, issue 4).
Which kernel wins at a given row count differs from CPU to CPU, so the backend measures it
at load (backends/kernel_timing.py) and passes its choice in as a Kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

PACK_BATCH_HINT = 16  # the row count the packed layout is tuned for (any count works)


@dataclass(frozen=True)
class Kernel:
    """How a linear layer computes a pass: `packed` takes the prepacked weight where there is
    one (else the plain kernel); `rows` pads the pass with zero rows up to that many first, a
    shape this machine runs faster (rows are independent: padding changes no real row)."""

    packed: bool = True
    rows: int = 0  # 0: no padding


def apply_linear(linear, x: torch.Tensor, kernel: Kernel | None) -> torch.Tensor:
    """linear(x) for x [n, in] computed the way `kernel` says (None: packed, unpadded) -> [n, out]."""
    if kernel is None:
        return linear(x)
    n = x.shape[0]
    if kernel.rows > n:
        x = F.pad(x, (0, 0, 0, kernel.rows - n))  # [rows, in]: zero rows after the real ones
    y = linear.run(x, kernel.packed) if isinstance(linear, PackedLinear) else linear(x)
    return y[:n]


def _mkldnn(dtype: torch.dtype) -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedLinear:
    """A linear layer over a fixed weight [out, in] (and bias [out]), prepacked when the CPU allows."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, pack: bool = True) -> None:
        self.weight, self.bias = weight, bias
        self.out_features, self.in_features = weight.shape
        # oneDNN's blocked copy of the weight (CPU only; elsewhere the plain kernel runs).
        self._packed = None
        if (
            pack
            and weight.device.type == "cpu"
            and weight.dtype in (torch.float32, torch.bfloat16)
            and _mkldnn(weight.dtype)
        ):
            self._packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_BATCH_HINT)

    @property
    def nbytes(self) -> int:
        """Weight bytes a pass reads."""
        return self.weight.numel() * self.weight.element_size()

    @property
    def has_packed(self) -> bool:
        return self._packed is not None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """[n, in] -> [n, out] with the packed weight when there is one."""
        return self.run(x, True)

    def run(self, x: torch.Tensor, packed: bool) -> torch.Tensor:
        """[n, in] -> [n, out]; packed=False takes F.linear (MKL or cuBLAS) even when a packed copy exists."""
        if packed and self._packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


COLUMN_BLOCK = 16  # rows as matmul columns come in whole blocks of this many: each stays on the main kernel


WIDEN_BYTES = 8 << 20  # fp32 weight rows widened at once: a block that stays in cache (measured fastest near 8 MiB)


def whole_column_blocks(n: int) -> int:
    """n rounded up to whole COLUMN_BLOCKs: the column count a row-invariant matmul computes."""
    return -(-n // COLUMN_BLOCK) * COLUMN_BLOCK


def as_columns(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x [n, in] -> [in, whole_column_blocks(n)] in dtype, zero columns after the real ones: rows as
    columns in whole blocks, so each row's products take the same kernel whatever n is."""
    columns = torch.zeros(x.shape[1], whole_column_blocks(x.shape[0]), dtype=dtype, device=x.device)
    columns[:, : x.shape[0]] = x.T
    return columns


class ColumnLinear:
    """y = x W^T + b computed as W x^T, x's rows padded to whole blocks of columns.

    Why: oneDNN's packed bf16 matmul picks its kernel by the number of rows, so a token's
    output could change in its last bit with the tokens beside it (measured: 34-139 of ~800
    rows differed for the default target's shapes), which breaks exact greedy speculation.
    With the weight on the left and the rows as columns in whole blocks, no row of 2,400
    differed; a one-token pass costs about 1.5x the packed kernel's.

    The weight may be held in fp32 (bf16 values widened): a bf16 x bf16 product is exact in
    fp32, so only the order of the fp32 sums differs from a bf16 kernel's, and each row is still
    computed on its own. On CPUs without bf16 arithmetic that is many times faster (measured
    35x on an AMD EPYC); the output is rounded to the activations' dtype either way.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight, self.bias = weight, bias  # [out, in] (bf16, or bf16 values in fp32), [out]
        self.out_features, self.in_features = weight.shape

    @property
    def nbytes(self) -> int:
        """Weight bytes a pass reads."""
        return self.weight.numel() * self.weight.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """[n, in] -> [n, out] in x's dtype."""
        columns = as_columns(x, self.weight.dtype)  # [in, n (+ pad)]
        y = torch.matmul(self.weight, columns)[:, : x.shape[0]].T.to(x.dtype)  # [n, out]
        return y if self.bias is None else y + self.bias


class RowLinear:
    """y = x W^T + b one row at a time: each row is a one-row F.linear, so a token's output is the
    same whatever else is in its pass, with the weight kept in bf16.

    Why: on CPUs without bf16 arithmetic (AVX2 alone) PyTorch's one-row bf16 product is its fast
    path (about what transformers' plain decoding costs), while ColumnLinear's 16 bf16 columns
    cost 20-30x that; widening to fp32 instead would double the weights' memory. A pass of n rows
    costs n one-row products, which is what bf16 costs there anyway (measured on an AMD EPYC:
    F.linear of n bf16 rows took n times one row's time).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight, self.bias = weight, bias  # [out, in], [out]
        self.out_features, self.in_features = weight.shape

    @property
    def nbytes(self) -> int:
        """Weight bytes a pass reads."""
        return self.weight.numel() * self.weight.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """[n, in] -> [n, out] in x's dtype."""
        y = torch.empty(x.shape[0], self.out_features, dtype=x.dtype, device=x.device)
        for row in range(x.shape[0]):
            y[row : row + 1] = F.linear(x[row : row + 1].to(self.weight.dtype), self.weight, self.bias)
        return y

    def widened(self, x: torch.Tensor) -> torch.Tensor:
        """[n, in] -> [n, out] in x's dtype, as ColumnLinear over the weight widened to fp32, a block
        of WIDEN_BYTES of it at a time (memory: one block beside the bf16 weight).

        Why: a prompt's many rows cost n one-row products in __call__, while fp32 arithmetic on
        widened blocks costs little more for 64 rows than for 8 (measured on an AMD EPYC at
        Llama-3-8B's MLP shape: 32 rows 202 -> 47 ms, 128 rows 772 -> 108 ms; a single row 6 -> 40 ms).
        Each row is still computed on its own (whole column blocks, fixed weight blocks), but its
        last bits differ from __call__'s: a backend uses this for prompt rows only, every prompt
        alike (SeqPass.prompt), so no decoded row is ever compared with a widened one."""
        columns = as_columns(x, torch.float32)  # [in, n (+ pad)]
        block = max(1, WIDEN_BYTES // (4 * self.in_features))
        y = torch.empty(x.shape[0], self.out_features, dtype=x.dtype, device=x.device)
        for first in range(0, self.out_features, block):
            wide = self.weight[first : first + block].float()  # [block, in]
            y[:, first : first + block] = torch.matmul(wide, columns)[:, : x.shape[0]].T.to(x.dtype)
        return y if self.bias is None else y + self.bias
