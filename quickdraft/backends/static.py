"""The static backend: every pass at one fixed shape, replayed as a CUDA graph on a GPU.

Why: on a GPU a small batch's pass is bound by kernel launches and weight reads, so a pass of
64 rows costs about what one row costs, and replaying a captured CUDA graph removes the launches
(as gpt-fast decodes). But a GPU picks its matrix kernels by shape, so a token's last bits could
change with the number of rows beside it, and exact greedy speculation needs a verify row to equal
the plain decoding row. So here every pass has one shape: `rows` rows per sequence (a decode
step's one token and a verify pass's K + 1 alike, padded; longer passes in parts of `rows`) and
attention over the same `context` keys (those a row may not see are masked to weigh exactly 0).
A token's arithmetic is then the same whichever pass computes it, on any device: the CPU runs the
same code without graphs (the dry run the tests use).

The KV cache is one preallocated pool [layers, slots, context + rows, KV, D] for all sequences:
a Cache is a slot and a length; padding rows write past the context, where nothing reads. The
pool doubles its slots when every one is taken (graphs are captured again: they hold its address).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerBase

from quickdraft.backends.base import PassOutput, SeqPass, check_passes
from quickdraft.models.native import NativeWeights, rms_norm
from quickdraft.models.rotary import RotaryTable, rotate


class StaticCache:
    """One sequence: a slot of its backend's pool and how many entries it holds."""

    def __init__(self, owner: int, slot: int, free: list[int]) -> None:
        self.owner, self.slot, self.length = owner, slot, 0
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
    slots: torch.Tensor  # [B] long: each row's pool slot
    writes: torch.Tensor  # [B, M] long: the pool entry each row's key and value go to
    visible: torch.Tensor  # [B, M, context] bool: True where a row may attend a key


class StaticBackend:
    """Shared NativeWeights (dense, plain matrix products) run at fixed shapes for many caches.

    rows: the rows every pass computes per sequence (the most tokens verified in one pass);
    context: keys every row attends over (the most a sequence may hold); slots: sequences the pool
    holds before it grows; graphs: capture and replay CUDA graphs (default: on a CUDA device)."""

    def __init__(self, weights: NativeWeights, name: str, tokenizer: PreTrainedTokenizerBase | None = None,
                 eos_ids: frozenset[int] = frozenset(), layers: list[int] | None = None, *, rows: int = 64,
                 context: int | None = None, slots: int = 2, graphs: bool | None = None) -> None:
        if rows < 1 or slots < 1:
            raise ValueError(f"rows and slots must be >= 1, got {rows} and {slots}")
        self.weights, self.name, self.tokenizer, self.eos_ids = weights, name, tokenizer, eos_ids
        self.layer_ids = list(range(len(weights.layers))) if layers is None else list(layers)
        self.rows = rows
        self.max_length = min(context or weights.max_length, weights.max_length)
        self.vocab_size = weights.lm_head.out_features
        self.hidden_size = weights.embed.shape[1]
        self.device, self.dtype, self.precision = weights.device, weights.dtype, weights.precision
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        if self.graphs and self.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.pass_ms: dict[int, float] | None = None
        # Every position's rotation, made once: a graph reads this very tensor.
        table = RotaryTable(weights.inv_freq, weights.rope_scale, self.max_length, weights.dtype, self.device)
        table.at(torch.zeros(1, dtype=torch.long, device=self.device), self.max_length)  # grows to every position
        self.cos, self.sin = table.cos, table.sin  # [context, D]
        self._free: list[int] = []
        self.keys = self.values = torch.empty(0)
        self._allocate(slots)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, _Inputs, tuple[torch.Tensor, torch.Tensor]]] = {}
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

    def new_cache(self) -> StaticCache:
        if not self._free:
            self._allocate(2 * self.slots)
        self._free.sort(reverse=True)
        cache = StaticCache(id(self), self._free.pop(), self._free)
        cache._pool = self
        return cache

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
        m = self.rows
        parts = max(-(-len(p.tokens) // m) for p in passes)
        logits: list[list[torch.Tensor]] = [[] for _ in passes]
        hidden: list[list[torch.Tensor]] = [[] for _ in passes]
        for part in range(parts):  # a pass longer than `rows` runs in parts, every sequence's together
            active = [i for i, p in enumerate(passes) if part * m < len(p.tokens)]
            out_logits, out_hidden = self._run(self._inputs([passes[i] for i in active], part))  # [B*M, V], [B*M, H]
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
        """Rows part*M .. part*M+M-1 of each pass, padded to M rows and to a batch of a power of two."""
        m, context, device = self.rows, self.max_length, self.device
        batch = 1 << (len(passes) - 1).bit_length()
        tokens = torch.zeros(batch, m, dtype=torch.long)
        positions = torch.zeros(batch, m, dtype=torch.long)
        slots = torch.zeros(batch, dtype=torch.long)
        writes = torch.arange(context, context + m).repeat(batch, 1)  # padding: past the context
        ends = torch.zeros(batch, m, dtype=torch.long)  # causal rows see entries 0 .. end
        trees: list[tuple[int, int, int, torch.Tensor]] = []  # (sequence, rows, cached, mask rows)
        for b, p in enumerate(passes):
            first, start = part * m, p.cache.length
            n = min(m, len(p.tokens) - first)
            tokens[b, :n] = torch.tensor(p.tokens[first : first + n])
            where = range(start + first, start + first + n)
            positions[b, :n] = torch.tensor(list(where) if p.positions is None else p.positions[first : first + n])
            slots[b] = p.cache.slot
            writes[b, :n] = torch.tensor(list(where))
            ends[b, :n] = torch.tensor(list(where))
            if p.mask is not None:
                trees.append((b, n, start + first + n, p.mask[first : first + n, : start + first + n]))
        keys = torch.arange(context, device=device)
        visible = keys[None, None] <= ends.to(device)[:, :, None]  # [B, M, context]: causal
        for b, n, seen, rows in trees:
            visible[b, :n, :seen] = rows
            visible[b, :n, seen:] = False
        return _Inputs(tokens.to(device), positions.to(device), slots.to(device), writes.to(device), visible)

    def _run(self, inputs: _Inputs) -> tuple[torch.Tensor, torch.Tensor]:
        """The fixed-shape pass -> logits [B*M, V] and hidden states [B*M, H] (fp32)."""
        if not self.graphs:
            return self._step(inputs)
        batch = inputs.tokens.shape[0]
        if batch not in self._graphs:
            self._graphs[batch] = self._capture(batch)
        graph, static, outputs = self._graphs[batch]
        for name in ("tokens", "positions", "slots", "writes", "visible"):
            getattr(static, name).copy_(getattr(inputs, name))
        graph.replay()
        return outputs

    def _capture(self, batch: int) -> tuple[torch.cuda.CUDAGraph, _Inputs, tuple[torch.Tensor, torch.Tensor]]:
        """A CUDA graph of one pass of `batch` sequences over static input buffers (gpt-fast's way:
        warm up on a side stream, then capture). The warm-up writes only past the context."""
        m, context, device = self.rows, self.max_length, self.device
        static = _Inputs(torch.zeros(batch, m, dtype=torch.long, device=device),
                         torch.zeros(batch, m, dtype=torch.long, device=device),
                         torch.zeros(batch, dtype=torch.long, device=device),
                         torch.arange(context, context + m, device=device).repeat(batch, 1),
                         torch.ones(batch, m, context, dtype=torch.bool, device=device).tril())
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step(static)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._graph_pool):
            outputs = self._step(static)
        return graph, static, outputs

    def _step(self, inputs: _Inputs) -> tuple[torch.Tensor, torch.Tensor]:
        """The model over [B, M] rows: no host reads, no shapes that depend on data (graph-safe)."""
        w = self.weights
        batch, m = inputs.tokens.shape
        q_size, kv_size = w.heads * w.head_dim, w.kv_heads * w.head_dim
        slot_rows = inputs.slots[:, None].expand(batch, m).reshape(-1)  # [B*M]
        writes = inputs.writes.reshape(-1)  # [B*M]
        cos = self.cos[inputs.positions.reshape(-1)][:, None]  # [B*M, 1, D]
        sin = self.sin[inputs.positions.reshape(-1)][:, None]
        x = w.embed[inputs.tokens.reshape(-1)]  # [B*M, hidden]
        for slot, layer_id in enumerate(self.layer_ids):
            layer = w.layers[layer_id]
            qkv = layer.qkv(rms_norm(x, layer.input_norm, w.eps))  # [B*M, (H + 2 KV) D]
            qk = rotate(qkv[:, : q_size + kv_size].view(-1, w.heads + w.kv_heads, w.head_dim), cos, sin)
            q, k = qk[:, : w.heads], qk[:, w.heads :]  # [B*M, H, D], [B*M, KV, D]
            v = qkv[:, q_size + kv_size :].view(-1, w.kv_heads, w.head_dim)  # [B*M, KV, D]
            self.keys[slot].index_put_((slot_rows, writes), k)
            self.values[slot].index_put_((slot_rows, writes), v)
            keys = self.keys[slot, inputs.slots, : self.max_length]  # [B, context, KV, D]
            values = self.values[slot, inputs.slots, : self.max_length]
            attended = fixed_attention(q.view(batch, m, w.heads, w.head_dim), keys, values, inputs.visible)
            x = x + layer.o(attended)
            gate, up = layer.gate_up(rms_norm(x, layer.post_norm, w.eps)).chunk(2, dim=-1)  # [B*M, I]
            x = x + layer.down(F.silu(gate) * up)
        hidden = rms_norm(x, w.norm, w.eps)  # [B*M, hidden]
        return w.lm_head(hidden).float(), hidden.float()


def fixed_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Softmax attention of q [B, M, H, D] over keys and values [B, L, KV, D], visible [B, M, L]
    -> [B*M, H*D]. Plain matrix products of one shape for every pass (SDPA picks kernels by mask
    and shape); scores and softmax in fp32, as transformers' eager attention does."""
    batch, m, heads, dim = q.shape
    kv_heads = keys.shape[2]
    group = heads // kv_heads  # query heads per KV head, consecutive as in transformers
    queries = q.view(batch, m, kv_heads, group, dim).permute(0, 2, 3, 1, 4).reshape(batch, kv_heads, group * m, dim)
    scores = torch.matmul(queries, keys.permute(0, 2, 3, 1)).float() * dim ** -0.5  # [B, KV, G*M, L]
    scores = scores.view(batch, kv_heads, group, m, -1).masked_fill(~visible[:, None, None], float("-inf"))
    weights = torch.softmax(scores, dim=-1).to(q.dtype).view(batch, kv_heads, group * m, -1)
    out = torch.matmul(weights, values.transpose(1, 2))  # [B, KV, G*M, D]
    return out.view(batch, kv_heads, group, m, dim).permute(0, 3, 1, 2, 4).reshape(batch * m, heads * dim)
