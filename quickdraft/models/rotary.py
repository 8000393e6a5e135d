"""Rotary position embedding (RoPE), shared by the native backend and the EAGLE head."""

from __future__ import annotations

import torch


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin over [..., D], in Llama's half-split layout."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def default_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """[D / 2] frequencies theta^(-2i / D): the unscaled rotary schedule."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))


class RotaryTable:
    """cos and sin of position * frequency for every position used so far, grown by doubling up
    to the context length, so a pass looks its rows up instead of computing them."""

    def __init__(
        self, inv_freq: torch.Tensor, scale: float, max_length: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.inv_freq = inv_freq.float().to(device)  # [D / 2] (any HF rope scaling already applied)
        self.scale, self.max_length, self.dtype = scale, max_length, dtype
        self.cos = self.sin = torch.empty(0, 2 * inv_freq.shape[0], dtype=dtype, device=device)  # [P, D]

    def at(self, positions: torch.Tensor, needed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [n] (on the table's device), all below `needed` (known on the host, so no
        device read) -> cos, sin [n, D]."""
        if needed > self.cos.shape[0]:
            self._grow(needed)
        return self.cos[positions], self.sin[positions]

    def _grow(self, needed: int) -> None:
        size = min(max(needed, 2 * self.cos.shape[0], 256), max(self.max_length, needed))
        steps = torch.arange(size, dtype=torch.float32, device=self.inv_freq.device)
        angles = steps[:, None] * self.inv_freq[None]  # [P, D/2]
        angles = torch.cat([angles, angles], dim=-1)  # [P, D]
        self.cos = (angles.cos() * self.scale).to(self.dtype)
        self.sin = (angles.sin() * self.scale).to(self.dtype)
