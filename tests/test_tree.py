import torch

from quickdraft.tree import ancestors, chain_parents, children, depths, pass_layout, tree_mask, trie_from_paths


def test_known_tree():
    parents = [-1, 0, -1, 1, 0]  # root -> a(0) -> b(1) -> d(3); a -> e(4); root -> c(2)
    assert depths(parents) == [1, 2, 1, 3, 2]
    assert ancestors(3, parents) == [0, 1, 3]
    assert children(parents) == [[0, 2], [1, 4], [3], [], [], []]
    mask = tree_mask(parents)
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],  # root
            [1, 1, 0, 0, 0, 0],  # a
            [1, 1, 1, 0, 0, 0],  # b
            [1, 0, 0, 1, 0, 0],  # c
            [1, 1, 1, 0, 1, 0],  # d
            [1, 1, 0, 0, 0, 1],  # e
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask, expected)


def test_chain_is_causal():
    assert torch.equal(tree_mask(chain_parents(4)), torch.ones(5, 5, dtype=torch.bool).tril())
    assert depths(chain_parents(3)) == [1, 2, 3]


def test_trie_merges_shared_prefixes():
    tokens, parents = trie_from_paths([[5, 6, 7], [5, 6, 8], [9], [5, 2]])
    assert tokens == [5, 6, 7, 8, 9, 2]
    assert parents == [-1, 0, 1, 1, -1, 0]


def test_pass_layout_puts_aux_after_tree_and_hides_tree_from_aux():
    aux_mask = torch.tensor([[1, 0], [1, 1]], dtype=torch.bool)
    mask, offsets = pass_layout([-1, 0], [1, 2], aux_mask)
    assert offsets == [0, 1, 2, 1, 2]
    assert mask[3].tolist() == [True, False, False, True, False]
    assert mask[4].tolist() == [True, False, False, True, True]
    assert not mask[1:3, 3:].any()
