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
from quickdraft.models.linear import ColumnLinear, PackedLinear, whole_column_blocks
from quickdraft.models.precision import Precision, get_precision
from quickdraft.models.quantize import Int4Weight, stack_int4
from quickdraft.models.quantized_linear import Int4Linear, Int8Linear, quantized_linear

Linear = PackedLinear | ColumnLinear | Int8Linear | Int4Linear

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2")


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    qkv: Linear  # [(heads + 2 * kv_heads) * head_dim, hidden]: q, k, v fused (+ Qwen2's biases)
    o: Linear  # [hidden, heads * head_dim]
    post_norm: torch.Tensor  # [hidden]
    gate_up: Linear  # [2 * intermediate, hidden]: gate and up projections fused
    down: Linear  # [hidden, intermediate]


@dataclass
class NativeWeights:
    """Everything a forward needs, extracted once from a transformers model; shared by runners."""

    embed: torch.Tensor  # [V, hidden]
    layers: list[LayerWeights]
    norm: torch.Tensor  # [hidden]
    lm_head: Linear  # [V, hidden]
    inv_freq: torch.Tensor  # [head_dim / 2] rotary frequencies (any HF rope scaling already applied)
    rope_scale: float  # HF's attention_scaling of cos and sin
    eps: float
    heads: int
    kv_heads: int
    head_dim: int
    max_length: int
    dtype: torch.dtype  # of activations, norms and the KV cache
    precision: str = "fp32"

    @classmethod
    def from_model(cls, model: PreTrainedModel, precision: str | Precision = "fp32", pack: bool = True,
                   int4_blocks: dict[str, Int4Weight] | None = None) -> NativeWeights:
        """`pack=False` keeps plain dense weights (F.linear), which torch.compile can trace.
        `int4_blocks`: a GGUF file's own 4-bit blocks by parameter name, used as they are."""
        config = model.config
        if not supports(model):
            raise QuickdraftError(f"the native runner supports {', '.join(SUPPORTED_ARCHITECTURES)}, "
                                  f"not {config.model_type!r}")
        precision = get_precision(precision) if isinstance(precision, str) else precision
        dtype = precision.dtype
        inner = model.model
        names = {id(module): name for name, module in model.named_modules()}
        blocks = int4_blocks if precision.weights == "int4" and int4_blocks else {}

        def cast(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.detach().to(dtype).contiguous()

        def dense(weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
            # bf16: row-invariant, so greedy speculation stays exact; fp32 differs only in rounding.
            return PackedLinear(weight, bias, pack) if dtype == torch.float32 else ColumnLinear(weight, bias)

        def linear(modules: list[torch.nn.Module], requantize_as: str = precision.weights) -> Linear:
            """One layer for the modules' weights fused along outputs (and their biases, if all have
            one). Quantized: the file's 4-bit blocks when it has them, else `requantize_as`."""
            weight = torch.cat([m.weight.detach() for m in modules]) if len(modules) > 1 else modules[0].weight.detach()
            biases = [m.bias for m in modules]
            bias = cast(torch.cat(biases)) if all(b is not None for b in biases) else None
            if precision.weights == "dense":
                return dense(cast(weight), bias)
            found = [blocks.get(f"{names[id(m)]}.weight") for m in modules]
            if all(b is not None for b in found):
                return quantized_linear(weight, bias, "int4", dtype, stack_int4(found))
            return quantized_linear(weight.float(), bias, requantize_as, dtype)

        layers = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            layers.append(LayerWeights(
                input_norm=cast(layer.input_layernorm.weight),
                qkv=linear([attn.q_proj, attn.k_proj, attn.v_proj]),
                o=linear([attn.o_proj]),
                post_norm=cast(layer.post_attention_layernorm.weight),
                gate_up=linear([mlp.gate_proj, mlp.up_proj]),
                down=linear([mlp.down_proj]),
            ))
        rotary = inner.rotary_emb
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        max_length = int(config.max_position_embeddings)
        window = getattr(config, "sliding_window", None)
        if window and getattr(config, "use_sliding_window", True):
            max_length = min(max_length, int(window))  # beyond the window the model attends differently
        embed = cast(inner.embed_tokens.weight)
        head = model.get_output_embeddings()
        tied = head.weight is inner.embed_tokens.weight and precision.weights == "dense"
        # The head's error goes straight into the logits: rounding it to 4 bits from scratch raised
        # the default target's KL from fp32 from 0.004 (int8 head) to 0.066, so it gets int8.
        lm_head = dense(embed, None) if tied else linear([head], requantize_as="int8")
        return cls(embed, layers, cast(inner.norm.weight), lm_head, rotary.inv_freq.detach().float(),
                   float(getattr(rotary, "attention_scaling", 1.0)), float(config.rms_norm_eps),
                   config.num_attention_heads, config.num_key_value_heads, head_dim, max_length, dtype,
                   precision.name)


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
        self._keys: torch.Tensor | None = None  # [layers, kv_heads, capacity, head_dim] (fp32)
        self._values: torch.Tensor | None = None  # the same (+ a ones column below fp32)
        self._cos: torch.Tensor | None = None  # [capacity, head_dim]
        self._sin: torch.Tensor | None = None
        self.hidden: torch.Tensor | None = None  # [n, hidden] after the final norm, of the last pass

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
        new_capacity = min(self.max_length, max(attention_bucket(needed, self.max_length), 2 * capacity))
        w = self.weights
        shape = (len(self.layer_ids), w.kv_heads, new_capacity, w.head_dim)
        if w.dtype == torch.float32:
            keys, values = torch.empty(shape), torch.empty(shape)
        else:
            # fp32 even for bf16 activations (the matmuls below are fp32). Zeros: attention reads
            # whole buckets with unwritten entries masked, and 0 weight times a NaN is still NaN.
            # Each value is followed by a 1: the softmax sum's column.
            keys = torch.zeros(shape)
            values = torch.ones(shape[:-1] + (w.head_dim + 1,))
            values[..., : w.head_dim] = 0
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

    def _prepare(self, segment: Segment) -> tuple[torch.Tensor, torch.Tensor, Attention]:
        """Cache room, then rotary rows [n, D] x2 and what attention needs (see Attention)."""
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
        if self.weights.dtype == torch.float32:
            attention = Attention(None if mask is None else mask[None, None], [])
        else:
            attention = Attention(None, row_groups(start, n, mask, self.max_length))
        return self._cos[position_ids], self._sin[position_ids], attention

    def _attend(self, slot: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                attention: Attention) -> torch.Tensor:
        """Write k, v [KV, n, D] at the cache's end, attend with q [H, n, D] -> [n, H * D]."""
        w, n, start = self.weights, q.shape[1], self._length
        self._keys[slot, :, start : start + n] = k
        self._values[slot, :, start : start + n, : w.head_dim] = v
        if not attention.groups:
            keys = self._keys[slot, :, : start + n]  # [KV, start + n, D]
            values = self._values[slot, :, : start + n]
            attn = F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=attention.mask,
                                                  enable_gqa=w.heads != w.kv_heads)[0]  # [H, n, D]
        else:
            parts = [row_invariant_attention(q[:, g.rows], *self._group_keys(slot, g), g.hidden)
                     for g in attention.groups]
            attn = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
        return attn.transpose(0, 1).reshape(n, w.heads * w.head_dim)

    def _group_keys(self, slot: int, group: RowGroup) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values [KV, length, D (+1)] a row group reads."""
        if group.index is None:
            return self._keys[slot, :, : group.length], self._values[slot, :, : group.length]
        return self._keys[slot][:, group.index], self._values[slot][:, group.index]

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
class RowGroup:
    """Rows of a pass that attend over the same bucket of keys."""

    rows: slice
    length: int  # keys read: a bucket length, the one a one-token pass at these rows' positions reads
    hidden: torch.Tensor  # [length, 1, rows] bool: True where a row may not see a key (attention's layout)
    index: torch.Tensor | None = None  # [length] cache slots to read, in order (None: slots 0..length-1)


@dataclass
class Attention:
    """What one sequence's attention needs in a pass: fp32 runners use SDPA with `mask`
    [1, 1, n, keys] (None: all visible); low-precision runners use row-invariant `groups`."""

    mask: torch.Tensor | None
    groups: list[RowGroup]


KEY_BUCKET = 256  # keys are read in whole buckets of this many


def attention_bucket(needed: int, max_length: int) -> int:
    """Keys a low-precision pass reads for a row that needs `needed`: whole buckets of 256 (at
    most the context), so a token reads the same keys whichever pass computes it."""
    return min(max_length, -(-needed // KEY_BUCKET) * KEY_BUCKET)


def row_groups(start: int, n: int, mask: torch.Tensor | None, max_length: int) -> list[RowGroup]:
    """Split a pass's rows (cache indices start..start+n-1) by the bucket each row's own
    one-token pass would read; usually one group. mask [n, start + n] or None (all visible).

    A row that sees a contiguous prefix of the cache (chains) reads the cache as it is. A tree
    node sees the prefix and its ancestors, which sit after their siblings: it gets a group of
    its own that reads exactly those keys, in order, from the start (then its bucket's masked
    padding), the layout a one-token pass gives the same token once its path is kept, so the
    matmuls sum the same terms in the same blocks over the same number of keys."""
    groups, first = [], 0
    seen = [None if mask is None else mask[i].nonzero()[:, 0] for i in range(n)]  # visible slots per row
    contiguous = [s is None or (len(s) == start + i + 1 and int(s[-1]) == start + i) for i, s in enumerate(seen)]
    buckets = [attention_bucket(start + i + 1, max_length) for i in range(n)]
    for i in range(1, n + 1):
        if i == n or buckets[i] != buckets[first] or not contiguous[i] or not contiguous[first]:
            if not contiguous[first]:  # one tree row: its own keys, gathered in order
                visible = seen[first]
                length = attention_bucket(len(visible), max_length)
                index = torch.cat([visible, visible.new_zeros(length - len(visible))])  # padding: masked
                hidden = torch.arange(length) >= len(visible)
                groups.append(RowGroup(slice(first, i), length, hidden[:, None, None], index))
            else:
                length = buckets[first]
                visible = torch.zeros(i - first, length, dtype=torch.bool)
                if mask is None:
                    visible[:, : start + n] = True
                else:
                    cut = min(length, start + n)
                    visible[:, :cut] = mask[first:i, :cut]
                groups.append(RowGroup(slice(first, i), length, ~visible.T[:, None, :]))
            first = i
    return groups


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
    prepared = [s.runner._prepare(s) for s in segments]  # (cos, sin, attention) each
    sizes = [len(s.tokens) for s in segments]
    q_size, kv_size = w.heads * w.head_dim, w.kv_heads * w.head_dim
    x = w.embed[torch.tensor([t for s in segments for t in s.tokens], dtype=torch.long)]  # [N, hidden]
    for slot, layer_id in enumerate(layer_ids):
        layer = w.layers[layer_id]
        qkv = layer.qkv(rms_norm(x, layer.input_norm, w.eps))  # [N, (H + 2 KV) D]
        outputs = []
        for segment, (cos, sin, attention), rows in zip(segments, prepared, qkv.split(sizes)):
            n = rows.shape[0]
            # q and k rotate together: one set of operations for both.
            qk = rotate(rows[:, : q_size + kv_size].view(n, w.heads + w.kv_heads, w.head_dim).transpose(0, 1),
                        cos, sin)  # [H + KV, n, D]
            v = rows[:, q_size + kv_size :].view(n, w.kv_heads, w.head_dim).transpose(0, 1)  # [KV, n, D]
            outputs.append(segment.runner._attend(slot, qk[: w.heads], qk[w.heads :], v, attention))
        x = x + layer.o(torch.cat(outputs) if len(outputs) > 1 else outputs[0])
        gate, up = layer.gate_up(rms_norm(x, layer.post_norm, w.eps)).chunk(2, dim=-1)  # [N, I] each
        x = x + layer.down(F.silu(gate) * up)
    rows = []
    for segment, part in zip(segments, x.split(sizes)):
        segment.runner._length += len(segment.tokens)
        segment.runner.hidden = rms_norm(part, w.norm, w.eps)  # [n_i, hidden], for drafters that read it
        rows.append(segment.runner.hidden if segment.all_logits else segment.runner.hidden[-1:])
    logits = w.lm_head(torch.cat(rows)).float()  # [rows, V]
    return list(logits.split([r.shape[0] for r in rows]))


def row_invariant_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                            hidden: torch.Tensor) -> torch.Tensor:
    """Softmax attention that gives each query row the bits it gets in a one-token pass, so a
    low-precision verify pass agrees exactly with plain decoding.

    q [H, n, D], keys [KV, L, D] and values [KV, L, D + 1] (fp32; the last column is 1),
    hidden [L, 1, n] (True: masked) -> [H, n, D] in q's dtype. Why not SDPA: its CPU kernel
    blocks its sums by the pass's shape, so a token's bf16 output changed with the tokens
    beside it (62 of 820 rows differed even over equal key counts). Here both matmuls put the keys on the rows and
    the queries on the columns, with L fixed (the row's bucket) and the columns padded to whole
    blocks of 16: measured on this CPU, a column's result then does not depend on how many
    columns there are (a single column, or a part-filled block, can take another kernel).
    Masked keys weigh exactly 0 and the softmax sum comes out of the second matmul's ones column.
    """
    heads, n, dim = q.shape
    kv_heads, length, _ = keys.shape
    group = heads // kv_heads  # query heads per KV head, consecutive as in transformers
    cols = group * n
    padded = whole_column_blocks(cols)  # every column takes the main kernel, as in ColumnLinear
    columns = F.pad(q.float().reshape(kv_heads, cols, dim).transpose(1, 2), (0, padded - cols))  # [KV, D, pad]
    scores = torch.matmul(keys, columns)[..., :cols].view(kv_heads, length, group, n)  # [KV, L, G, n]
    scores = scores.mul_(dim ** -0.5).masked_fill_(hidden, float("-inf"))
    weights = torch.exp(scores - scores.amax(dim=1, keepdim=True)).view(kv_heads, length, cols)
    weights = F.pad(weights, (0, padded - cols))  # [KV, L, pad]
    summed = torch.matmul(values.transpose(1, 2), weights)[..., :cols]  # [KV, D + 1, G n]: sums last
    out = (summed[:, :dim] / summed[:, dim:]).view(kv_heads, dim, group, n)
    return out.permute(0, 2, 3, 1).reshape(heads, n, dim).to(q.dtype)


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
