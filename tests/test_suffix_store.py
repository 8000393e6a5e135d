"""The suffix store: longest-suffix matches, continuation trees with their counts, eviction."""

from __future__ import annotations

import pytest

from quickdraft.drafters.suffix_store import BYTES_PER_TOKEN, SuffixStore


def store_of(*sequences: list[int], capacity: int | None = None) -> SuffixStore:
    store = SuffixStore(capacity)
    for sequence in sequences:
        store.add(sequence)
    return store


def test_matches_give_the_longest_suffix_at_each_occurrence():
    store = store_of([1, 2, 3, 4], [9, 2, 3, 5], [2, 3, 6])
    starts, lengths = store.matches([7, 1, 2, 3], longest=8)
    found = dict(zip(starts.tolist(), lengths.tolist()))
    # 3 occurs three times: after 1 2 (3 tokens match), after 9 2 (2), after 2 at a sequence's start (2)
    assert sorted(found.values()) == [2, 2, 3]
    assert [store._tokens[s] for s, n in found.items() if n == 3] == [4]
    starts, lengths = store.matches([7, 1, 2, 3], longest=2)  # bounded
    assert lengths.tolist() == [2, 2, 2]


def test_no_match_crosses_a_sequence_end_and_the_context_itself_is_not_a_match():
    store = store_of([5, 6], [7, 8])
    starts, _ = store.matches([6], longest=4)  # 6 ends a sequence: nothing followed it
    assert len(starts) == 0
    own = SuffixStore()
    own.extend([1, 2, 1, 2])
    starts, lengths = own.matches([1, 2, 1, 2], longest=8)
    assert own._tokens[starts].tolist() == [1] and lengths.tolist() == [2]  # [1, 2] at 0..1, followed by 1


def test_tree_counts_are_chances_and_come_best_first():
    # After [1, 2]: 3 4 (three times), 3 5 (once), 6 (once)
    store = store_of([1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6])
    starts, lengths = store.matches([1, 2], longest=4)
    tree = store.tree(starts[lengths >= 2], 2, budget=10, depth=4, least=0.0)
    assert tree.tokens == [3, 4, 6, 5]
    assert tree.parents == [-1, 0, -1, 0]
    assert tree.probs == pytest.approx([0.8, 0.6, 0.2, 0.2])
    assert tree.score == pytest.approx(1.8)
    assert store.tree(starts, 2, budget=10, depth=4, least=0.5).tokens == [3, 4]  # least chance
    assert store.tree(starts, 2, budget=1, depth=4, least=0.0).tokens == [3]  # budget
    assert store.tree(starts, 2, budget=10, depth=1, least=0.0).tokens == [3, 6]  # depth


def test_speculate_sizes_the_tree_by_the_match():
    store = store_of([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    short = store.speculate([0, 3], longest=24, factor=1.0, most=63, depth=24, least=0.1)
    long = store.speculate([1, 2, 3], longest=24, factor=1.0, most=63, depth=24, least=0.1)
    assert (short.match, short.tokens) == (1, [4])  # one matched token: one node
    assert (long.match, long.tokens) == (3, [4, 5, 6])
    doubled = store.speculate([1, 2, 3], longest=24, factor=2.0, most=63, depth=24, least=0.1)
    assert doubled.tokens == [4, 5, 6, 7, 8, 9]
    assert store.speculate([1, 2, 3], longest=24, factor=2.0, most=2, depth=24, least=0.1).tokens == [4, 5]
    assert store.speculate([42], longest=24, factor=1.0, most=63, depth=24, least=0.1).tokens == []


def test_a_more_specific_match_wins_when_it_is_surer():
    # [8, 1] was always followed by 2; [1] alone by 2 or 7
    store = store_of([8, 1, 2], [8, 1, 2], [5, 1, 7], [5, 1, 7], [5, 1, 7])
    tree = store.speculate([8, 1], longest=8, factor=2.0, most=63, depth=4, least=0.1)
    assert (tree.match, tree.tokens, tree.probs) == (2, [2], [1.0])


def test_capacity_drops_the_oldest_and_keeps_memory_flat():
    store = SuffixStore(capacity=200)
    sizes = []
    for i in range(10_000):
        store.add([1000 + i % 97, i % 13, (i * 7) % 31, 5000 + i])  # the last token is unique to sequence i
        sizes.append(store.nbytes)
        assert store.tokens_held <= 200
    assert max(sizes[5000:]) <= max(sizes[:1000])  # flat once full
    assert max(sizes) <= BYTES_PER_TOKEN * 200 + 4096  # the bound memory reports (and a first array)
    assert len(store.matches([5000 + 9999 - 1], 4)[0]) == 0  # its sequence is the last: nothing after it
    assert len(store.matches([(9990 * 7) % 31], 4)[0]) > 0  # recent sequences are there
    old = (0 * 7) % 31, 5000  # the first sequence's last two tokens: long gone
    assert len(store.matches([old[0], old[1]], 4)[0]) == 0 and 5000 not in store._where


def test_a_sequence_longer_than_the_capacity_keeps_its_end_and_zero_keeps_nothing():
    store = SuffixStore(capacity=4)
    store.add([1, 2, 3, 4, 5, 6])
    assert store.tokens_held == 4 and store._tokens[:3].tolist() == [4, 5, 6]
    empty = SuffixStore(capacity=0)
    empty.add([1, 2, 3])
    assert empty.tokens_held == 0 and len(empty.matches([1], 4)[0]) == 0
    with pytest.raises(ValueError):
        SuffixStore(capacity=-1)
