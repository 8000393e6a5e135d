"""Draft-time copies of trained heads: every linear layer, and the LM-head slice, as int8 or int4
weights with bf16 activations (PyTorch's CPU kernels), with the layers that read one input fused
into one product. A draft step has a handful of rows, so its cost is reading weights: int8
reads a quarter of fp32's bytes, int4 an eighth. Rounding can only cost acceptance: the target
verifies every draft. Which kernel is faster differs between CPUs, so it is measured once per
machine (draft_kernel)."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from quickdraft.measured import REPEATS, cached_choice, wall_ms
from quickdraft.models.quantized_linear import quantized_linear

DRAFT_KERNELS = ("int8", "int4")
TIMED_ROWS = (1, 4)  # rows of a draft step: one state, or a level of the tree / the pairs a pass committed


class QuantizedLayer(nn.Module):
    """An nn.Linear stand-in over an int8 or int4 weight [out, in] (int4: int8 for shapes its kernel
    cannot take): fp32 in, fp32 out, bf16 inside."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, kernel: str = "int8") -> None:
        super().__init__()
        self.inner = quantized_linear(
            weight.detach().float(), None if bias is None else bias.detach(), kernel, torch.bfloat16
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)  # [n, in]
        return self.inner(rows).float().reshape(*x.shape[:-1], -1)


class FusedLayers(nn.Module):
    """Linear layers over one input as one product [n, sum(sizes)], split back into their outputs."""

    def __init__(self, layers: list[nn.Linear], kernel: str) -> None:
        super().__init__()
        biases = [layer.bias for layer in layers]
        bias = torch.cat([b.detach() for b in biases]) if all(b is not None for b in biases) else None
        self.layer = QuantizedLayer(torch.cat([layer.weight.detach() for layer in layers]), bias, kernel)
        self.sizes = [layer.out_features for layer in layers]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.layer(x).split(self.sizes, dim=-1)


def fused_key(names: tuple[str, ...]) -> str:
    return "+".join(names)


def outputs(module: nn.Module, names: tuple[str, ...], x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """module's linear layers `names` over one input x: one product where for_drafting fused them.
    The module lists them in FUSED_GROUPS and holds a `fused` nn.ModuleDict."""
    key = fused_key(names)
    if key in module.fused:
        return module.fused[key](x)
    return tuple(getattr(module, name)(x) for name in names)


def for_drafting(head: nn.Module, kernel: str = "int8") -> nn.Module:
    """`head` (MedusaHeads, EagleHead or Eagle3Head) with `kernel` ("int8" or "int4") linear layers
    and LM-head slice, the layers each module lists in FUSED_GROUPS fused, changed in place (it
    can no longer be trained) and returned."""
    if kernel not in DRAFT_KERNELS:
        raise ValueError(f"draft kernel must be one of {DRAFT_KERNELS}, not {kernel!r}")
    fast = head.eval()
    for module in list(fast.modules()):
        for names in getattr(module, "FUSED_GROUPS", ()):
            layers = [getattr(module, name) for name in names]
            if all(isinstance(layer, nn.Linear) for layer in layers):
                module.fused[fused_key(names)] = FusedLayers(layers, kernel)
                for name in names:
                    delattr(module, name)
    for module in list(fast.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, QuantizedLayer(child.weight, child.bias, kernel))
    if isinstance(fast.lm_head, torch.Tensor):  # the target's LM-head slice (EAGLE-1, Medusa), not a layer
        fast.logits_layer = QuantizedLayer(fast.lm_head, None, kernel)
    return fast


def draft_kernel(head: nn.Module, folder: Path | None, progress: bool = True) -> str:
    """The faster drafting kernel for `head`'s weights on this machine, "int8" or "int4": every
    linear layer (and LM-head slice) once per round, at 1 and 4 rows, as a draft step reads them.
    Measured once per machine and shapes, cached in `folder`; None: int8, unmeasured."""
    weights = [m.weight.detach() for m in head.modules() if isinstance(m, nn.Linear)]
    if isinstance(getattr(head, "lm_head", None), torch.Tensor):
        weights.append(head.lm_head)
    if folder is None or not weights:
        return "int8"
    signature = {"draft head": "kernel", "shapes": [list(w.shape) for w in weights], "rows": TIMED_ROWS}

    def measure() -> str:
        layers = {kernel: [QuantizedLayer(w, None, kernel) for w in weights] for kernel in DRAFT_KERNELS}
        generator = torch.Generator().manual_seed(0)
        xs = {
            (w.shape[1], rows): torch.randn(rows, w.shape[1], generator=generator)
            for w in weights
            for rows in TIMED_ROWS
        }

        def run(kernel: str) -> None:
            for rows in TIMED_ROWS:
                for layer, w in zip(layers[kernel], weights):
                    layer(xs[(w.shape[1], rows)])

        costs: dict[str, list[float]] = {kernel: [] for kernel in DRAFT_KERNELS}
        with torch.inference_mode():
            for kernel in DRAFT_KERNELS:
                run(kernel)  # warm-up
            for _ in tqdm(
                range(4 * REPEATS),
                desc="quickdraft: timing draft-head kernels (once)",
                unit="round",
                disable=not progress,
                file=sys.stderr,
            ):
                for kernel in DRAFT_KERNELS:  # interleaved: drift hits both alike
                    costs[kernel].append(wall_ms(lambda: run(kernel)))
        return min(DRAFT_KERNELS, key=lambda kernel: statistics.median(costs[kernel]))

    return str(cached_choice(folder, signature, measure))
