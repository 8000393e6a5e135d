"""The EAGLE-3 head (Li et al. 2025): one decoder layer fed the target's low, middle and high
layer features fused into one state, plus the embedding of the token that followed; its own
norm and LM head over a draft vocabulary. Fed its own (pre-norm) outputs, it runs ahead of the
target; training unrolls it that way ("training-time test", training/train_eagle3.py).

Parameter names are the EAGLE-3 checkpoint's (fc, midlayer.*, norm, lm_head), the layout vLLM's
and SGLang's EAGLE-3 loaders read (heads/export.py writes it).

Shapes: B sequences, T new positions, C cached positions, H hidden, F = 3 H fused features,
V' the draft vocabulary, D head dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from quickdraft.backends.kv_cache import KVCache
from quickdraft.heads.config import Eagle3Config
from quickdraft.heads.inference import outputs
from quickdraft.models.rotary import default_inv_freq, rotate


class Attention(nn.Module):
    FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"),)  # read one input: one product in a drafting copy

    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.fused = nn.ModuleDict()  # drafting copies' fused layers (heads/inference.py); empty when training
        self.q_proj = nn.Linear(2 * c.hidden, c.heads * c.head_dim, bias=False)  # reads [embedding, state]
        self.k_proj = nn.Linear(2 * c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.heads * c.head_dim, c.hidden, bias=False)


class MLP(nn.Module):
    FUSED_GROUPS = (("gate_proj", "up_proj"),)

    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.fused = nn.ModuleDict()
        self.gate_proj = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.up_proj = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.down_proj = nn.Linear(c.intermediate, c.hidden, bias=False)


class MidLayer(nn.Module):
    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(c.hidden, eps=c.eps)  # on the token embedding
        self.hidden_norm = nn.RMSNorm(c.hidden, eps=c.eps)  # on the fused (or fed-back) state
        self.self_attn = Attention(c)
        self.post_attention_layernorm = nn.RMSNorm(c.hidden, eps=c.eps)
        self.mlp = MLP(c)


class Eagle3Head(nn.Module):
    """fc(low, mid, high features) -> state g; [norm(embed(x_{t+1})), norm(g)] -> attention, + g ->
    MLP (pre-norm, residual) -> h (fed back as the next state); norm(h) -> LM head -> V' logits."""

    def __init__(
        self,
        config: Eagle3Config,
        embed: torch.Tensor,
        vocab: torch.Tensor,
        lm_head: torch.Tensor | None = None,
        norm: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        c = self.config = config
        self.fc = nn.Linear(len(c.features) * c.hidden, c.hidden, bias=False)
        self.midlayer = MidLayer(c)
        self.norm = nn.RMSNorm(c.hidden, eps=c.eps)
        self.lm_head = nn.Linear(c.hidden, len(vocab), bias=False)
        with torch.no_grad():  # start from the target's own LM head rows and final norm
            if lm_head is not None:
                self.lm_head.weight.copy_(lm_head.detach().float()[vocab])
            if norm is not None:
                self.norm.weight.copy_(norm.detach().float())
        self.register_buffer("vocab", vocab.long(), persistent=True)  # [V'] target ids, saved with the head
        self.register_buffer("embed", embed.detach().float(), persistent=False)  # [V, H], the target's
        self.register_buffer("inv_freq", default_inv_freq(c.head_dim, c.rope_theta), persistent=False)  # [D/2]

    def new_cache(self, max_length: int) -> KVCache:
        """A sequence's cache of the head's one layer (batch 1), up to `max_length` positions."""
        c = self.config
        return KVCache(1, c.kv_heads, c.head_dim, max_length, dtype=self.embed.dtype, device=self.embed.device)

    def state(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., F] target features -> fused state [..., H]; a state [..., H] (fed back) as it is."""
        return self.fc(hidden) if hidden.shape[-1] != self.config.hidden else hidden

    def project(
        self, state: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """state [B, T, H], tokens [B, T] (x_{t+1}), positions [B, T] -> rotated q [B, heads, T, D],
        k and v [B, KV, T, D]."""
        c, layer = self.config, self.midlayer
        b, t, _ = state.shape
        x = torch.cat([layer.input_layernorm(self.embed[tokens]), layer.hidden_norm(state)], dim=-1)  # [B, T, 2H]
        q, k, v = outputs(layer.self_attn, Attention.FUSED_GROUPS[0], x)
        q = q.view(b, t, c.heads, c.head_dim).transpose(1, 2)  # [B, heads, T, D]
        k = k.view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)  # [B, KV, T, D]
        v = v.view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        angles = positions[..., None].float() * self.inv_freq  # [B, T, D/2]
        angles = torch.cat([angles, angles], dim=-1)[:, None]  # [B, 1, T, D]
        cos, sin = angles.cos(), angles.sin()
        return rotate(q, cos, sin), rotate(k, cos, sin), v

    def finish(
        self, state: torch.Tensor, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """Attention of q over keys/values [B, KV, S, D] (mask [B, T, S], True: may attend), the
        residual on the state, the MLP -> h [B, T, H] (pre-norm: what is fed back)."""
        c, layer = self.config, self.midlayer
        b, _, t, _ = q.shape
        attn = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask[:, None], enable_gqa=c.heads != c.kv_heads
        )  # [B, heads, T, D]
        x = state + layer.self_attn.o_proj(attn.transpose(1, 2).reshape(b, t, c.heads * c.head_dim))
        normed = layer.post_attention_layernorm(x)
        gate, up = outputs(layer.mlp, MLP.FUSED_GROUPS[0], normed)
        return x + layer.mlp.down_proj(F.silu(gate) * up)

    def forward(
        self,
        hidden: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """hidden [B, T, F] (target features) or [B, T, H] (the head's own h), tokens [B, T] (x_{t+1}),
        positions [B, T], mask [B, T, C + T] -> h [B, T, H]. cache: one sequence's cache (B = 1) of C
        entries; this pass's keys and values are written after them, and the caller advances or
        truncates it. None: the T positions attend among themselves only."""
        state = self.state(hidden)
        q, k, v = self.project(state, tokens, positions)
        if cache is None:
            keys, values = k, v
        else:
            end = cache.length + q.shape[2]
            cache.reserve(end)
            cache.write(0, k[0], v[0])
            keys, values = cache.keys[:1, :, :end], cache.values[:1, :, :end]  # [1, KV, C + T, D]
        return self.finish(state, q, keys, values, mask)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """[..., H] head outputs -> [..., V'] logits over the draft vocabulary."""
        return self.lm_head(self.norm(h))
