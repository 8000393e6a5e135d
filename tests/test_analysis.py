import random

import pytest

from quickdraft.analysis import (
    DEFAULT_TREE_NODES,
    best_k,
    best_tree_size,
    cost_at_threads,
    expected_tokens_per_pass,
    padded_costs,
    pass_cost,
    predicted_speedup,
    speedup_from_steps,
    time_per_token,
    tree_budget,
)


@pytest.mark.parametrize(
    "alpha, k, expected", [(0.5, 4, 1.9375), (0.8, 1, 1.8), (0.0, 8, 1.0), (1.0, 4, 5.0), (0.9, 8, (1 - 0.9**9) / 0.1)]
)
def test_expected_tokens_closed_form(alpha, k, expected):
    assert expected_tokens_per_pass(alpha, k) == pytest.approx(expected)


def test_expected_tokens_is_continuous_at_alpha_one():
    assert expected_tokens_per_pass(0.999999, 6) == pytest.approx(7.0, rel=1e-4)


@pytest.mark.parametrize("alpha, k", [(0.5, 4), (0.7, 8), (0.9, 4), (0.3, 2)])
def test_expected_tokens_matches_monte_carlo(alpha, k):
    rng = random.Random(0)
    passes = 40000
    total = 0
    for _ in range(passes):
        accepted = 0
        while accepted < k and rng.random() < alpha:  # independent acceptances, stop at first rejection
            accepted += 1
        total += accepted + 1  # plus the recovered or bonus token
    assert total / passes == pytest.approx(expected_tokens_per_pass(alpha, k), rel=0.02)


def test_speedup_and_time_per_token():
    # Free drafting and a flat verify cost: speedup is exactly E.
    assert predicted_speedup(0.8, 4, 0.0) == pytest.approx(expected_tokens_per_pass(0.8, 4))
    # Leviathan et al.'s improvement factor (1 - a^(k+1)) / ((1 - a)(kc + 1)).
    assert predicted_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / (0.2 * 1.4))
    assert time_per_token(0.5, 2, t_draft=1.0, t_target=10.0) == pytest.approx(12.0 / 1.75)


def test_best_k_is_the_brute_force_argmax():
    for alpha in (0.3, 0.6, 0.8, 0.95):
        for c in (0.0, 0.05, 0.2):
            ks = range(1, 17)
            brute = max(ks, key=lambda k: predicted_speedup(alpha, k, c, 1 + 0.04 * k))
            assert best_k(alpha, c, 16, lambda k: 1 + 0.04 * k) == brute
    assert best_k(0.95, 0.01, 16) > best_k(0.5, 0.01, 16) > best_k(0.5, 0.3, 16) - 1
    assert best_k(0.2, 0.3, 16) == 1


def test_bad_alpha_is_refused():
    with pytest.raises(ValueError):
        expected_tokens_per_pass(1.5, 4)


def test_the_tree_budget_is_what_a_pass_takes_for_about_the_price_of_one_token():
    gpu = {1: 1.00, 2: 1.00, 4: 1.01, 8: 1.02, 16: 1.04, 32: 1.08, 64: 1.30}  # flat until 32 rows
    assert tree_budget(gpu) == 31  # 32 rows: the root and 31 nodes
    assert tree_budget({n: 1.0 for n in (1, 2, 4, 8, 16, 32, 64)}) == 63
    cpu = {1: 9.6, 2: 16.1, 4: 25.6, 8: 45.8, 16: 86.0}  # llama.cpp here: every row costs
    assert tree_budget(cpu) == DEFAULT_TREE_NODES
    assert tree_budget(None) == tree_budget({}) == DEFAULT_TREE_NODES


def test_pass_cost_reads_measured_sizes_and_interpolates_between_them():
    ms = {1: 10.0, 2: 12.0, 4: 14.0, 8: 30.0}
    assert pass_cost(ms, 2) == 12.0 and pass_cost(ms, 3) == 13.0 and pass_cost(ms, 6) == 22.0
    assert pass_cost(ms, 12) == 46.0  # past the largest: the line through the last two
    assert pass_cost({1: 10.0}, 5) == 10.0


def test_the_tree_size_is_the_most_expected_tokens_per_millisecond():
    confident = [0.9, 0.8, 0.7, 0.6, 0.5]
    flat = {n: 10.0 for n in (1, 2, 4, 8)}  # rows free (a GPU): verify every node
    assert best_tree_size(confident, flat) == 5
    steps = {1: 10.0, 2: 12.0, 3: 14.0, 4: 14.0, 5: 19.0, 8: 20.0}  # int4's four-row steps
    # (1 + .9 + .8 + .7) / 14 = 0.243 at 3 nodes beats (1 + ... + .6) / 19 = 0.211 at 4
    assert best_tree_size(confident, steps) == 3
    assert best_tree_size([0.3, 0.01], steps) == 1  # 1.3 / 12 beats 1 / 10
    assert best_tree_size([0.05, 0.01], steps) == 0  # unsure: a plain pass pays best
    brute = max(range(6), key=lambda n: ((1 + sum(confident[:n])) / pass_cost(steps, n + 1), -n))
    assert best_tree_size(confident, steps) == brute
    assert best_tree_size([], steps) == 0
    rng = random.Random(0)
    for _ in range(200):  # the brute-force argmax (ties: the smaller tree) over random costs and confidences
        ms = {n: c for n, c in zip((1, 2, 3, 4, 6, 8), sorted(rng.uniform(5, 30) for _ in range(6)))}
        ps = sorted((rng.random() for _ in range(rng.randint(0, 8))), reverse=True)
        most = min(len(ps), max(ms) - 1)  # never past the largest pass measured
        brute = max(range(most + 1), key=lambda n: ((1 + sum(ps[:n])) / pass_cost(ms, n + 1), -n))
        assert best_tree_size(ps, ms) == brute
    # Rows past the largest pass measured may cost a second pass (the static backend's fixed rows).
    assert best_tree_size([0.99] * 100, {1: 10.0, 64: 10.0}) == 63


def test_steps_replayed_at_other_pass_costs():
    flat = {1: 10.0, 8: 10.0}
    assert speedup_from_steps([(0, 1)] * 5, flat) == pytest.approx(1.0)  # nothing drafted: plain decoding
    assert speedup_from_steps([(4, 5)] * 3, flat) == pytest.approx(5.0)  # every draft accepted, rows free
    dear = {1: 10.0, 5: 30.0}
    assert speedup_from_steps([(4, 5), (4, 1)], dear) == pytest.approx(6 * 10.0 / 60.0)  # a rejection costs
    assert speedup_from_steps([(4, 5)], flat, draft_ms=2.5) == pytest.approx(50.0 / 20.0)  # drafting costs
    # On i.i.d. steps it agrees with the closed form: K = 2, a = 0.5 gives 1, 2, 3 tokens with 1/2, 1/4, 1/4.
    steps = [(2, 1)] * 2 + [(2, 2)] + [(2, 3)]
    assert speedup_from_steps(steps, {1: 1.0, 3: 1.5}) == pytest.approx(predicted_speedup(0.5, 2, 0.0, 1.5))


def test_pass_costs_extrapolate_over_threads_by_amdahls_law():
    serial, parallel = 20.0, 80.0  # ms that more cores do not shorten, and ms that they divide
    measured = {t: serial + parallel / t for t in (1, 2)}
    assert cost_at_threads(measured, 16) == pytest.approx(serial + parallel / 16)
    assert cost_at_threads({1: 100.0, 2: 100.0}, 16) == pytest.approx(100.0)  # memory-bound: no gain
    # Costs that more than halve (noise) do not make the serial part negative: all of it divides.
    assert cost_at_threads({1: 100.0, 2: 40.0}, 4) == pytest.approx(cost_at_threads({1: 100.0, 2: 40.0}, 2) / 2)
    with pytest.raises(ValueError, match="two thread counts"):
        cost_at_threads({2: 10.0}, 16)


def test_a_pass_never_costs_more_than_a_larger_one_it_could_be_padded_to():
    # A 1-row kernel that scales worse with threads than a 2-row one: the backend pads 1 row to 2.
    assert padded_costs({1: 60.0, 2: 25.0, 4: 40.0, 8: 80.0}) == {1: 25.0, 2: 25.0, 4: 40.0, 8: 80.0}
    rising = {1: 10.0, 2: 12.0, 4: 20.0}
    assert padded_costs(rising) == rising  # costs that grow with rows are left as they are


def test_drafting_pays_only_where_its_tokens_outrun_its_rows_and_its_own_cost():
    from quickdraft.analysis import best_tree_value, drafting_pays

    costs = {1: 10.0, 2: 11.0, 4: 12.0, 8: 20.0}
    assert drafting_pays(1.0, 3.0, 0.0, costs)  # 2 tokens in 12 ms against 1 in 10
    assert not drafting_pays(1.0, 3.0, 13.0, costs)  # 2 in 25 ms
    assert not drafting_pays(0.1, 1.0, 0.0, costs)  # 1.1 in 11 ms: a tie is no gain
    assert best_tree_value([0.9, 0.8, 0.1], costs) == pytest.approx(2.7 / 11.5)  # two nodes: three rows, 11.5 ms
    assert best_tree_value([0.9, 0.8, 0.1], costs, extra_ms=100.0) == pytest.approx(0.1)  # plain passes
