"""Growing draft trees from a head's confidence (EAGLE-2's expand and rerank)."""

import math

import pytest
import torch

from quickdraft.drafters.head_tree import (
    TreeShape,
    draft_tree,
    grow_tree,
    keep_most_confident,
    merge_chain,
    tilted,
    tree_shape_for,
)
from quickdraft.errors import QuickdraftError
from quickdraft.noise import gumbel_row
from quickdraft.sampling import SamplingParams, gumbel_pick, logits_to_probs
from quickdraft.tree import depths


def logp(*probs):
    return torch.tensor(probs).log()


VOCAB = 6


def children_logp(path: tuple[int, ...]) -> torch.Tensor:
    """A made-up head's log-probs [VOCAB] of the token after `path` (fixed per path)."""
    generator = torch.Generator().manual_seed(hash(path) % 2**31)
    return torch.log_softmax(3 * torch.randn(VOCAB, generator=generator), dim=-1)


def path_of(node, tokens, parents):
    path = []
    while node >= 0:
        path.append(tokens[node])
        node = parents[node]
    return tuple(path[::-1])


def path_head(rows: list[int]):
    """An Expand over children_logp that counts the head rows it is asked for in `rows`."""

    def expand(frontier, tokens, parents):
        rows.append(len(frontier))
        return torch.stack([children_logp(path_of(n, tokens, parents)) for n in frontier])

    return expand


def kept(first, expand, shape):
    """The tree a head drafts with `shape`, in the head's own ids (an identity vocabulary)."""
    tree = draft_tree(first, expand, shape, torch.arange(first.shape[-1]))
    return tree.tokens, tree.parents


def test_rerank_keeps_the_most_confident_nodes_as_a_tree():
    # root -> a (0.6) -> c (0.6 * 0.9); root -> b (0.3) -> d (0.3 * 0.5)
    tokens, parents = [10, 11, 12, 13], [-1, -1, 0, 1]
    scores = [math.log(0.6), math.log(0.3), math.log(0.54), math.log(0.15)]
    assert keep_most_confident(tokens, parents, scores, 3)[:2] == ([10, 11, 12], [-1, -1, 0])
    assert keep_most_confident(tokens, parents, scores, 2)[:2] == ([10, 12], [-1, 0])  # b (0.3) < c (0.54)


def test_grow_expands_the_most_confident_frontier_only():
    calls = []

    def expand(frontier, tokens, parents):
        calls.append([tokens[n] for n in frontier])
        return torch.stack([logp(0.7, 0.2, 0.1)] * len(frontier))

    first = logp(0.5, 0.3, 0.2)
    tokens, parents = kept(first, expand, TreeShape(depth=3, top_k=2, nodes=5))
    assert calls[0] == [0, 1]  # level 1: tokens 0 (0.5) and 1 (0.3)
    assert calls[1] == [0, 0]  # level 2's best: 0 -> 0 (0.35) and 1 -> 0 (0.21); 0 -> 1 is 0.10
    # Kept: 0 (.5), 1 (.3), 0-0 (.35), 0-0-0 (.245), 1-0 (.21)
    assert sorted(zip(depths(parents), tokens)) == [(1, 0), (1, 1), (2, 0), (2, 0), (3, 0)]
    assert all(p < i for i, p in enumerate(parents))


def test_one_level_is_the_top_k_of_the_first_distribution():
    tokens, parents = kept(logp(0.1, 0.6, 0.3), lambda *a: pytest.fail("no expansion"), TreeShape(1, 2, 8))
    assert (tokens, parents) == ([1, 2], [-1, -1])


def test_bad_tree_shapes_are_refused():
    for bad in ((0, 4, 16), (3, 0, 16), (3, 4, 0)):
        with pytest.raises(QuickdraftError, match=">= 1"):
            TreeShape(*bad)


def test_static_tree_has_a_fixed_shape_filled_with_the_ranked_candidates():
    from quickdraft.drafters.head_tree import static_shape

    shape = TreeShape(depth=3, top_k=2, nodes=5, kind="static")
    ranks, parents = static_shape(shape)
    # Prior 0.6 / 0.15 per rank: paths 0 (.6), 0-0 (.36), 0-0-0 (.216), 1 (.15), 0-1 (.09)
    assert sorted(zip(depths(parents), ranks)) == [(1, 0), (1, 1), (2, 0), (2, 1), (3, 0)]
    confident, unsure = logp(0.1, 0.2, 0.7), logp(0.5, 0.3, 0.2)

    def expand(frontier, tokens, parents_so_far):
        return torch.stack([unsure if tokens[n] == 2 else confident for n in frontier])

    tokens, tree = kept(logp(0.1, 0.6, 0.3), expand, shape)
    assert tree == parents  # the same shape whatever the head says
    for node, (rank, parent) in enumerate(zip(ranks, parents)):
        source = logp(0.1, 0.6, 0.3) if parent < 0 else (unsure if tokens[parent] == 2 else confident)
        assert tokens[node] == int(source.topk(2).indices[rank])
    with pytest.raises(QuickdraftError, match="unknown tree"):
        TreeShape(3, kind="bushy")


def test_frontier_nodes_that_cannot_be_kept_are_not_expanded_and_the_tree_is_unchanged():
    # A node's children depend on its path; the full tree reranked is what a pruned grow keeps.
    saved = 0
    for trial in range(60):
        rows = []
        expand = path_head(rows)

        depth, top_k, nodes = 2 + trial % 4, 1 + trial % 3, 1 + trial % 7
        first = children_logp(())
        full = grow_tree(first, expand, TreeShape(depth, top_k, nodes=10**6))[:2]
        full_rows = sum(rows)
        scores = [
            sum(children_logp(path_of(n, *full)[:i])[t] for i, t in enumerate(path_of(n, *full))).item()
            for n in range(len(full[0]))
        ]
        rows.clear()
        pruned = kept(first, expand, TreeShape(depth, top_k, nodes))
        assert pruned == keep_most_confident(*full, scores, nodes)[:2], trial
        assert sum(rows) <= full_rows
        saved += full_rows - sum(rows)
    assert saved > 0


def test_with_pass_costs_the_tree_keeps_the_nodes_that_pay_for_their_rows():
    def expand(frontier, tokens, parents):
        return torch.stack([logp(0.9, 0.05, 0.05)] * len(frontier))

    first = logp(0.8, 0.1, 0.1)
    steps = ((1, 10.0), (2, 12.0), (3, 14.0), (4, 14.0), (5, 19.0), (8, 20.0))  # four-row steps
    # Paths: .8, .72, .648, then .1, .1: three nodes (four rows) pay best.
    tokens, parents = kept(first, expand, TreeShape(depth=4, top_k=3, nodes=8, pass_ms=steps))
    assert (tokens, parents) == ([0, 0, 0], [-1, 0, 1])
    flat = tuple((n, 10.0) for n in (1, 2, 4, 8))
    assert len(kept(first, expand, TreeShape(depth=4, top_k=3, nodes=8, pass_ms=flat))[0]) == 7  # 8 rows, timed
    unsure = logp(0.05, 0.05, 0.9)[:2]  # the head's best guess has 5%: no draft pays
    assert kept(unsure, expand, TreeShape(depth=2, top_k=2, nodes=4, pass_ms=steps)) == ([], [])


def test_a_chain_shares_the_nodes_it_follows_and_keeps_the_higher_score():
    # root -> 5 (.6) -> 7 (.3); root -> 6 (.2). Chain 5, 8, 9 at .5, .25, .125.
    tokens, parents, scores = [5, 6, 7], [-1, -1, 0], [math.log(0.6), math.log(0.2), math.log(0.3)]
    chain, chain_scores = [5, 8, 9], [math.log(0.5), math.log(0.25), math.log(0.125)]
    merged = merge_chain(tokens, parents, scores, chain, chain_scores)
    assert merged[0] == [5, 6, 7, 8, 9] and merged[1] == [-1, -1, 0, 0, 3] and merged[3] == [0, 3, 4]
    assert [round(math.exp(s), 3) for s in merged[2]] == [0.6, 0.2, 0.3, 0.25, 0.125]
    higher = merge_chain(tokens, parents, scores, [5, 7], [math.log(0.9), math.log(0.8)])
    assert higher[:2] == (tokens, parents) and higher[3] == [0, 2]
    assert [round(math.exp(s), 3) for s in higher[2]] == [0.9, 0.2, 0.8]
    assert merge_chain(tokens, parents, scores, [], []) == (tokens, parents, scores, [])


def test_a_branch_competes_with_the_head_for_the_rows():
    def expand(frontier, tokens, parents):
        return torch.stack([logp(0.5, 0.3, 0.2)] * len(frontier))

    first = logp(0.4, 0.35, 0.25)
    vocab = torch.tensor([10, 11, 12])  # head ids -> target ids
    shape = TreeShape(depth=3, top_k=2, nodes=3)
    head_only = draft_tree(first, expand, shape, vocab)
    assert (head_only.tokens, head_only.parents) == ([10, 11, 10], [-1, -1, 0])  # .4, .35, .2
    assert [round(p, 3) for p in head_only.head] == [0.4, 0.35, 0.2] and head_only.chain == []
    sure = [20, 21, 22], [math.log(0.9), math.log(0.81), math.log(0.729)]
    # A fixed size: the three most confident nodes of both, here the whole branch.
    tree = draft_tree(first, expand, shape, vocab, sure)
    assert (tree.tokens, tree.parents, tree.head, tree.chain) == ([20, 21, 22], [-1, 0, 1], [0.0] * 3, [0, 1, 2])
    unsure = [20, 21], [math.log(0.1), math.log(0.01)]
    assert draft_tree(first, expand, shape, vocab, unsure) == head_only
    # Sized by cost: the branch's rows come on top of the head's best `nodes`, kept where they pay.
    flat = tuple((n, 10.0) for n in (1, 2, 4, 8))
    tree = draft_tree(first, expand, TreeShape(3, 2, 3, pass_ms=flat), vocab, sure)
    assert sorted(tree.tokens) == [10, 10, 11, 20, 21, 22]
    steps = ((1, 10.0), (2, 11.0), (4, 12.0), (5, 30.0), (8, 31.0))
    tree = draft_tree(first, expand, TreeShape(3, 2, 3, pass_ms=steps), vocab, sure)
    assert (tree.tokens, tree.parents) == ([20, 21, 22], [-1, 0, 1])
    # A head proved overconfident (half its estimate): sizing sees half its confidence.
    scaled = draft_tree(first, expand, TreeShape(3, 2, 3, scale=math.log(0.5)), vocab)
    assert [round(p, 3) for p in scaled.head] == [0.2, 0.175, 0.1]
    costs = ((1, 10.0), (2, 14.0), (4, 16.0))
    assert len(draft_tree(first, expand, TreeShape(3, 2, 3, pass_ms=costs), vocab).tokens) == 3  # 1.95 / 16 ms > 1 / 10
    halved = TreeShape(3, 2, 3, pass_ms=costs, scale=math.log(0.5))
    assert draft_tree(first, expand, halved, vocab).tokens == []  # 1.475 / 16 is not


def test_the_head_rests_only_when_none_of_its_nodes_could_pay():
    from quickdraft.drafters.head_tree import chain_draft, head_cannot_pay

    steps = {1: 10.0, 2: 11.0, 4: 12.0, 5: 30.0, 8: 31.0}
    sure = [math.log(0.95), math.log(0.9), math.log(0.85)]
    # A head proved weak (each path at most 0.2) beside a sure copy: the copy's three rows pay, the
    # head's could only come after them, at four rows' price or more.
    assert head_cannot_pay(sure, math.log(0.2), 4, steps) == 3
    assert head_cannot_pay(sure, math.log(0.9), 4, steps) is None  # the head might beat the copy
    assert head_cannot_pay([], math.log(0.02), 4, steps) == 0  # nothing pays: a plain pass, no drafting
    assert head_cannot_pay([], math.log(0.5), 4, steps) is None
    # What the head's trees got (0.5 tokens of 3 rows a step) against its measured drafting: at
    # 5 ms a step it does not pay (1.5 tokens in 12 + 5 ms, plain 1 in 10), at 0 ms it might.
    assert head_cannot_pay(sure, math.log(0.9), 4, steps, 5.0, (0.5, 3.0)) == 3  # the copy alone
    assert head_cannot_pay([], math.log(0.5), 4, steps, 5.0, (0.5, 3.0)) == 0
    assert head_cannot_pay([], math.log(0.5), 4, steps, 0.0, (0.5, 3.0)) is None
    assert head_cannot_pay([], math.log(0.5), 4, steps, 40.0) == 0  # no tree pays 40 ms more
    # Against the full drafting it stands in for: a head whose nodes score under the bound.
    vocab = torch.tensor([10, 11, 12])

    def expand(frontier, tokens, parents):
        return torch.stack([logp(0.9, 0.05, 0.05)] * len(frontier))

    tree = draft_tree(
        logp(0.9, 0.05, 0.05),
        expand,
        TreeShape(3, 2, 4, pass_ms=tuple(steps.items()), scale=math.log(0.2)),
        vocab,
        ([20, 21, 22], sure),
    )
    alone = chain_draft([20, 21, 22], 3)
    assert (
        (tree.tokens, tree.parents, tree.chain)
        == (alone.tokens, alone.parents, alone.chain)
        == ([20, 21, 22], [-1, 0, 1], [0, 1, 2])
    )


def test_frontier_nodes_whose_descendants_could_not_pay_are_not_expanded_and_the_tree_is_unchanged():
    # Sized by cost (and the head's scale), a pruned grow keeps what the full tree, sized, keeps.
    import random

    from quickdraft.analysis import best_tree_size

    rng = random.Random(0)
    saved = 0
    for trial in range(60):
        rows = []
        expand = path_head(rows)

        depth, top_k, nodes = 2 + trial % 4, 1 + trial % 3, 1 + trial % 7
        costs = tuple((n, c) for n, c in zip((1, 2, 4, 5, 8, 16), sorted(rng.uniform(5, 30) for _ in range(6))))
        scale = math.log(rng.uniform(0.2, 1.0))
        first = children_logp(())
        tokens, parents, scores = grow_tree(first, expand, TreeShape(depth, top_k, nodes=10**6))
        full_rows = sum(rows)
        tokens, parents, scores = keep_most_confident(tokens, parents, scores, nodes)
        scores = [s + scale for s in scores]
        size = best_tree_size([math.exp(s) for s in sorted(scores, reverse=True)], dict(costs))
        expected = keep_most_confident(tokens, parents, scores, size)[:2]
        rows.clear()
        grow_tree(first, expand, TreeShape(depth, top_k, nodes))  # pruned by the `nodes` floor alone
        floor_rows = sum(rows)
        rows.clear()
        tree = draft_tree(
            first, expand, TreeShape(depth, top_k, nodes, pass_ms=costs, scale=scale), torch.arange(VOCAB)
        )
        assert (tree.tokens, tree.parents) == expected, trial
        assert sum(rows) <= floor_rows <= full_rows
        saved += floor_rows - sum(rows)
    assert saved > 0  # rows the costs spared beyond the floor


def test_a_larger_tree_is_drafted_wider_and_deeper_within_bounds():
    shapes = [tree_shape_for(nodes) for nodes in range(1, 257)]
    assert all(5 <= depth <= 8 and 4 <= top_k <= 16 for depth, top_k in shapes)
    for grows in zip(*shapes):  # neither depth nor width shrinks as the tree grows
        assert list(grows) == sorted(grows)
    # The sizes measured on Spec-Bench (docs/bench/heads.md): small trees keep SGLang's 5 x 4.
    assert [tree_shape_for(nodes) for nodes in (4, 16, 64)] == [(5, 4), (6, 8), (8, 16)]
    rows: list[int] = []
    tokens, parents = kept(children_logp(()), path_head(rows), TreeShape(*tree_shape_for(64), nodes=64))
    assert len(tokens) == 64 and max(depths(parents)) > 5 and max(rows) == 16


def test_under_gumbel_max_a_heads_guesses_are_ordered_by_its_tilted_distribution():
    """Greedy: the head's own log-probs. Gumbel-max: a distribution whose first guess is the
    target's pick at that position were the target's p the head's q (the user's temperature,
    top-k and top-p applied), over the draft vocabulary's target ids."""
    generator = torch.Generator().manual_seed(0)
    full, vocab = 20, torch.tensor([0, 3, 4, 7, 9, 12, 15, 19])  # a draft vocabulary of 8 target ids
    logits = 2 * torch.randn(3, len(vocab), generator=generator)  # [F, V'] three frontier nodes
    greedy = tilted(logits, vocab, SamplingParams(0.0), None)
    torch.testing.assert_close(greedy, torch.log_softmax(logits, dim=-1))
    picks = set()
    for params in (SamplingParams(1.0), SamplingParams(0.7, top_k=3), SamplingParams(1.3, top_p=0.6)):
        q = logits_to_probs(logits, params)  # [F, V']
        for position in range(20):
            noise = gumbel_row(5, position, full)  # [V] the target's noise at one position
            guesses = tilted(logits, vocab, params, noise)  # [F, V']
            torch.testing.assert_close(guesses.exp().sum(-1), torch.ones(3))
            for row in range(3):
                first = int(guesses[row].argmax())
                picks.add(first)
                assert first == gumbel_pick(q[row], noise[vocab])  # the Gumbel-max sample of q under this noise
                assert q[row, first] > 0  # never a token the filters removed
                order = (q[row].log() + noise[vocab]).argsort(descending=True)
                ranked = guesses[row][order][: int((q[row] > 0).sum())]  # the tokens the filters kept, in order
                assert ranked.diff().le(0).all() and ranked.isfinite().all()  # every rank, not only the first
    assert len(picks) > 3  # the noise moves the first guess off the head's argmax


def test_a_resting_head_checks_again_ever_later_while_it_does_not_pay():
    from quickdraft.drafters.tree_record import MOST_REST, RECHECK_EVERY, TreeRecord

    record = TreeRecord()
    limits = []
    for _ in range(6):
        while record.may_rest():
            record.rested()
        limits.append(record.idle + 1)  # the step that checks
        record.checks()
        record.idle = 0  # it drafted, and did not pay: then rests again
    assert limits == [RECHECK_EVERY, 16, 32, MOST_REST, MOST_REST, MOST_REST]
    record.pays()
    assert record.rest == RECHECK_EVERY
