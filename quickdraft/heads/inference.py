"""Draft-time copies of trained heads: every linear layer, and the LM-head slice, as int8 weights
with bf16 activations (PyTorch's CPU kernel). A draft step has a handful of rows, so its cost is
reading weights: int8 reads a quarter of fp32's bytes. Rounding can only cost acceptance: the
target verifies every draft."""

from __future__ import annotations

import torch
from torch import nn

from quickdraft.models.quantized_linear import Int8Linear


class Int8Layer(nn.Module):
    """An nn.Linear stand-in over an int8 weight [out, in]: fp32 in, fp32 out, bf16 inside."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.inner = Int8Linear(weight.detach().float(), None if bias is None else bias.detach(), torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)  # [n, in]
        return self.inner(rows).float().reshape(*x.shape[:-1], -1)


def for_drafting(head: nn.Module) -> nn.Module:
    """`head` (MedusaHeads, EagleHead or Eagle3Head) with int8 linear layers and LM-head slice, changed in
    place (it can no longer be trained) and returned."""
    fast = head.eval()
    for module in list(fast.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, Int8Layer(child.weight, child.bias))
    if isinstance(fast.lm_head, torch.Tensor):  # the target's LM-head slice (EAGLE-1, Medusa), not a layer
        fast.logits_layer = Int8Layer(fast.lm_head)
    return fast
