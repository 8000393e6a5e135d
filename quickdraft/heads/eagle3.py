"""The EAGLE-3 head (Li et al. 2025): one decoder layer fed the target's low, middle and high
layer features fused into one state, plus the embedding of the token that followed; its own
norm and LM head over a draft vocabulary. Fed its own (pre-norm) outputs, it runs ahead of the
target; training unrolls it that way ("training-time test", training/train_eagle3.py).

A head of more layers (Eagle3Config.layers) runs plain pre-norm decoder layers after the first,
as vLLM's EAGLE-3 model does: more of the target's work redone per guess, for a dearer draft.

Parameter names are the EAGLE-3 checkpoint's (fc, midlayer.*, norm, lm_head; later layers
layers.1.*, layers.2.*, the names vLLM gives them), the layout vLLM's and SGLang's EAGLE-3
loaders read (heads/export.py writes it).

Shapes: B sequences, T new positions, C cached positions, H hidden, F = 3 H fused features,
V' the draft vocabulary, D head dim.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from quickdraft.backends.kv_cache import KVCache
from quickdraft.heads.config import Eagle3Config
from quickdraft.heads.inference import outputs
from quickdraft.models.rotary import default_inv_freq, rotate


class Attention(nn.Module):
    FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"),)  # read one input: one product in a drafting copy

    def __init__(self, c: Eagle3Config, inputs: int = 2) -> None:
        """inputs: hidden-sized vectors read side by side (the first layer's [embedding, state]: 2)."""
        super().__init__()
        self.fused = nn.ModuleDict()  # drafting copies' fused layers (heads/inference.py); empty when training
        self.q_proj = nn.Linear(inputs * c.hidden, c.heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(inputs * c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(inputs * c.hidden, c.kv_heads * c.head_dim, bias=False)
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


class DecoderLayer(nn.Module):
    """A layer after the first: pre-norm attention and MLP over the previous layer's output."""

    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(c.hidden, eps=c.eps)
        self.self_attn = Attention(c, inputs=1)
        self.post_attention_layernorm = nn.RMSNorm(c.hidden, eps=c.eps)
        self.mlp = MLP(c)


# (layer index, the pass's keys [B, KV, T, D], values) -> (keys, values [B, KV, S, D], mask [B, T, S])
# that layer's queries attend over: a cache's, or training's unrolled steps side by side.
Context = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


class Eagle3Head(nn.Module):
    """fc(low, mid, high features) -> state g; [norm(embed(x_{t+1})), norm(g)] -> attention, + g ->
    MLP (pre-norm, residual) -> h; each later layer adds its pre-norm attention and MLP to h; h is
    fed back as the next state; norm(h) -> LM head -> V' logits."""

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
        self.layers = nn.ModuleDict({str(i): DecoderLayer(c) for i in range(1, c.layers)})  # empty: one layer
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
        """A sequence's cache of the head's layers (batch 1), up to `max_length` positions."""
        c = self.config
        return KVCache(c.layers, c.kv_heads, c.head_dim, max_length, dtype=self.embed.dtype, device=self.embed.device)

    def state(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., F] target features -> fused state [..., H]; a state [..., H] (fed back) as it is."""
        return self.fc(hidden) if hidden.shape[-1] != self.config.hidden else hidden

    def rotation(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [B, T] -> cos, sin [B, 1, T, D] of the rotary embedding."""
        angles = positions[..., None].float() * self.inv_freq  # [B, T, D/2]
        angles = torch.cat([angles, angles], dim=-1)[:, None]  # [B, 1, T, D]
        return angles.cos(), angles.sin()

    def attention_inputs(
        self, attention: Attention, x: torch.Tensor, rotation: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, in] -> rotated q [B, heads, T, D], k and v [B, KV, T, D]."""
        c = self.config
        b, t, _ = x.shape
        q, k, v = outputs(attention, Attention.FUSED_GROUPS[0], x)
        q = q.view(b, t, c.heads, c.head_dim).transpose(1, 2)  # [B, heads, T, D]
        k = k.view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)  # [B, KV, T, D]
        v = v.view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        return rotate(q, *rotation), rotate(k, *rotation), v

    def layer_out(
        self,
        layer: MidLayer | DecoderLayer,
        residual: torch.Tensor,
        q: torch.Tensor,
        attended: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """Attention of q over (keys, values [B, KV, S, D], mask [B, T, S], True: may attend), added
        to the residual [B, T, H], then the MLP's (pre-norm) -> [B, T, H]."""
        c = self.config
        b, _, t, _ = q.shape
        keys, values, mask = attended
        attn = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask[:, None], enable_gqa=c.heads != c.kv_heads
        )  # [B, heads, T, D]
        x = residual + layer.self_attn.o_proj(attn.transpose(1, 2).reshape(b, t, c.heads * c.head_dim))
        gate, up = outputs(layer.mlp, MLP.FUSED_GROUPS[0], layer.post_attention_layernorm(x))
        return x + layer.mlp.down_proj(F.silu(gate) * up)

    def run(self, state: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, context: Context) -> torch.Tensor:
        """state [B, T, H] (fused features or the head's own h), tokens [B, T] (x_{t+1}), positions
        [B, T] -> h [B, T, H] (pre-norm: what is fed back); each layer attends over what `context`
        makes of its keys and values."""
        rotation = self.rotation(positions)
        first = self.midlayer
        x = torch.cat([first.input_layernorm(self.embed[tokens]), first.hidden_norm(state)], dim=-1)  # [B, T, 2H]
        q, k, v = self.attention_inputs(first.self_attn, x, rotation)
        h = self.layer_out(first, state, q, context(0, k, v))
        for index, layer in enumerate(self.layers.values(), start=1):
            q, k, v = self.attention_inputs(layer.self_attn, layer.input_layernorm(h), rotation)
            h = self.layer_out(layer, h, q, context(index, k, v))
        return h

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
        end = tokens.shape[1] + (0 if cache is None else cache.length)
        if cache is not None:
            cache.reserve(end)

        def context(layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            if cache is None:
                return k, v, mask
            cache.write(layer, k[0], v[0])
            return (
                cache.keys[layer : layer + 1, :, :end],
                cache.values[layer : layer + 1, :, :end],
                mask,
            )  # [1, KV, C + T, D]

        return self.run(self.state(hidden), tokens, positions, context)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """[..., H] head outputs -> [..., V'] logits over the draft vocabulary."""
        return self.lm_head(self.norm(h))
