"""Row-invariant attention: below fp32 the native backend gives every token of a pass, chain or
tree, the bits a one-token pass gives it, so greedy speculation is exactly plain greedy decoding.

The canonical sum. A row at position p reads its keys in path order (the prefix, then its
ancestors, then itself) and sums them in two parts: the whole chunks of KEY_CHUNK keys before
its own chunk, then its own chunk (padded with masked keys to KEY_CHUNK). Every matmul then has a
shape fixed by p alone, whichever pass computes the row.

Why two parts: a tree row's ancestors sit after their siblings in the cache, so its last keys
must be gathered in path order; the chunks before its own are the committed prefix, the same
for every row of the tree, and are read from the cache in place by one matmul for all rows. Only
a chunk of KEY_CHUNK keys per tree row is gathered, and all tree rows go through one batched
matmul (docs/bench/history.md: "Tree passes"). A row whose own chunk starts past the pass's first token
(the tree crosses a chunk boundary) gathers its earlier chunks too, on its own.

Trees in place. Where this machine's matmul kernel sums every output in order along the
contraction (checked at load: trees_read_in_place), a key that weighs exactly 0 changes no sum
and a key's score does not depend on which row of the matrix holds it. Then the tree rows of the
root's chunk need no gathering: they read the cache in place from their chunk's start to the
tree's last slot (whole chunks), their siblings' keys masked, as a chain's rows do. Their
visible keys are in path order there already (parents sit before children), and the masked ones
add exact zeros.

Why not SDPA: its CPU kernel blocks its sums by the pass's shape, so a token's bf16 output
changed with the tokens beside it. Here both matmuls put the keys on the rows and the queries on
the columns, padded to whole blocks of 16 (measured: a column's result then does not depend on
how many columns there are, nor on how many matrices a batched matmul holds; a single column or
a part-filled block can take another kernel). Masked keys weigh exactly 0, the softmax sum comes
out of the second matmul through the values' ones column, and every exp runs over whole vectors
(sizes are multiples of KEY_CHUNK), so no element takes the scalar tail of a vectorised loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from quickdraft.models.linear import whole_column_blocks
from quickdraft.tree import ancestors, tree_mask

KEY_CHUNK = 32  # keys are summed in whole chunks of this many; a KV cache grows in whole chunks


def chunk_start(position: int) -> int:
    """First position of the chunk holding `position`: the keys before it are the row's prefix part."""
    return position // KEY_CHUNK * KEY_CHUNK


@dataclass
class RowGroup:
    """Rows of a pass that share a prefix length and read their own chunk the same way.

    rows: the pass's rows (a slice when consecutive). prefix: keys [0, prefix) of the prefix
    part, whole chunks, all visible. prefix_index [prefix]: the slots of a single row's prefix
    part in path order (None: the cache's first `prefix` slots, shared by the group).
    tail_index [m, KEY_CHUNK]: each row's own chunk in path order (None: the cache's slots
    prefix..prefix + KEY_CHUNK, shared). hidden: True where a row may not see a key of its chunk,
    [tail, 1, m] when shared, [m, KEY_CHUNK, 1] when per row (the scores' layouts)."""

    rows: slice | torch.Tensor
    prefix: int
    hidden: torch.Tensor
    tail_index: torch.Tensor | None = None
    prefix_index: torch.Tensor | None = None
    tail: int = KEY_CHUNK  # keys of the own part when shared: a tree read in place may span several chunks


def row_groups(
    start: int, n: int, mask: torch.Tensor | None, device: torch.device | str = "cpu", in_place: bool = False
) -> list[RowGroup]:
    """Group a pass's rows (cache slots start..start+n-1) by how they read their keys. mask
    [n, start + n] (True: visible), or None for a causal pass (no per-row work: a long prefill
    stays cheap).

    In a chain (every row sees the cache's first slots up to its own), rows that share a chunk
    read the cache in place. In a tree (some row skips its siblings) every row gathers its own
    chunk in path order, and rows with the same prefix part share one batched matmul: usually
    the whole pass is one group. in_place (where trees_read_in_place holds): the tree rows of
    the root's chunk read the cache in place instead, one group."""
    seen = [None if mask is None else mask[i].nonzero()[:, 0].tolist() for i in range(n)]  # visible slots, ascending
    positions = [start + i if s is None else len(s) - 1 for i, s in enumerate(seen)]
    if all(s is None or s[-1] == p for s, p in zip(seen, positions)):  # a chain: every row's keys are the cache's first
        runs: dict[int, list[int]] = {}  # consecutive rows share a prefix part
        for i, p in enumerate(positions):
            runs.setdefault(chunk_start(p), []).append(i)
        return [_shared_group(start, rows, device) for rows in runs.values()]
    groups, gathered, read = [], {}, []  # prefix -> rows whose prefix part is the cache's first slots
    first = chunk_start(start)
    for i, (s, p) in enumerate(zip(seen, positions)):
        prefix = chunk_start(p)
        if prefix == 0 or s[prefix - 1] == prefix - 1:
            if in_place and prefix == first:
                read.append(i)
            else:
                gathered.setdefault(prefix, []).append(i)
        else:  # its prefix part holds tree slots too: gather it, alone
            path = torch.tensor(s, dtype=torch.long, device=device)
            groups.append(_gathered_group([i], prefix, [s], device, prefix_index=path[:prefix]))
    if read:
        groups.append(_in_place_group(read, first, start + n, mask, device))
    return [
        _gathered_group(rows, prefix, [seen[i] for i in rows], device) for prefix, rows in gathered.items()
    ] + groups


def _shared_group(start: int, rows: list[int], device: torch.device | str) -> RowGroup:
    """Consecutive rows that read the cache in place: row i sees slots up to start + i."""
    prefix = chunk_start(start + rows[0])
    ends = torch.tensor([start + i for i in rows], device=device)  # [m] last visible slot
    slots = prefix + torch.arange(KEY_CHUNK, device=device)  # [C]
    hidden = slots[:, None] > ends[None]  # [C, m]
    return RowGroup(slice(rows[0], rows[-1] + 1), prefix, hidden[:, None, :])


def _in_place_group(rows: list[int], prefix: int, end: int, mask: torch.Tensor, device: torch.device | str) -> RowGroup:
    """Tree rows of the chunk at `prefix` reading slots prefix..end-1 (whole chunks) in place; a
    slot a row may not see, or past the pass, is hidden."""
    tail = (end - prefix + KEY_CHUNK - 1) // KEY_CHUNK * KEY_CHUNK
    which = torch.tensor(rows, dtype=torch.long, device=mask.device)
    visible = mask.index_select(0, which)[:, prefix:end]  # [m, end - prefix]
    hidden = torch.ones(tail, len(rows), dtype=torch.bool, device=mask.device)  # [tail, m]
    hidden[: end - prefix] = ~visible.T
    return RowGroup(which.to(device), prefix, hidden[:, None, :].to(device), tail=tail)


def _gathered_group(
    rows: list[int],
    prefix: int,
    seen: list[list[int]],
    device: torch.device | str,
    prefix_index: torch.Tensor | None = None,
) -> RowGroup:
    """Tree rows that gather their own chunk: its visible slots in path order, then masked padding."""
    tails = [s[prefix:] for s in seen]
    index = torch.tensor([t + [0] * (KEY_CHUNK - len(t)) for t in tails], dtype=torch.long, device=device)  # [m, C]
    counts = torch.tensor([len(t) for t in tails], device=device)
    hidden = torch.arange(KEY_CHUNK, device=device)[None] >= counts[:, None]  # [m, C]
    which = torch.tensor(rows, dtype=torch.long, device=device)
    return RowGroup(which, prefix, hidden[:, :, None], index, prefix_index)


def group_keys(
    keys: torch.Tensor, values: torch.Tensor, group: RowGroup
) -> tuple[tuple[torch.Tensor, torch.Tensor] | None, tuple[torch.Tensor, torch.Tensor]]:
    """A group's keys and values from one layer of a cache (keys [KV, capacity, D], values
    [KV, capacity, D + 1]): the prefix part [KV, prefix, D (+1)] (None when empty) and the own
    chunks [KV, C, D (+1)] (shared) or [KV, m, C, D (+1)] (per row)."""
    c = group.prefix
    if c == 0:
        prefix = None
    elif group.prefix_index is None:
        prefix = keys[:, :c], values[:, :c]
    else:
        prefix = keys.index_select(1, group.prefix_index), values.index_select(1, group.prefix_index)
    if group.tail_index is None:
        tail = keys[:, c : c + group.tail], values[:, c : c + group.tail]
    else:  # index_select over the flat index: a few times faster than indexing with the 2-d one
        m, flat = group.tail_index.shape[0], group.tail_index.view(-1)
        tail = (
            keys.index_select(1, flat).view(keys.shape[0], m, KEY_CHUNK, -1),
            values.index_select(1, flat).view(values.shape[0], m, KEY_CHUNK, -1),
        )
    return prefix, tail


def row_invariant_attention(
    q: torch.Tensor,
    prefix: tuple[torch.Tensor, torch.Tensor] | None,
    tail: tuple[torch.Tensor, torch.Tensor],
    hidden: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Softmax attention of q [H, m, D] over a prefix part and own chunks (see group_keys; fp32,
    values with a trailing ones column) -> [H, m, D] in q's dtype. The canonical sum: the
    module's docstring."""
    heads, m, dim = q.shape
    kv_heads = tail[0].shape[0]
    group = heads // kv_heads  # query heads per KV head, consecutive as in transformers
    cols = group * m
    scale = dim**-0.5 if scale is None else scale
    per_row = tail[0].dim() == 4
    queries = q.float().reshape(kv_heads, cols, dim)  # [KV, G m, D]: column g m + r
    wide = F.pad(queries.transpose(1, 2), (0, whole_column_blocks(cols) - cols))  # [KV, D, pad]
    if per_row:  # each row its own matmul: its G columns, padded
        narrow = queries.view(kv_heads, group, m, dim).permute(0, 2, 3, 1)  # [KV, m, D, G]
        narrow = F.pad(narrow, (0, whole_column_blocks(group) - group))  # [KV, m, D, padG]
        tail_scores = torch.matmul(tail[0], narrow)[..., :group].mul_(scale)  # [KV, m, C, G]
        tail_scores = tail_scores.masked_fill_(hidden, float("-inf"))
        tail_max = tail_scores.max(dim=2).values.transpose(1, 2)[:, None]  # [KV, 1, G, m]
    else:
        tail_scores = torch.matmul(tail[0], wide)[..., :cols].view(kv_heads, -1, group, m).mul_(scale)  # [KV, C, G, m]
        tail_scores = tail_scores.masked_fill_(hidden, float("-inf"))
        tail_max = tail_scores.max(dim=1, keepdim=True).values  # (max's kernel: about twice amax's speed here)
    top = tail_max  # [KV, 1, G, m]: the row's largest score
    if prefix is not None:
        prefix_scores = (
            torch.matmul(prefix[0], wide)[..., :cols].view(kv_heads, -1, group, m).mul_(scale)
        )  # [KV, c, G, m]
        top = torch.maximum(top, prefix_scores.max(dim=1, keepdim=True).values)
    if per_row:
        tail_weights = torch.exp(tail_scores - top[:, 0].permute(0, 2, 1)[:, :, None])  # [KV, m, C, G]
        tail_weights = F.pad(tail_weights, (0, whole_column_blocks(group) - group))
        summed = torch.matmul(tail[1].transpose(2, 3), tail_weights)[..., :group]  # [KV, m, D + 1, G]
        summed = summed.permute(0, 2, 3, 1).reshape(kv_heads, dim + 1, cols)  # [KV, D + 1, G m]
    else:
        tail_weights = torch.exp(tail_scores - top).view(kv_heads, -1, cols)  # [KV, C, G m]
        summed = _weighted_values(tail[1], tail_weights, cols)
    if prefix is not None:  # prefix part first, then the own chunk: the order every pass adds them in
        prefix_weights = torch.exp(prefix_scores - top).view(kv_heads, -1, cols)  # [KV, c, G m]
        summed = _weighted_values(prefix[1], prefix_weights, cols) + summed
    out = (summed[:, :dim] / summed[:, dim:]).view(kv_heads, dim, group, m)
    return out.permute(0, 2, 3, 1).reshape(heads, m, dim).to(q.dtype)


def _weighted_values(values: torch.Tensor, weights: torch.Tensor, cols: int) -> torch.Tensor:
    """values [KV, L, D + 1] weighted by weights [KV, L, cols] -> [KV, D + 1, cols]: keys on the
    contraction, columns padded to whole blocks."""
    padded = F.pad(weights, (0, whole_column_blocks(cols) - cols))
    return torch.matmul(values.transpose(1, 2), padded)[..., :cols]


def trees_read_in_place(
    heads: int, kv_heads: int, head_dim: int, device: torch.device | str = "cpu", trials: int = 24
) -> bool:
    """Whether tree rows read in place (the module docstring) get, bit for bit, what their one-token
    passes get with this machine's matmul kernel: random trees after random cache lengths, every
    row compared in fp32. A property of the kernel, so the native backend checks it once per
    machine and gathers where it fails."""
    generator = torch.Generator().manual_seed(0)

    def draw(high: int, low: int = 0) -> int:
        return int(torch.randint(low, high, (1,), generator=generator))

    def cache(keys: torch.Tensor, values: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
        k = torch.zeros(kv_heads, capacity, head_dim, device=device)
        v = torch.zeros(kv_heads, capacity, head_dim + 1, device=device)
        v[..., head_dim] = 1
        k[:, : keys.shape[1]], v[:, : keys.shape[1], :head_dim] = keys, values
        return k, v

    def attend(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, mask: torch.Tensor | None
    ) -> torch.Tensor:
        out = torch.empty_like(q)
        for group in row_groups(start, q.shape[1], mask, device, in_place=True):
            out[:, group.rows] = row_invariant_attention(q[:, group.rows], *group_keys(k, v, group), group.hidden)
        return out

    for _ in range(trials):
        start, nodes = draw(3 * KEY_CHUNK), draw(17, 2)
        parents = [-1] + [draw(i, -1) for i in range(1, nodes)]  # nodes under the root, parents first
        n, capacity = nodes + 1, (start + nodes + 1 + 2 * KEY_CHUNK) // KEY_CHUNK * KEY_CHUNK
        paths = [[0]] + [[0] + [a + 1 for a in ancestors(node, parents)] for node in range(nodes)]  # tree slots
        mask = torch.cat([torch.ones(n, start, dtype=torch.bool), tree_mask(parents)], dim=1).to(device)
        keys = torch.randn(kv_heads, start + n, head_dim, generator=generator).to(device)
        values = torch.randn(kv_heads, start + n, head_dim, generator=generator).to(device)
        q = torch.randn(heads, n, head_dim, generator=generator).to(device)
        rows = attend(q, *cache(keys, values, capacity), start, mask)
        for row, path in enumerate(paths):
            order = list(range(start)) + [start + slot for slot in path]
            alone = attend(
                q[:, row : row + 1], *cache(keys[:, order], values[:, order], capacity), len(order) - 1, None
            )
            if not torch.equal(rows[:, row : row + 1], alone):
                return False
    return True
