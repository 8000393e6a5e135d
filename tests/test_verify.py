"""The rejection sampler alone, against hand-computed p and q."""

import torch
from stats_util import chi_square_p_value

from quickdraft.sampling import SamplingParams
from quickdraft.verify import residual_distribution, verify, verify_tree


def verify_greedy(draft, logits):
    return verify(draft, None, logits, SamplingParams(), torch.Generator())


def verify_stochastic(draft, q, p, generator):
    """The chain sampler on probabilities: p [K+1, V] as logits at temperature 1."""
    return verify(draft, q, p.log(), SamplingParams(temperature=1.0), generator)


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
        verify(torch.tensor([1]), None, logits, params, torch.Generator().manual_seed(s)).accepted for s in range(4000)
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


# --- trees of deterministic drafts ------------------------------------------------------------


def one_hot_rows(choices, vocab=10):
    return torch.nn.functional.one_hot(torch.tensor(choices), vocab).float()


def test_tree_greedy_follows_the_matching_branch():
    # root -> 5 -> 6, root -> 7 -> 8; target argmax: root 7, after 5: 6, after 6: 1, after 7: 8, after 8: 3
    tokens, parents = [5, 6, 7, 8], [-1, 0, -1, 2]
    logits = one_hot_rows([7, 6, 1, 8, 3])
    verdict = verify_tree(tokens, parents, logits, SamplingParams(), torch.Generator())
    assert verdict.path == (2, 3) and verdict.next_token == 3 and verdict.bonus


def test_tree_greedy_recovers_when_no_child_matches():
    verdict = verify_tree([5, 7], [-1, -1], one_hot_rows([4, 0, 0]), SamplingParams(), torch.Generator())
    assert verdict.path == () and verdict.next_token == 4 and not verdict.bonus


def test_tree_sampling_first_token_follows_p_with_many_siblings():
    # Siblings 0, 1 and a repeated 1: the first output token must still follow p exactly.
    p = torch.tensor([0.5, 0.3, 0.2])
    logits = torch.cat([p.log()[None], torch.zeros(3, 3)])
    params = SamplingParams(temperature=1.0)
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(3)
    for _ in range(6000):
        verdict = verify_tree([0, 1, 1], [-1, -1, -1], logits, params, generator)
        first = [0, 1, 1][verdict.path[0]] if verdict.path else verdict.next_token
        counts[first] += 1
    assert chi_square_p_value(counts, p) > 1e-3
    # Without the residual update (sampling the recovered token from p), token 2 would be rare.
    assert counts[2] > 1000


def test_tree_chain_accepts_like_the_chain_sampler():
    p = torch.tensor([[0.25, 0.75], [0.5, 0.5], [0.9, 0.1]])
    params = SamplingParams(temperature=1.0)
    tree = sum(
        len(verify_tree([1, 0], [-1, 0], p.log(), params, torch.Generator().manual_seed(s)).path) for s in range(4000)
    )
    chain = sum(
        verify(torch.tensor([1, 0]), None, p.log(), params, torch.Generator().manual_seed(s)).accepted
        for s in range(4000)
    )
    expected = 0.75 + 0.75 * 0.5  # E[accepted] = p1 + p1 * p2
    assert abs(tree / 4000 - expected) < 0.04 and abs(chain / 4000 - expected) < 0.04


def test_tree_of_sampled_siblings_follows_p():
    # Two siblings drawn independently from q, each with a child drawn from its own q:
    # the first two output tokens must follow p at the root and p after the first token.
    p_root = torch.tensor([0.5, 0.3, 0.2])
    p_next = torch.tensor([[0.1, 0.1, 0.8], [0.6, 0.2, 0.2], [0.3, 0.3, 0.4]])  # after token 0, 1, 2
    q_root, q_next = torch.tensor([0.2, 0.2, 0.6]), torch.tensor([0.4, 0.4, 0.2])
    params = SamplingParams(temperature=1.0)
    generator = torch.Generator().manual_seed(1)
    pairs = torch.zeros(3, 3)
    for _ in range(8000):
        a, b = torch.multinomial(q_root, 2, replacement=True, generator=generator).tolist()
        c, d = torch.multinomial(q_next, 2, replacement=True, generator=generator).tolist()
        tokens, parents = [a, c, b, d], [-1, 0, -1, 2]
        logits = torch.stack([p_root, p_next[a], torch.ones(3), p_next[b], torch.ones(3)]).log()
        probs = torch.stack([q_root, q_next, q_root, q_next])
        verdict = verify_tree(tokens, parents, logits, params, generator, probs)
        out = [tokens[i] for i in verdict.path] + [verdict.next_token]
        if len(out) >= 2:
            pairs[out[0], out[1]] += 1
        else:  # rejected at the root: the second token would come from p_next in the next pass
            pairs[out[0], torch.multinomial(p_next[out[0]], 1, generator=generator).item()] += 1
    expected = (p_root[:, None] * p_next).flatten()
    assert chi_square_p_value(pairs.flatten(), expected) > 1e-3
