"""The native backend's precisions: how weights are stored and what dtype activations use."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quickdraft.errors import QuickdraftError


@dataclass(frozen=True)
class Precision:
    name: str
    dtype: torch.dtype  # activations, norms and the KV cache
    weights: str  # "dense" (weights in `dtype`), "int8" (per channel) or "int4" (groups of 32)


# The quantized kernels take bf16 activations only (fp32 and fp16 paths are not vectorised).
PRECISIONS = {
    "fp32": Precision("fp32", torch.float32, "dense"),
    "bf16": Precision("bf16", torch.bfloat16, "dense"),
    "int8": Precision("int8", torch.bfloat16, "int8"),
    "int4": Precision("int4", torch.bfloat16, "int4"),
    "fp16": Precision("fp16", torch.float16, "dense"),  # the hf backend's, for fp16 checkpoints
}


def precision_of(dtype: torch.dtype) -> str:
    """The dense precision a checkpoint stores its weights in: fp32 for anything not bf16 or fp16
    (a GGUF file's quantized tensors read as fp32)."""
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")


def get_precision(name: str) -> Precision:
    if name not in PRECISIONS:
        raise QuickdraftError(f"unknown precision {name!r}; choose one of: {', '.join(PRECISIONS)}")
    return PRECISIONS[name]
