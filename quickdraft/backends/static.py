"""The static backend: every pass at one fixed shape, replayed as a CUDA graph on a GPU.

Why: on a GPU a small batch's pass is bound by kernel launches and weight reads, so a pass of
64 rows costs about what one row costs, and replaying a captured CUDA graph removes the launches
(as gpt-fast decodes). But a GPU picks its matrix kernels by shape, so a token's last bits could
change with the number of rows beside it, and exact greedy speculation needs a verify row to equal
the plain decoding row. So here every pass has one shape: `rows` rows per sequence (a decode
step's one token and a verify pass's K + 1 alike, padded; longer passes in parts of `rows`) and
attention over the same keys, laid out by the row's own position P alone (see window_keys):
the "far" keys, positions below W * floor(P / W), read where they sit in the cache, and the "near"
keys, the row's own path from there to itself, gathered in order into a window of W. A tree row
then sums exactly the terms, in exactly the places, that the same token's one-token pass sums.
A token's arithmetic is the same whichever pass computes it, on any device: the CPU runs the same
code without graphs (the dry run the tests use). One condition: a tree must not reach past the
next multiple of W (tree_window; the engine cuts deeper nodes), where its nodes would be far keys
that sit elsewhere than their positions. Chains may: their nodes sit at their positions.

The KV cache is one preallocated pool [layers, slots, context + rows, KV, D] for all sequences:
a Cache is a slot and a length; padding rows write past the context, where nothing reads. The
pool doubles its slots when every one is taken (graphs are captured again: they hold its address).
A sequence's rows attend over its span, not the whole context: the power of two (at least 256)
that holds its prompt, its new tokens and one pass (new_cache's length hint), so a short request
does not pay for attention over 8,192 keys. One graph per (batch, span).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerBase

from quickdraft.backends.backend import PassCostsOnFirstRead, PassOutput, SeqPass, check_passes, tapped_layers
from quickdraft.models.native_weights import NativeWeights, rms_norm
from quickdraft.models.rotary import RotaryTable, rotate

MIN_SPAN = 256  # the fewest keys a sequence's rows attend over (spans are powers of two up to the context)


class StaticCache:
    """One sequence: a slot of its backend's pool, how many entries it holds, and its key span
    (the entries its rows attend over: fixed for the sequence's life, so its passes share one shape)."""

    def __init__(self, owner: int, slot: int, free: list[int], span: int) -> None:
        self.owner, self.slot, self.length, self.span = owner, slot, 0, span
        self._pool: StaticBackend | None = None  # set by the backend (keep() moves entries in its pool)
        weakref.finalize(self, free.append, slot)  # the slot goes back when the sequence is dropped

    def truncate(self, length: int) -> None:
        self.length = min(self.length, max(0, length))

    def keep(self, indices: list[int]) -> None:
        """Keep the entries at these ascending indices (an accepted tree path), moved to the front."""
        if indices != list(range(len(indices))):
            self._pool.gather(self.slot, indices)
        self.length = len(indices)


@dataclass
class _Inputs:
    """One fixed-shape pass: B sequences (real or padding) x `rows` rows each, on the device."""

    tokens: torch.Tensor  # [B, M] long
    positions: torch.Tensor  # [B, M] long: rotary positions
    writes: torch.Tensor  # [B, M] long: the pool entry each row's key and value go to
    split: torch.Tensor  # [B, M] long: entries below it are a row's far keys (see window_keys)
    slots: torch.Tensor  # [B] long: each sequence's pool slot
    visible: torch.Tensor  # [B, M, span] bool: the entries each row may attend

    def copy_(self, other: _Inputs) -> None:
        for name in ("tokens", "positions", "writes", "split", "slots", "visible"):
            getattr(self, name).copy_(getattr(other, name))


class StaticBackend:
    """Shared NativeWeights (dense, plain matrix products) run at fixed shapes for many caches.

    rows: the rows every pass computes per sequence (the most tokens verified in one pass);
    context: keys every row attends over (the most a sequence may hold); slots: sequences the pool
    holds before it grows; graphs: capture and replay CUDA graphs (default: on a CUDA device)."""

    pass_ms = PassCostsOnFirstRead()

    def __init__(
        self,
        weights: NativeWeights,
        name: str,
        tokenizer: PreTrainedTokenizerBase | None = None,
        eos_ids: frozenset[int] = frozenset(),
        layers: list[int] | None = None,
        *,
        rows: int = 64,
        context: int | None = None,
        slots: int = 2,
        graphs: bool | None = None,
    ) -> None:
        if rows < 1 or slots < 1:
            raise ValueError(f"rows and slots must be >= 1, got {rows} and {slots}")
        self.weights, self.name, self.tokenizer, self.eos_ids = weights, name, tokenizer, eos_ids
        self.layer_ids = list(range(len(weights.layers))) if layers is None else list(layers)
        self.rows = rows
        self.tree_window = rows  # W: near keys per row; trees stay below the next multiple of it
        self.max_length = min(context or weights.max_length, weights.max_length)
        self.vocab_size = weights.lm_head.out_features
        self.hidden_size = weights.embed.shape[1]
        self.device, self.dtype, self.precision = weights.device, weights.dtype, weights.precision
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        if self.graphs and self.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.time_passes = None  # backends/select.py: times pass_ms when first read
        # Every position's rotation, made once: a graph reads this very tensor.
        table = RotaryTable(weights.inv_freq, weights.rope_scale, self.max_length, weights.dtype, self.device)
        table.at(torch.zeros(1, dtype=torch.long, device=self.device), self.max_length)  # grows to every position
        self.cos, self.sin = table.cos, table.sin  # [context, D]
        self._free: list[int] = []
        self.keys = self.values = torch.empty(0)
        self._allocate(slots)
        # (batch, span, taps) -> a captured graph, its input buffers and its outputs
        self._graphs: dict[
            tuple[int, int, tuple[int, ...]], tuple[torch.cuda.CUDAGraph, _Inputs, tuple[torch.Tensor, torch.Tensor]]
        ] = {}
        self._graph_pool = None

    # -- the pool -------------------------------------------------------------------------------

    @property
    def slots(self) -> int:
        return self.keys.shape[1]

    def _allocate(self, slots: int) -> None:
        """A pool of `slots` sequences, keeping the entries of the slots there were."""
        w, old = self.weights, self.keys.shape[1] if self.keys.dim() == 5 else 0
        shape = (len(self.layer_ids), slots, self.max_length + self.rows, w.kv_heads, w.head_dim)
        # Zeros: masked keys weigh 0, and 0 x a never-written value must stay 0 (not NaN).
        keys = torch.zeros(shape, dtype=self.dtype, device=self.device)
        values = torch.zeros(shape, dtype=self.dtype, device=self.device)
        if old:
            keys[:, :old], values[:, :old] = self.keys, self.values
        self.keys, self.values = keys, values
        self._free.extend(range(old, slots))
        self._graphs = {}  # captured over the old pool's address

    def new_cache(self, length: int | None = None) -> StaticCache:
        if not self._free:
            self._allocate(2 * self.slots)
        self._free.sort(reverse=True)
        cache = StaticCache(id(self), self._free.pop(), self._free, self.span_for(length or self.max_length))
        cache._pool = self
        return cache

    def span_for(self, length: int) -> int:
        """Keys attended by a sequence of up to `length` entries: a power of two >= 256 with room for
        one more pass, at most the context."""
        return min(self.max_length, max(MIN_SPAN, 1 << (length + self.rows - 1).bit_length()))

    @torch.inference_mode()
    def gather(self, slot: int, indices: list[int]) -> None:
        """Move a slot's entries at `indices` to its front, in order (gather first: no aliasing)."""
        index = torch.tensor(indices, dtype=torch.long, device=self.device)
        for pool in (self.keys, self.values):
            pool[:, slot, : len(indices)] = pool[:, slot, index]

    # -- passes ---------------------------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, passes: list[SeqPass]) -> list[PassOutput]:
        check_passes(passes, self.max_length)
        for p in passes:
            if not isinstance(p.cache, StaticCache) or p.cache.owner != id(self):
                raise ValueError("a cache from another backend was passed to this one")
        for p in passes:  # a sequence that outgrew its length hint attends over more keys from now on
            if p.cache.length + len(p.tokens) > p.cache.span:
                p.cache.span = self.span_for(p.cache.length + len(p.tokens))
        m = self.rows
        tapped_layers(passes, self.layer_ids)
        asked = {p.taps for p in passes if p.hidden}
        if len(asked) > 1:
            raise ValueError(f"one pass of the static backend returns one kind of hidden state; asked for {asked}")
        taps = asked.pop() if asked else ()
        parts = max(-(-len(p.tokens) // m) for p in passes)
        logits: list[list[torch.Tensor]] = [[] for _ in passes]
        hidden: list[list[torch.Tensor]] = [[] for _ in passes]
        for part in range(parts):  # a pass longer than `rows` runs in parts, every sequence's together
            active = [i for i, p in enumerate(passes) if part * m < len(p.tokens)]
            # [B*M, V], [B*M, H] (or [B*M, len(taps) H])
            out_logits, out_hidden = self._run(self._inputs([passes[i] for i in active], part), taps)
            for b, i in enumerate(active):
                n = min(m, len(passes[i].tokens) - part * m)
                logits[i].append(out_logits[b * m : b * m + n])
                hidden[i].append(out_hidden[b * m : b * m + n])
        outputs = []
        for p, rows, states in zip(passes, logits, hidden):
            p.cache.length += len(p.tokens)
            every = torch.cat(rows) if len(rows) > 1 else rows[0]  # [n, V]
            chosen = every if p.logits == "all" else every[-1:] if p.logits == "last" else None
            h = (torch.cat(states) if len(states) > 1 else states[0]) if p.hidden else None
            # Copies: a replayed graph writes its outputs again at the next pass.
            outputs.append(PassOutput(None if chosen is None else chosen.clone(), None if h is None else h.clone()))
        return outputs

    def _inputs(self, passes: list[SeqPass], part: int) -> _Inputs:
        """Rows part*M .. part*M+M-1 of each pass, padded to M rows and to a batch of a power of two.
        The integers go to the device in one copy; causal rows' visibility is made there."""
        m, device, window = self.rows, self.device, self.tree_window
        span = max(p.cache.span for p in passes)  # keys every row of this pass attends over
        batch = 1 << (len(passes) - 1).bit_length()
        block = torch.zeros(5, batch, m, dtype=torch.long)  # tokens, positions, writes, split, causal ends
        tokens, positions, writes, split, ends = block
        writes[:] = torch.arange(self.max_length, self.max_length + m)  # padding rows: past the context
        slots = torch.zeros(batch, dtype=torch.long)
        trees: list[tuple[int, int, int, torch.Tensor]] = []  # (sequence, rows, entries seen, mask rows)
        for b, p in enumerate(passes):
            first, start = part * m, p.cache.length
            n = min(m, len(p.tokens) - first)
            where = torch.arange(start + first, start + first + n)
            tokens[b, :n] = torch.tensor(p.tokens[first : first + n])
            positions[b, :n] = where if p.positions is None else torch.tensor(p.positions[first : first + n])
            writes[b, :n], ends[b, :n], slots[b] = where, where, p.cache.slot
            split[b, :n] = positions[b, :n] - positions[b, :n] % window  # by the row's position alone
            if p.mask is not None:
                # A tree row's ancestors sit after the committed entries, not at their positions: its
                # near keys begin no later than the pass (the engine keeps trees below the next multiple of W).
                split[b, :n] = split[b, :n].clamp(max=start)
                trees.append((b, n, start + first + n, p.mask[first : first + n, : start + first + n]))
        on_device = torch.cat([block.view(-1), slots]).to(device)
        tokens, positions, writes, split, ends = on_device[: block.numel()].view(5, batch, m)
        visible = torch.arange(span, device=device)[None, None] <= ends[:, :, None]  # [B, M, span]: causal
        for b, n, seen, rows in trees:
            visible[b, :n, :seen] = rows
            visible[b, :n, seen:] = False
        return _Inputs(tokens, positions, writes, split, on_device[block.numel() :], visible)

    def _run(self, inputs: _Inputs, taps: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """The fixed-shape pass -> logits [B*M, V] and hidden states [B*M, H] (fp32; with taps, those
        layers' inputs [B*M, len(taps) H])."""
        if not self.graphs:
            return self._step(inputs, taps)
        key = (inputs.tokens.shape[0], inputs.visible.shape[2], taps)  # (batch, span, taps)
        if key not in self._graphs:
            self._graphs[key] = self._capture(*key)
        graph, static, outputs = self._graphs[key]
        static.copy_(inputs)
        graph.replay()
        return outputs

    def _capture(
        self, batch: int, span: int, taps: tuple[int, ...]
    ) -> tuple[torch.cuda.CUDAGraph, _Inputs, tuple[torch.Tensor, torch.Tensor]]:
        """A CUDA graph of one pass of `batch` sequences attending over `span` keys, over static input
        buffers (gpt-fast's way: warm up on a side stream, then capture). The warm-up writes only
        past the context."""
        m, context, device = self.rows, self.max_length, self.device
        zeros = torch.zeros(batch, m, dtype=torch.long, device=device)
        static = _Inputs(
            zeros.clone(),
            zeros.clone(),
            torch.arange(context, context + m, device=device).repeat(batch, 1),
            zeros.clone(),
            torch.zeros(batch, dtype=torch.long, device=device),
            torch.ones(batch, m, span, dtype=torch.bool, device=device).tril(),
        )
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step(static, taps)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._graph_pool):
            outputs = self._step(static, taps)
        return graph, static, outputs

    def _step(self, inputs: _Inputs, taps: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """The model over [B, M] rows: no host reads, no shapes that depend on data (graph-safe)."""
        w = self.weights
        batch, m = inputs.tokens.shape
        span = inputs.visible.shape[2]
        far, near, near_visible = window_keys(
            inputs.visible.view(batch * m, span), inputs.split.view(-1), self.tree_window
        )  # [B*M, span], [B*M, W] x2
        near = near.view(batch, m, -1)
        q_size, kv_size = w.heads * w.head_dim, w.kv_heads * w.head_dim
        slot_rows = inputs.slots[:, None].expand(batch, m).reshape(-1)  # [B*M]
        writes = inputs.writes.reshape(-1)  # [B*M]
        cos = self.cos[inputs.positions.reshape(-1)][:, None]  # [B*M, 1, D]
        sin = self.sin[inputs.positions.reshape(-1)][:, None]
        x = w.embed[inputs.tokens.reshape(-1)]  # [B*M, hidden]
        tapped: dict[int, torch.Tensor] = {}  # layer -> its input [B*M, hidden]
        for slot, layer_id in enumerate(self.layer_ids):
            layer = w.layers[layer_id]
            if layer_id in taps:
                tapped[layer_id] = x
            qkv = layer.qkv(rms_norm(x, layer.input_norm, w.eps))  # [B*M, (H + 2 KV) D]
            qk = rotate(qkv[:, : q_size + kv_size].view(-1, w.heads + w.kv_heads, w.head_dim), cos, sin)
            q, k = qk[:, : w.heads], qk[:, w.heads :]  # [B*M, H, D], [B*M, KV, D]
            v = qkv[:, q_size + kv_size :].view(-1, w.kv_heads, w.head_dim)  # [B*M, KV, D]
            self.keys[slot].index_put_((slot_rows, writes), k)
            self.values[slot].index_put_((slot_rows, writes), v)
            pool_k, pool_v = self.keys[slot], self.values[slot]  # [slots, context + M, KV, D]
            near_slots = inputs.slots[:, None, None]  # [B, 1, 1]
            attended = window_attention(
                q.view(batch, m, w.heads, w.head_dim),
                pool_k[inputs.slots, :span],
                pool_v[inputs.slots, :span],
                far.view(batch, m, span),
                pool_k[near_slots, near],
                pool_v[near_slots, near],
                near_visible.view(batch, m, -1),
            )
            x = x + layer.o(attended)
            gate, up = layer.gate_up(rms_norm(x, layer.post_norm, w.eps)).chunk(2, dim=-1)  # [B*M, I]
            x = x + layer.down(F.silu(gate) * up)
        hidden = rms_norm(x, w.norm, w.eps)  # [B*M, hidden]
        features = torch.cat([tapped[i] for i in taps], dim=-1) if taps else hidden  # [B*M, hidden or F]
        return w.lm_head(hidden).float(), features.float()


def window_keys(
    visible: torch.Tensor, split: torch.Tensor, window: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Which keys each row reads as far keys and which as near ones. visible [R, C] bool (keys a row
    may attend, by pool entry), split [R] (entries below it are far) -> far [R, C] bool, near [R, W]
    (pool entries, ascending; unused ones 0) and near_visible [R, W] bool. A row with more than W
    entries from its split on keeps the last W near (the rest are read as far keys). Tensor
    operations only: no host reads, so it runs inside a step."""
    entries = torch.arange(visible.shape[1], device=visible.device)  # [C]
    after = visible & (entries[None] >= split[:, None])  # [R, C]
    count = after.sum(dim=1, keepdim=True)  # [R, 1]
    rank = after.cumsum(dim=1) - 1  # [R, C]: each entry's place among the row's entries after the split
    near_mask = after & (rank >= count - window)  # the last W of them
    far = visible & ~near_mask
    place = torch.where(near_mask, rank - (count - window).clamp(min=0), window)  # [R, C]: W = dropped
    near = torch.zeros(visible.shape[0], window + 1, dtype=torch.long, device=visible.device)
    near.scatter_(1, place, entries[None].expand_as(place))  # dropped entries all land in column W
    near_visible = torch.arange(window, device=visible.device)[None] < count.clamp(max=window)  # [R, W]
    return far, near[:, :window], near_visible


def window_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    far: torch.Tensor,
    near_keys: torch.Tensor,
    near_values: torch.Tensor,
    near_visible: torch.Tensor,
) -> torch.Tensor:
    """Softmax attention of q [B, M, H, D] over far keys and values [B, L, KV, D] (far [B, M, L]:
    which a row reads) and each row's near keys and values [B, M, W, KV, D] (near_visible
    [B, M, W]) -> [B*M, H*D]. One softmax over both; plain matrix products of one shape for every
    pass (SDPA picks kernels by mask and shape); scores and softmax in fp32, as transformers'
    eager attention does."""
    batch, m, heads, dim = q.shape
    kv_heads, window = keys.shape[2], near_keys.shape[2]
    group = heads // kv_heads  # query heads per KV head, consecutive as in transformers
    grouped = q.view(batch, m, kv_heads, group, dim)
    queries = grouped.permute(0, 2, 3, 1, 4).reshape(batch, kv_heads, group * m, dim)  # [B, KV, G*M, D]
    far_scores = torch.matmul(queries, keys.permute(0, 2, 3, 1)).float()  # [B, KV, G*M, L]
    far_scores = far_scores.view(batch, kv_heads, group, m, -1)
    near_scores = torch.matmul(grouped, near_keys.permute(0, 1, 3, 4, 2)).float()  # [B, M, KV, G, W]
    near_scores = near_scores.permute(0, 2, 3, 1, 4)  # [B, KV, G, M, W]
    scores = torch.cat([far_scores, near_scores], dim=-1) * dim**-0.5  # [B, KV, G, M, L + W]
    seen = torch.cat([far, near_visible], dim=-1)[:, None, None]  # [B, 1, 1, M, L + W]
    weights = torch.softmax(scores.masked_fill(~seen, float("-inf")), dim=-1).to(q.dtype)
    far_weights = weights[..., :-window].reshape(batch, kv_heads, group * m, -1)  # [B, KV, G*M, L]
    near_weights = weights[..., -window:].permute(0, 3, 1, 2, 4)  # [B, M, KV, G, W]
    out = torch.matmul(far_weights, values.transpose(1, 2)).view(batch, kv_heads, group, m, dim)
    out = out.permute(0, 3, 1, 2, 4) + torch.matmul(
        near_weights, near_values.permute(0, 1, 3, 2, 4)
    )  # [B, M, KV, G, D]
    return out.reshape(batch * m, heads * dim)
