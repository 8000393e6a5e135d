"""The native backend: Llama-family models on quickdraft's own PyTorch forward.

One pass serves several sequences: their new tokens are stacked as rows, so every weight is
read once for all of them, and attention runs per sequence over that sequence's own KVCache.
Ragged by design: each sequence has its own length, positions and mask; nothing is padded
(except rows a measured Kernel pads inside a linear layer, which change no real row).
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerBase

from quickdraft.backends.backend import (
    PassCostsOnFirstRead,
    PassOutput,
    SeqPass,
    check_passes,
    logit_rows,
    tapped_layers,
)
from quickdraft.backends.kv_cache import KVCache
from quickdraft.models.linear import Kernel, RowLinear, apply_linear
from quickdraft.models.native_weights import Attention, NativeWeights, rms_norm
from quickdraft.models.rotary import RotaryTable, rotate
from quickdraft.models.row_attention import KEY_CHUNK, group_keys, row_groups, row_invariant_attention

RowKernels = dict[int, Kernel]  # rows in a pass -> how its linear layers compute them (absent: packed, unpadded)


class NativeBackend:
    """Shared NativeWeights (optionally only some layers: self-speculation) run for many caches."""

    pass_ms = PassCostsOnFirstRead()

    def __init__(
        self,
        weights: NativeWeights,
        name: str,
        tokenizer: PreTrainedTokenizerBase | None = None,
        eos_ids: frozenset[int] = frozenset(),
        layers: list[int] | None = None,
        row_kernels: RowKernels | None = None,
        in_place_trees: bool = False,
    ) -> None:
        self.weights, self.name, self.tokenizer, self.eos_ids = weights, name, tokenizer, eos_ids
        self.layer_ids = list(range(len(weights.layers))) if layers is None else list(layers)
        self.row_kernels: RowKernels = row_kernels or {}
        # Below fp32: tree rows read the cache in place where this machine's kernel keeps them exact
        # (backends/kernel_timing.py check_in_place_trees), else they gather their keys.
        self.in_place_trees = in_place_trees
        self.time_passes = None  # backends/select.py: times pass_ms when first read
        # Prompt rows through RowLinear.widened (bf16 one row at a time otherwise), where backends/kernel_timing.py
        # measured it faster on this machine: the same for every prompt (SeqPass.prompt).
        self.widen_prompts = False
        self.vocab_size = weights.lm_head.out_features
        self.max_length = weights.max_length
        self.hidden_size = weights.embed.shape[1]
        self.device, self.dtype = weights.device, weights.dtype
        self.precision = weights.precision
        self.rotary = RotaryTable(weights.inv_freq, weights.rope_scale, weights.max_length, weights.dtype, self.device)
        # Gemma 3's sliding layers rotate with their own base: one table per schedule, the first the main one.
        self.rotaries = [self.rotary] + [
            RotaryTable(f, 1.0, weights.max_length, weights.dtype, self.device) for f in (weights.inv_freqs or [])[1:]
        ]
        self._windows = any(layer.window for layer in weights.layers)
        # Below fp32 attention is row-invariant: fp32 keys in whole chunks, values with a ones column.
        self._row_invariant = weights.dtype != torch.float32

    def new_cache(self, length: int | None = None) -> KVCache:
        w = self.weights
        return KVCache(
            len(self.layer_ids),
            w.kv_heads,
            w.head_dim,
            self.max_length,
            dtype=torch.float32,
            device=self.device,
            ones_column=self._row_invariant,
            granularity=KEY_CHUNK if self._row_invariant else 1,
        )

    @torch.inference_mode()
    def forward(self, passes: list[SeqPass]) -> list[PassOutput]:
        check_passes(passes, self.max_length)
        for p in passes:
            if not isinstance(p.cache, KVCache) or p.cache.layers != len(self.layer_ids):
                raise ValueError("a cache from another backend was passed to this one")
        w = self.weights
        prepared = [self._prepare(p) for p in passes]  # (rotations: (cos, sin) per table, attention) each
        sizes = [len(p.tokens) for p in passes]
        q_size, kv_size = w.heads * w.head_dim, w.kv_heads * w.head_dim
        ids = torch.tensor([t for p in passes for t in p.tokens], dtype=torch.long, device=self.device)
        x = w.embed[ids]  # [N, hidden]
        if w.embed_scale != 1.0:  # Gemma: embeddings times sqrt(hidden), the factor in the weights' dtype
            x = x * torch.tensor(w.embed_scale, dtype=x.dtype)
        act = F.silu if w.activation == "silu" else partial(F.gelu, approximate="tanh")
        wanted = tapped_layers(passes, self.layer_ids)
        project = partial(self._linear, prompt=self._prompt_rows(passes, sizes))  # a layer's linear on x
        tapped: dict[int, torch.Tensor] = {}  # layer -> its input [N, hidden]
        for slot, layer_id in enumerate(self.layer_ids):
            layer = w.layers[layer_id]
            if layer_id in wanted:
                tapped[layer_id] = x
            qkv = project(layer.qkv, rms_norm(x, layer.input_norm, w.eps))  # [N, (H + 2 KV) D]
            outputs = []
            for p, (rotations, attention), rows in zip(passes, prepared, qkv.split(sizes)):
                n = rows.shape[0]
                qk = rows[:, : q_size + kv_size].view(n, w.heads + w.kv_heads, w.head_dim)  # [n, H + KV, D]
                if layer.q_norm is not None:  # Gemma: each head's q and k normed before rotating
                    qk = torch.cat(
                        [
                            rms_norm(qk[:, : w.heads], layer.q_norm, w.eps),
                            rms_norm(qk[:, w.heads :], layer.k_norm, w.eps),
                        ],
                        dim=1,
                    )
                # q and k rotate together: one set of operations for both.
                qk = rotate(qk.transpose(0, 1), *rotations[layer.rotary])  # [H + KV, n, D]
                v = rows[:, q_size + kv_size :].view(n, w.kv_heads, w.head_dim).transpose(0, 1)  # [KV, n, D]
                outputs.append(self._attend(p.cache, slot, qk[: w.heads], qk[w.heads :], v, attention, layer.window))
            attended = project(layer.o, torch.cat(outputs) if len(outputs) > 1 else outputs[0])
            if layer.attn_out_norm is not None:
                attended = rms_norm(attended, layer.attn_out_norm, w.eps)
            x = x + attended
            gate, up = project(layer.gate_up, rms_norm(x, layer.post_norm, w.eps)).chunk(2, dim=-1)  # [N, I]
            mlp = project(layer.down, act(gate) * up)
            x = x + (mlp if layer.mlp_out_norm is None else rms_norm(mlp, layer.mlp_out_norm, w.eps))
        hidden, rows = [], []
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        for p, part, first in zip(passes, x.split(sizes), starts):
            p.cache.advance(len(p.tokens))
            normed = rms_norm(part, w.norm, w.eps)  # [n, hidden]
            rows.append(logit_rows(normed, p.logits))
            taps = [tapped[i][first : first + len(p.tokens)] for i in p.taps] if p.hidden else []
            hidden.append(torch.cat(taps, dim=-1) if taps else normed)  # [n, hidden] or [n, len(taps) hidden]
        counts = [r.shape[0] for r in rows]
        logits = self._linear(w.lm_head, torch.cat(rows)).float() if sum(counts) else None  # [rows, V]
        parts = logits.split(counts) if logits is not None else [None] * len(passes)
        return [
            PassOutput(part if p.logits != "none" else None, h.float() if p.hidden else None)
            for p, part, h in zip(passes, parts, hidden)
        ]

    def _linear(self, linear, x: torch.Tensor, prompt: torch.Tensor | bool | None = None) -> torch.Tensor:
        """linear(x) [N, in] -> [N, out]; prompt: which rows are prompt rows (bool [N], True: all,
        None: none), widened where the layer can (RowLinear) and widen_prompts says so."""
        if prompt is None or not isinstance(linear, RowLinear):
            return apply_linear(linear, x, self.row_kernels.get(x.shape[0]))
        if prompt is True:
            return linear.widened(x)
        y = x.new_empty(x.shape[0], linear.out_features)
        y[prompt] = linear.widened(x[prompt])
        y[~prompt] = apply_linear(linear, x[~prompt], self.row_kernels.get(int((~prompt).sum())))
        return y

    def _prompt_rows(self, passes: list[SeqPass], sizes: list[int]) -> torch.Tensor | bool | None:
        """The prompt rows of a pass for _linear: None where none is widened, True where all are."""
        if not self.widen_prompts or not any(p.prompt for p in passes):
            return None
        if all(p.prompt for p in passes):
            return True
        return torch.tensor([p.prompt for p, n in zip(passes, sizes) for _ in range(n)], device=self.device)

    def _prepare(self, p: SeqPass) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], Attention]:
        """Cache room, then rotary rows (cos, sin [n, D]) per table and what attention needs (see Attention)."""
        n, start = len(p.tokens), p.cache.length
        p.cache.reserve(start + n)
        positions = list(range(start, start + n)) if p.positions is None else p.positions
        position_ids = torch.tensor(positions, dtype=torch.long, device=self.device)  # [n]
        rotations = [table.at(position_ids, max(positions) + 1) for table in self.rotaries]
        if self._row_invariant:
            return rotations, Attention(None, row_groups(start, n, p.mask, self.device, self.in_place_trees))
        mask = p.mask
        if mask is None and (n > 1 or self._windows):  # causal: token i sees the cache and the new tokens up to itself
            mask = torch.ones(n, start + n, dtype=torch.bool, device=self.device).tril(diagonal=start)
        window_mask = None
        if self._windows:  # a sliding layer's row sees keys less than its window behind it (by position)
            window = next(layer.window for layer in self.weights.layers if layer.window)
            keys = torch.cat(
                [torch.arange(start, device=self.device), position_ids]
            )  # committed entries sit at their positions
            window_mask = (mask & (position_ids[:, None] - keys[None] < window))[None, None]
        return rotations, Attention(None if mask is None else mask[None, None], [], window_mask)

    def _attend(
        self,
        cache: KVCache,
        slot: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attention: Attention,
        window: int | None = None,
    ) -> torch.Tensor:
        """Write k, v [KV, n, D] after the cache's entries, attend with q [H, n, D] -> [n, H * D]
        (window: a sliding layer's, whose rows see only the keys within it)."""
        w, n = self.weights, q.shape[1]
        cache.write(slot, k, v)
        if not attention.groups:
            end = cache.length + n
            keys, values = cache.keys[slot, :, :end], cache.values[slot, :, :end]  # [KV, end, D]
            attn = F.scaled_dot_product_attention(
                q[None],
                keys[None].to(q.dtype),
                values[None].to(q.dtype),
                attn_mask=attention.window_mask if window else attention.mask,
                scale=w.attn_scale,
                enable_gqa=w.heads != w.kv_heads,
            )[0]  # [H, n, D]
        else:
            keys, values = cache.keys[slot], cache.values[slot]  # [KV, capacity, D (+1)]
            parts = [
                (g.rows, row_invariant_attention(q[:, g.rows], *group_keys(keys, values, g), g.hidden, w.attn_scale))
                for g in attention.groups
            ]
            if len(parts) == 1:
                attn = parts[0][1]
            else:
                attn = q.new_empty(q.shape)  # [H, n, D]
                for rows, part in parts:
                    attn[:, rows] = part
        return attn.transpose(0, 1).reshape(n, w.heads * w.head_dim)
