"""Lookahead decoding: the Jacobi window's layout, the n-gram pool, and losslessness."""

import pytest
import torch
from conftest import loaded
from spec_util import assert_speculated

from quickdraft import Decoder, QuickdraftError
from quickdraft.drafters.drafter import DraftRequest, StepOutcome
from quickdraft.drafters.lookahead import LookaheadDrafter, window_layout
from quickdraft.sampling import SamplingParams


def test_window_layout_for_two_levels_of_three():
    mask, offsets = window_layout(window=3, levels=2)
    # level-major: (0,0) (0,1) (0,2) (1,0) (1,1) (1,2)
    assert offsets == [1, 2, 3, 2, 3, 4]
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [1, 0, 0, 1, 0, 0],  # (1,0): its column below it, itself
            [1, 1, 0, 0, 1, 0],  # (1,1): level 0 column 0, its column, itself
            [1, 1, 1, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask, expected)


def test_each_window_token_sees_one_guess_per_earlier_position():
    mask, offsets = window_layout(window=4, levels=3)
    for row in range(len(offsets)):
        seen = [offsets[col] for col in range(len(offsets)) if mask[row, col]]
        assert sorted(seen) == list(range(1, offsets[row] + 1))


def test_pool_collects_ngrams_and_window_slides():
    drafter = LookaheadDrafter(window=2, ngram=3, candidates=2)
    state = drafter.begin([10, 11, 12, 13], None)
    assert state.levels == [[10, 11], [12, 13]]
    logits = torch.nn.functional.one_hot(torch.tensor([0, 1, 20, 21]), 32).float()  # [(N-1)*W, V]
    drafter.update(state, StepOutcome([10, 11, 12, 13, 5], (), None, logits))
    assert state.levels == [[12, 13], [20, 21]]
    assert list(state.pool[10]) == [(12, 20)] and list(state.pool[11]) == [(13, 21)]
    [draft] = drafter.propose([DraftRequest(state, [5, 10], 2, SamplingParams(), torch.Generator())])
    assert draft.tokens == [12, 20] and draft.parents == [-1, 0]
    assert len(draft.aux_tokens) == 4 and draft.aux_mask.shape == (4, 4)
    assert drafter.propose([DraftRequest(state, [5, 10], 1, SamplingParams(), torch.Generator())])[0].tokens == [12]
    other = drafter.begin([1, 2], None)  # the drafter holds no sequence's state: another one starts empty
    assert (
        other.pool == {}
        and drafter.propose([DraftRequest(other, [5, 10], 2, SamplingParams(), torch.Generator())])[0].tokens == []
    )


def test_bad_settings_are_refused():
    with pytest.raises(QuickdraftError, match="lookahead"):
        LookaheadDrafter(window=0)
    with pytest.raises(QuickdraftError, match="lookahead"):
        LookaheadDrafter(ngram=1)


@pytest.mark.speculation
@pytest.mark.parametrize("window, ngram, candidates", [(3, 2, 2), (4, 3, 4), (5, 4, 3)])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_lookahead_greedy_equals_plain(tiny_target, window, ngram, candidates, k):
    plain = Decoder(loaded(tiny_target, "t"), None, "none")
    spec = Decoder(loaded(tiny_target, "t"), None, "lookahead", k, window=window, ngram=ngram, candidates=candidates)
    outputs = []
    for prompt in ([1, 2, 3], [5, 9, 9, 2, 7, 1, 5, 9]):
        out = spec.generate(prompt, max_new_tokens=45)
        assert out.token_ids == plain.generate(prompt, max_new_tokens=45).token_ids
        outputs.append(out)
        # Acceptance by position counts tree depths: one accepted node per depth on the path.
        s = out.stats
        assert sum(s.accepted_by_position) == s.accepted_tokens
        assert len(s.drafted_by_position) <= min(k, ngram - 1)
        assert all(d <= s.target_passes for d in s.drafted_by_position)
        assert all(a <= d for a, d in zip(s.accepted_by_position, s.drafted_by_position))
    assert_speculated(outputs)  # the pool must produce n-grams that get accepted


@pytest.mark.chance
@pytest.mark.speculation
def test_sampled_lookahead_follows_target_after_the_pool_fills():
    # Steps after the first verify pool n-grams as token trees; check the joint of tokens 2 and 3.
    from conftest import tiny_llama
    from stats_util import chi_square_p_value

    from quickdraft.sampling import logits_to_probs

    vocab, runs = 6, 2000
    target = tiny_llama(seed=3, vocab=vocab, init_range=0.25)
    prompt = [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5]  # seeds the window with every token: pool keys cover all
    params = SamplingParams(temperature=1.0)
    with torch.no_grad():
        first = logits_to_probs(target(torch.tensor([prompt])).logits[0, -1], params)  # [V]
        pairs = torch.tensor([[*prompt, a] for a in range(vocab)])
        second = logits_to_probs(target(pairs).logits[:, -1], params)  # [V, V]
        triples = torch.tensor([[*prompt, a, b] for a in range(vocab) for b in range(vocab)])
        third = logits_to_probs(target(triples).logits[:, -1], params).view(vocab, vocab, vocab)
    exact = (first[:, None, None] * second[:, :, None] * third).sum(dim=0)  # [V, V] over tokens 2, 3

    decoder = Decoder(loaded(target, "t"), None, "lookahead", 2, window=6, ngram=3, candidates=4)
    counts = torch.zeros(vocab, vocab)
    with_tree, outputs = 0, []
    for seed in range(runs):
        outputs.append(out := decoder.generate(prompt, max_new_tokens=4, temperature=1.0, seed=seed))
        counts[out.token_ids[1], out.token_ids[2]] += 1
        with_tree += len(out.steps) > 1 and len(out.steps[1].draft_tokens) > 1  # two or more nodes
    assert with_tree > runs // 2, "the test must verify multi-token trees"
    assert_speculated(outputs)
    assert chi_square_p_value(counts, exact) > 1e-3
