"""Row-invariant attention: a row of a chain or tree pass gets, bit for bit, what a one-token pass
at its position gets once its path is the cache, in fp32 (no rounding to hide a changed sum)."""

import pytest
import torch

from quickdraft.models.row_attention import (
    KEY_CHUNK,
    group_keys,
    row_groups,
    row_invariant_attention,
    trees_read_in_place,
)
from quickdraft.tree import ancestors, tree_mask

HEADS, KV_HEADS, DIM, CAPACITY = 4, 2, 16, 320


def cache_of(keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A layer of a row-invariant cache holding these entries [KV, n, D]: zeros after them, values
    with their ones column."""
    k = torch.zeros(KV_HEADS, CAPACITY, DIM)
    v = torch.zeros(KV_HEADS, CAPACITY, DIM + 1)
    v[..., DIM] = 1
    k[:, : keys.shape[1]], v[:, : keys.shape[1], :DIM] = keys, values
    return k, v


def attend(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    start: int,
    mask: torch.Tensor | None,
    in_place: bool = False,
) -> torch.Tensor:
    """q [H, n, D] of a pass after `start` cached entries -> [H, n, D], as the native backend runs it."""
    out = torch.empty_like(q)
    for group in row_groups(start, q.shape[1], mask, in_place=in_place):
        out[:, group.rows] = row_invariant_attention(q[:, group.rows], *group_keys(keys, values, group), group.hidden)
    return out


def one_token(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, path: list[int]) -> torch.Tensor:
    """The row q [H, 1, D] of a one-token pass whose cache holds the entries at `path`, in order."""
    k, v = cache_of(keys[:, path], values[:, path])
    return attend(q, k, v, len(path) - 1, None)


CROSSING = [KEY_CHUNK - 3, KEY_CHUNK - 2, KEY_CHUNK - 1, KEY_CHUNK, 2 * KEY_CHUNK - 1]  # trees that cross a chunk edge


IN_PLACE = trees_read_in_place(HEADS, KV_HEADS, DIM)  # this machine's kernel allows trees read in place


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("start", [5, 40, 190] + CROSSING)
def test_each_tree_row_equals_its_one_token_pass(start, in_place):
    if in_place and not IN_PLACE:
        pytest.skip("this machine's matmul kernel does not keep trees read in place exact (the backend gathers)")
    torch.manual_seed(start)
    parents = [-1, -1, 0, 0, 2, 4, 1, 5]  # bushy, depth 5
    n = len(parents) + 1  # the root and the nodes
    keys, values = torch.randn(KV_HEADS, start + n, DIM), torch.randn(KV_HEADS, start + n, DIM)
    q = torch.randn(HEADS, n, DIM)
    mask = torch.cat([torch.ones(n, start, dtype=torch.bool), tree_mask(parents)], dim=1)  # [n, start + n]
    rows = attend(q, *cache_of(keys, values), start, mask, in_place)
    for row in range(n):
        path = list(range(start + 1)) + [start + 1 + a for a in (ancestors(row - 1, parents) if row else [])]
        assert torch.equal(rows[:, row : row + 1], one_token(q[:, row : row + 1], keys, values, path)), row


@pytest.mark.parametrize("start", [0, 3, 250] + CROSSING)
def test_each_chain_row_equals_its_one_token_pass(start):
    torch.manual_seed(start)
    n = 9
    keys, values = torch.randn(KV_HEADS, start + n, DIM), torch.randn(KV_HEADS, start + n, DIM)
    q = torch.randn(HEADS, n, DIM)
    rows = attend(q, *cache_of(keys, values), start, None)
    for row in range(n):
        alone = one_token(q[:, row : row + 1], keys, values, list(range(start + row + 1)))
        assert torch.equal(rows[:, row : row + 1], alone), row


def test_attention_is_softmax_attention():
    torch.manual_seed(0)
    start, n = 70, 3
    keys, values = torch.randn(KV_HEADS, start + n, DIM), torch.randn(KV_HEADS, start + n, DIM)
    q = torch.randn(HEADS, n, DIM)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q[None],
        keys[None],
        values[None],
        attn_mask=torch.ones(n, start + n, dtype=torch.bool).tril(start)[None, None],
        enable_gqa=True,
    )[0]
    assert torch.allclose(attend(q, *cache_of(keys, values), start, None), expected, atol=1e-5)


def test_a_tree_inside_one_chunk_is_one_group_and_a_crossing_one_gathers_deep_rows_alone():
    parents = [-1, -1, 1, 2]  # two children of the root; the second has a chain of two below it
    n = len(parents) + 1

    def mask(start: int) -> torch.Tensor:  # [n, start + n]: the prefix, then the tree
        return torch.cat([torch.ones(n, start, dtype=torch.bool), tree_mask(parents)], dim=1)

    inside = row_groups(10, n, mask(10))
    assert len(inside) == 1 and inside[0].tail_index.shape == (n, KEY_CHUNK) and inside[0].prefix_index is None
    crossing = row_groups(KEY_CHUNK - 2, n, mask(KEY_CHUNK - 2))  # depth 2 and 3 rows sit in the next chunk,
    alone = [g for g in crossing if g.prefix_index is not None]  # and their chunks before it skip the sibling
    assert [g.rows.tolist() for g in alone] == [[3], [4]] and all(g.prefix == KEY_CHUNK for g in alone)
    assert sorted(sum((g.rows.tolist() for g in crossing), [])) == list(range(n))
    chain = row_groups(KEY_CHUNK - 2, 5, None)  # a chain reads the cache in place, one group per chunk
    assert [(g.rows, g.prefix, g.tail_index) for g in chain] == [(slice(0, 2), 0, None), (slice(2, 5), KEY_CHUNK, None)]


def test_trees_read_in_place_are_one_group_of_whole_chunks_and_deep_rows_of_a_crossing_tree_gather():
    parents = [-1, -1, 1, 2]  # two children of the root; the second has a chain of two below it
    n = len(parents) + 1

    def mask(start: int) -> torch.Tensor:  # [n, start + n]: the prefix, then the tree
        return torch.cat([torch.ones(n, start, dtype=torch.bool), tree_mask(parents)], dim=1)

    (inside,) = row_groups(10, n, mask(10), in_place=True)
    assert inside.tail_index is None and inside.prefix == 0 and inside.tail == KEY_CHUNK
    # Row 1 (the first child) sees slots 0..10 and 11, not its sibling at 12 nor what follows.
    hidden = inside.hidden[:, 0, :]  # [tail, m]
    assert not hidden[:12, 1].any() and hidden[12:, 1].all()
    # The second child's chain (rows 3 and 4) skips slot 11, the first child's.
    assert hidden[11, 3] and hidden[11, 4] and not hidden[12, 4] and not hidden[14, 4]
    crossing = row_groups(KEY_CHUNK - 2, n, mask(KEY_CHUNK - 2), in_place=True)
    shared = [g for g in crossing if g.prefix_index is None]
    assert len(shared) == 1 and shared[0].rows.tolist() == [0, 1, 2] and shared[0].tail == 2 * KEY_CHUNK
    assert [g.rows.tolist() for g in crossing if g.prefix_index is not None] == [[3], [4]]
