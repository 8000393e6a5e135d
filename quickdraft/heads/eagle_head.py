"""The EAGLE head (Li et al. 2024): one decoder layer that reads the target's last hidden state
f_t together with the embedding of the token x_{t+1} that followed it, and predicts f_{t+1}.
Fed its own predictions, it runs ahead of the target; the target's LM head (sliced to the draft
vocabulary) turns each predicted state into draft tokens.

Shapes: B sequences, T new positions, C cached positions, H hidden, D head dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from quickdraft.backends.kv_cache import KVCache
from quickdraft.heads.config import EagleConfig
from quickdraft.heads.inference import outputs
from quickdraft.models.rotary import default_inv_freq, rotate


class EagleHead(nn.Module):
    """fc(concat(embed(x_{t+1}), f_t)) -> a pre-norm decoder layer -> predicted f_{t+1}."""

    FUSED_GROUPS = (("q", "k", "v"), ("gate", "up"))  # read one input: one product in a drafting copy

    def __init__(self, config: EagleConfig, embed: torch.Tensor, lm_head: torch.Tensor, vocab: torch.Tensor) -> None:
        super().__init__()
        c = self.config = config
        h, d = c.hidden, c.head_dim
        self.fc = nn.Linear(2 * h, h)
        self.input_norm = nn.RMSNorm(h, eps=c.eps)
        self.q = nn.Linear(h, c.heads * d, bias=False)
        self.k = nn.Linear(h, c.kv_heads * d, bias=False)
        self.v = nn.Linear(h, c.kv_heads * d, bias=False)
        self.o = nn.Linear(c.heads * d, h, bias=False)
        self.post_norm = nn.RMSNorm(h, eps=c.eps)
        self.gate = nn.Linear(h, c.intermediate, bias=False)
        self.up = nn.Linear(h, c.intermediate, bias=False)
        self.down = nn.Linear(c.intermediate, h, bias=False)
        self.register_buffer("vocab", vocab.long(), persistent=True)  # [V'] draft ids, saved with the head
        # The target's tables, frozen and not saved (they come from the target at load time).
        self.register_buffer("embed", embed.detach().float(), persistent=False)  # [V, H]
        self.register_buffer("lm_head", lm_head.detach().float()[vocab], persistent=False)  # [V', H]
        self.register_buffer("inv_freq", default_inv_freq(d, c.rope_theta), persistent=False)  # [D/2]
        self.logits_layer: nn.Module | None = None  # set by heads.inference.for_drafting
        self.fused = nn.ModuleDict()  # drafting copies' fused layers (heads/inference.py); empty when training

    def new_cache(self, max_length: int) -> KVCache:
        """A sequence's cache of the head's one layer (batch 1), up to `max_length` positions."""
        c = self.config
        return KVCache(1, c.kv_heads, c.head_dim, max_length, dtype=self.embed.dtype, device=self.embed.device)

    def forward(
        self,
        hidden: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """hidden [B, T, H] (f_t), tokens [B, T] (x_{t+1}), positions [B, T] (t), mask [B, T, C + T] bool
        (True: may attend) -> predicted f_{t+1} [B, T, H]. cache: one sequence's cache (B = 1) of C
        entries; this pass's keys and values are written after them, and the caller advances or
        truncates the cache. None: the T positions attend among themselves only (training)."""
        c = self.config
        b, t, _ = hidden.shape
        x = self.fc(torch.cat([self.embed[tokens], hidden], dim=-1))  # [B, T, H]
        normed = self.input_norm(x)
        q, k, v = outputs(self, self.FUSED_GROUPS[0], normed)
        q = q.view(b, t, c.heads, c.head_dim).transpose(1, 2)  # [B, heads, T, D]
        k = k.view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)  # [B, KV, T, D]
        v = v.view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        cos, sin = self._rotary(positions)  # [B, 1, T, D]
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if cache is None:
            keys, values = k, v
        else:
            end = cache.length + t
            cache.reserve(end)
            cache.write(0, k[0], v[0])
            keys, values = cache.keys[:1, :, :end], cache.values[:1, :, :end]  # [1, KV, C + T, D]
        attn = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask[:, None], enable_gqa=c.heads != c.kv_heads
        )  # [B, heads, T, D]
        x = x + self.o(attn.transpose(1, 2).reshape(b, t, c.heads * c.head_dim))
        normed = self.post_norm(x)
        gate, up = outputs(self, self.FUSED_GROUPS[1], normed)
        x = x + self.down(F.silu(gate) * up)
        return x

    def logits(self, predicted: torch.Tensor) -> torch.Tensor:
        """[..., H] predicted states -> [..., V'] logits over the draft vocabulary."""
        return self.logits_layer(predicted) if self.logits_layer is not None else predicted @ self.lm_head.T

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions[..., None].float() * self.inv_freq  # [B, T, D/2]
        angles = torch.cat([angles, angles], dim=-1)[:, None]  # [B, 1, T, D]
        return angles.cos(), angles.sin()
