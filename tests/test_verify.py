"""The rejection sampler alone, against hand-computed p and q."""

import torch

from quickdraft.sampling import SamplingParams
from quickdraft.verify import residual_distribution, verify, verify_greedy, verify_stochastic

from stats_util import chi_square_p_value


def logits_of(rows):
    return torch.tensor(rows, dtype=torch.float32).log()


def test_greedy_accepts_matching_prefix_and_recovers_argmax():
    draft = torch.tensor([5, 9, 2])
    argmax = [5, 9, 7, 3]
    logits = torch.nn.functional.one_hot(torch.tensor(argmax), 10).float()
    verdict = verify_greedy(draft, logits)
    assert (verdict.accepted, verdict.next_token, verdict.bonus) == (2, 7, False)


def test_greedy_all_accepted_gives_bonus():
    draft = torch.tensor([5, 9])
    logits = torch.nn.functional.one_hot(torch.tensor([5, 9, 4]), 10).float()
    verdict = verify_greedy(draft, logits)
    assert (verdict.accepted, verdict.next_token, verdict.bonus) == (2, 4, True)


def test_greedy_with_no_draft_is_plain_decoding():
    logits = torch.tensor([[0.0, 2.0, 1.0]])
    verdict = verify(torch.tensor([], dtype=torch.long), None, logits, SamplingParams(), torch.Generator())
    assert (verdict.accepted, verdict.next_token) == (0, 1)


def test_residual_is_normalised_positive_part():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.2, 0.6, 0.0, 0.2])
    # max(0, p - q) = [0.3, 0, 0.2, 0] -> normalised [0.6, 0, 0.4, 0]
    assert torch.allclose(residual_distribution(p, q), torch.tensor([0.6, 0.0, 0.4, 0.0]))


def test_all_zero_residual_falls_back_to_p():
    p = torch.tensor([0.25, 0.75])
    assert torch.equal(residual_distribution(p, p.clone()), p)


def test_equal_p_and_q_always_accept():
    p = torch.tensor([[0.2, 0.3, 0.5], [0.6, 0.2, 0.2], [0.1, 0.1, 0.8]])
    q = p[:2].clone()
    for seed in range(200):
        verdict = verify_stochastic(torch.tensor([2, 0]), q, p, torch.Generator().manual_seed(seed))
        assert verdict.accepted == 2 and verdict.bonus


def test_draft_token_with_zero_target_mass_is_always_rejected():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.3, 0.3, 0.4]])
    q = torch.tensor([[1.0, 0.0, 0.0]])
    for seed in range(50):
        verdict = verify_stochastic(torch.tensor([0]), q, p, torch.Generator().manual_seed(seed))
        assert verdict.accepted == 0 and verdict.next_token == 1


def test_output_follows_p_when_q_misses_tokens_p_has():
    # q(x) = 0 for x = 2 where p(2) > 0: only the residual can produce token 2.
    p = torch.tensor([0.2, 0.3, 0.5])
    q = torch.tensor([0.7, 0.3, 0.0])
    counts = torch.zeros(3)
    n = 20000
    generator = torch.Generator().manual_seed(0)
    draws = torch.multinomial(q, n, replacement=True, generator=generator)
    bonus_row = torch.tensor([1.0, 0.0, 0.0])
    for x in draws.tolist():
        verdict = verify_stochastic(torch.tensor([x]), q[None], torch.stack([p, bonus_row]), generator)
        token = x if verdict.accepted else verdict.next_token
        counts[token] += 1
    assert chi_square_p_value(counts, p) > 1e-3
    # The acceptance test matters: emitting the draft unchecked would follow q instead.
    assert chi_square_p_value(torch.bincount(draws, minlength=3).float(), p) < 1e-6


def test_one_hot_draft_accepts_with_probability_p():
    # A deterministic drafter (q None = one-hot) is accepted with probability p(x).
    p = torch.tensor([[0.25, 0.75], [0.5, 0.5]])
    logits = p.log()
    params = SamplingParams(temperature=1.0)
    accepted = sum(
        verify(torch.tensor([1]), None, logits, params, torch.Generator().manual_seed(s)).accepted
        for s in range(4000)
    )
    assert abs(accepted / 4000 - 0.75) < 0.03


def test_sampling_filters_apply_to_p_and_q_alike():
    # top_k=1 turns both p and q one-hot on their argmax: a disagreeing draft is always rejected.
    target_logits = torch.tensor([[0.0, 2.0, 1.0], [1.0, 0.0, 0.0]])
    draft_probs = torch.tensor([[0.0, 0.0, 1.0]])
    params = SamplingParams(temperature=1.0, top_k=1)
    for seed in range(50):
        verdict = verify(torch.tensor([2]), draft_probs, target_logits, params, torch.Generator().manual_seed(seed))
        assert verdict.accepted == 0 and verdict.next_token == 1
