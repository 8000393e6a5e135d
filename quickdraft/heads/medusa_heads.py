"""Medusa heads (Cai et al. 2024): head k reads the target's last hidden state at position t and
predicts the token at t + k + 2 (the target's own head predicts t + 1), through the target's LM head
sliced to the draft vocabulary (training/vocab.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ResidualBlock(nn.Module):
    """x + SiLU(W x + b); W starts at zero, so a fresh head starts as the target's own next-token head."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """`heads` residual blocks sharing the target's (frozen) LM head weight [V, H], sliced to `vocab`."""

    def __init__(self, lm_head: torch.Tensor, heads: int, vocab: torch.Tensor | None = None) -> None:
        super().__init__()
        vocab = torch.arange(lm_head.shape[0]) if vocab is None else vocab.long()
        self.blocks = nn.ModuleList(ResidualBlock(lm_head.shape[1]) for _ in range(heads))
        self.register_buffer("vocab", vocab, persistent=True)  # [V'] draft ids, saved with the heads
        self.register_buffer("lm_head", lm_head.detach().float()[vocab], persistent=False)  # [V', H]
        self.logits_layer: nn.Module | None = None  # set by heads.inference.for_drafting

    @property
    def heads(self) -> int:
        return len(self.blocks)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [heads, ..., V'] logits over the draft vocabulary."""
        states = torch.stack([block(hidden) for block in self.blocks])  # [heads, ..., H]
        return self.logits_layer(states) if self.logits_layer is not None else F.linear(states, self.lm_head)
