"""A lean runner for Llama-family models (Llama, SmolLM, Mistral, Qwen2) in plain PyTorch.

Why: a transformers forward spends much of a small model's decode step in Python and
bookkeeping. Here each layer is a handful of fused operations over weights taken once from
the loaded model, and the KV cache is preallocated and indexed by a length pointer, so a
rollback is free and a token tree needs only an explicit mask and positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from quickdraft.errors import QuickdraftError
from quickdraft.models.linear import PackedLinear

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2")


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    qkv: PackedLinear  # [(heads + 2 * kv_heads) * head_dim, hidden]: q, k, v fused (+ Qwen2's biases)
    o: PackedLinear  # [hidden, heads * head_dim]
    post_norm: torch.Tensor  # [hidden]
    gate_up: PackedLinear  # [2 * intermediate, hidden]: gate and up projections fused
    down: PackedLinear  # [hidden, intermediate]


@dataclass
class NativeWeights:
    """Everything a forward needs, extracted once from a transformers model; shared by runners."""

    embed: torch.Tensor  # [V, hidden]
    layers: list[LayerWeights]
    norm: torch.Tensor  # [hidden]
    lm_head: PackedLinear  # [V, hidden]
    inv_freq: torch.Tensor  # [head_dim / 2] rotary frequencies (any HF rope scaling already applied)
    rope_scale: float  # HF's attention_scaling of cos and sin
    eps: float
    heads: int
    kv_heads: int
    head_dim: int
    max_length: int
    dtype: torch.dtype

    @classmethod
    def from_model(cls, model: PreTrainedModel, dtype: torch.dtype | None = None,
                   pack: bool = True) -> NativeWeights:
        """`pack=False` keeps plain weights (F.linear), which torch.compile can trace."""
        config = model.config
        if not supports(model):
            raise QuickdraftError(f"the native runner supports {', '.join(SUPPORTED_ARCHITECTURES)}, "
                                  f"not {config.model_type!r}")
        dtype = dtype or model.dtype
        inner = model.model

        def cast(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.detach().to(dtype).contiguous()

        def linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> PackedLinear:
            return PackedLinear(weight, bias, pack)

        layers = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            biases = [attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]
            layers.append(LayerWeights(
                input_norm=cast(layer.input_layernorm.weight),
                qkv=linear(cast(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])),
                           cast(torch.cat(biases)) if all(b is not None for b in biases) else None),
                o=linear(cast(attn.o_proj.weight)),
                post_norm=cast(layer.post_attention_layernorm.weight),
                gate_up=linear(cast(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))),
                down=linear(cast(mlp.down_proj.weight)),
            ))
        rotary = inner.rotary_emb
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        max_length = int(config.max_position_embeddings)
        window = getattr(config, "sliding_window", None)
        if window and getattr(config, "use_sliding_window", True):
            max_length = min(max_length, int(window))  # beyond the window the model attends differently
        embed = cast(inner.embed_tokens.weight)
        head = model.get_output_embeddings().weight
        lm_head = linear(embed if head is inner.embed_tokens.weight else cast(head))  # tied: shared
        return cls(embed, layers, cast(inner.norm.weight), lm_head, rotary.inv_freq.detach().float(),
                   float(getattr(rotary, "attention_scaling", 1.0)), float(config.rms_norm_eps),
                   config.num_attention_heads, config.num_key_value_heads, head_dim, max_length, dtype)


def supports(model: PreTrainedModel) -> bool:
    """True for the architectures the native runner computes exactly like transformers."""
    config = model.config
    return (
        getattr(config, "model_type", None) in SUPPORTED_ARCHITECTURES
        and getattr(config, "hidden_act", "silu") == "silu"
        and not getattr(config, "mlp_bias", False)
        and hasattr(getattr(model, "model", None), "layers")
    )


class NativeRunner:
    """One sequence's preallocated KV cache over shared NativeWeights; optionally a layer subset."""

    def __init__(self, weights: NativeWeights, layers: list[int] | None = None) -> None:
        self.weights = weights
        self.layer_ids = list(range(len(weights.layers))) if layers is None else list(layers)
        self._length = 0
        self._keys: torch.Tensor | None = None  # [layers, kv_heads, capacity, head_dim]
        self._values: torch.Tensor | None = None
        self._cos: torch.Tensor | None = None  # [capacity, head_dim]
        self._sin: torch.Tensor | None = None

    @property
    def vocab_size(self) -> int:
        return self.weights.lm_head.out_features

    @property
    def max_length(self) -> int:
        return self.weights.max_length

    @property
    def length(self) -> int:
        return self._length

    def reset(self) -> None:
        self._length = 0  # the buffers are reused: only the pointer moves

    def _ensure_capacity(self, needed: int) -> None:
        """Grow the cache (doubling, up to the context length) so `needed` entries fit."""
        capacity = 0 if self._keys is None else self._keys.shape[2]
        if needed <= capacity:
            return
        new_capacity = min(self.max_length, max(needed, 2 * capacity, 256))
        w = self.weights
        shape = (len(self.layer_ids), w.kv_heads, new_capacity, w.head_dim)
        keys, values = torch.empty(shape, dtype=w.dtype), torch.empty(shape, dtype=w.dtype)
        if self._keys is not None:
            keys[:, :, : self._length] = self._keys[:, :, : self._length]
            values[:, :, : self._length] = self._values[:, :, : self._length]
        self._keys, self._values = keys, values
        # Rotary tables for every position the cache can hold: cos/sin of position * frequency.
        angles = torch.arange(new_capacity, dtype=torch.float32)[:, None] * w.inv_freq[None]  # [cap, D/2]
        angles = torch.cat([angles, angles], dim=-1)  # [cap, D]
        self._cos = (angles.cos() * w.rope_scale).to(w.dtype)
        self._sin = (angles.sin() * w.rope_scale).to(w.dtype)

    def forward(
        self,
        tokens: list[int],
        all_logits: bool = True,
        positions: list[int] | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return forward_batch([Segment(self, tokens, all_logits, positions, mask)])[0]

    def _prepare(self, segment: Segment) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Cache room, then rotary rows [n, D] x2 and the attention mask [1, 1, n, start + n] (or None)."""
        n, start = len(segment.tokens), self._length
        if start + n > self.max_length:
            raise ValueError(f"cache would exceed the context length {self.max_length}")
        positions = segment.positions
        self._ensure_capacity(max(start + n, max(positions or [0]) + 1))
        position_ids = (torch.arange(start, start + n) if positions is None
                        else torch.tensor(positions, dtype=torch.long))  # [n]
        mask = segment.mask
        if mask is None and n > 1:
            # Causal: token i sees the cache and the new tokens up to itself.
            mask = torch.ones(n, start + n, dtype=torch.bool).tril(diagonal=start)
        return self._cos[position_ids], self._sin[position_ids], None if mask is None else mask[None, None]

    def _attend(self, slot: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        """Write k, v [KV, n, D] at the cache's end, attend with q [H, n, D] -> [n, H * D]."""
        w, n, start = self.weights, q.shape[1], self._length
        self._keys[slot, :, start : start + n] = k
        self._values[slot, :, start : start + n] = v
        keys = self._keys[slot, :, : start + n]  # [KV, start + n, D]
        values = self._values[slot, :, : start + n]
        attn = F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask,
                                              enable_gqa=w.heads != w.kv_heads)  # [1, H, n, D]
        return attn[0].transpose(0, 1).reshape(n, w.heads * w.head_dim)

    def truncate(self, length: int) -> None:
        self._length = min(self._length, length)  # rollback is a pointer move

    @torch.inference_mode()  # the buffers are inference tensors
    def keep(self, indices: list[int]) -> None:
        if indices == list(range(len(indices))):
            self.truncate(len(indices))
            return
        index = torch.tensor(indices, dtype=torch.long)
        kept = len(indices)
        self._keys[:, :, :kept] = self._keys[:, :, index]  # gather first, then write: no aliasing
        self._values[:, :, :kept] = self._values[:, :, index]
        self._length = kept


@dataclass
class Segment:
    """One sequence's share of a batched pass: its runner (cache) and what it feeds."""

    runner: NativeRunner
    tokens: list[int]
    all_logits: bool = True  # False: logits of the last token only
    positions: list[int] | None = None  # None: consecutive after the cache
    mask: torch.Tensor | None = None  # [n, cached + n]; None: causal


@torch.inference_mode()
def forward_batch(segments: list[Segment]) -> list[torch.Tensor]:
    """One pass for several sequences over the same weights: their tokens stacked as rows, so
    every weight is read once for all of them; attention runs per sequence over its own cache.
    Ragged by design: each segment has its own length, positions and mask; nothing is padded.
    Returns each segment's logits [n_i, V] (or [1, V])."""
    w = segments[0].runner.weights
    layer_ids = segments[0].runner.layer_ids
    if any(s.runner.weights is not w or s.runner.layer_ids != layer_ids for s in segments):
        raise ValueError("a batched pass needs runners over the same weights and layers")
    if len({id(s.runner) for s in segments}) != len(segments):
        raise ValueError("each sequence may appear once in a batched pass")
    prepared = [s.runner._prepare(s) for s in segments]  # (cos, sin, mask) each
    sizes = [len(s.tokens) for s in segments]
    q_size, kv_size = w.heads * w.head_dim, w.kv_heads * w.head_dim
    x = w.embed[torch.tensor([t for s in segments for t in s.tokens], dtype=torch.long)]  # [N, hidden]
    for slot, layer_id in enumerate(layer_ids):
        layer = w.layers[layer_id]
        qkv = layer.qkv(rms_norm(x, layer.input_norm, w.eps))  # [N, (H + 2 KV) D]
        outputs = []
        for segment, (cos, sin, mask), rows in zip(segments, prepared, qkv.split(sizes)):
            n = rows.shape[0]
            q = rows[:, :q_size].view(n, w.heads, w.head_dim).transpose(0, 1)  # [H, n, D]
            k = rows[:, q_size : q_size + kv_size].view(n, w.kv_heads, w.head_dim).transpose(0, 1)  # [KV, n, D]
            v = rows[:, q_size + kv_size :].view(n, w.kv_heads, w.head_dim).transpose(0, 1)  # [KV, n, D]
            outputs.append(segment.runner._attend(slot, rotate(q, cos, sin), rotate(k, cos, sin), v, mask))
        x = x + layer.o(torch.cat(outputs) if len(outputs) > 1 else outputs[0])
        gate, up = layer.gate_up(rms_norm(x, layer.post_norm, w.eps)).chunk(2, dim=-1)  # [N, I] each
        x = x + layer.down(F.silu(gate) * up)
    rows = []
    for segment, part in zip(segments, x.split(sizes)):
        segment.runner._length += len(segment.tokens)
        rows.append(part if segment.all_logits else part[-1:])
    logits = w.lm_head(rms_norm(torch.cat(rows), w.norm, w.eps)).float()  # [rows, V]
    return list(logits.split([r.shape[0] for r in rows]))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) * weight, computed in fp32 as transformers does."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding: x * cos + rotate_half(x) * sin over [heads, n, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
