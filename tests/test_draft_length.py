import random
from collections import Counter
from dataclasses import dataclass, replace

import pytest
from conftest import loaded, perturbed_copy
from spec_util import assert_speculated

from quickdraft import Decoder, QuickdraftError
from quickdraft.analysis import time_per_token
from quickdraft.draft_length import AdaptiveK, CostModelK, FixedK, PassCosts, make_draft_length
from quickdraft.stats import StepRecord

PROMPTS = [[1, 2, 3], [5, 9, 9, 2, 7, 1, 5, 9]]


def step(drafted: int, accepted: int, draft_time: float = 0.0, verify_time: float = 0.01) -> StepRecord:
    return StepRecord(
        k=drafted,
        draft_tokens=[0] * drafted,
        accepted=accepted,
        next_token=0,
        bonus=accepted == drafted,
        emitted=[0] * (accepted + 1),
        draft_time=draft_time,
        verify_time=verify_time,
    )


def test_adaptive_grows_after_full_accept_and_shrinks_after_rejection():
    policy = AdaptiveK(4, k_min=2, k_max=7)
    policy.update(step(4, 4))
    assert policy.next_k() == 6
    policy.update(step(6, 6))
    assert policy.next_k() == 7  # capped at k_max
    for _ in range(10):
        policy.update(step(policy.next_k(), 0))
    assert policy.next_k() == 2  # floored at k_min
    policy.update(step(0, 0))  # nothing drafted: no change
    assert policy.next_k() == 2


def test_cost_model_prefers_long_drafts_when_they_pass_and_cost_little():
    # Adapted: plain passes (0 drafted) are in the mix, and a drafter whose drafts never pass now
    # gets K = 0 (no draft), which the old policy could not choose (it answered k_min = 1).
    good = CostModelK(4, k_max=16)
    bad = CostModelK(4, k_max=16)
    for k in (0, 2, 4, 6, 8) * 5:
        good.update(step(k, k, draft_time=0.0005 * k, verify_time=0.030 + 0.001 * k))
        bad.update(step(k, 0, draft_time=0.005 * k, verify_time=0.030 + 0.001 * k))
    assert good.alpha > 0.9 and bad.alpha < 0.2
    assert good.next_k() >= 10
    assert bad.next_k() == 0


def test_cost_model_fits_the_target_cost_line():
    # Adapted: the line goes through per-count medians of several samples (one sample per count is
    # not enough to fit), and one pass in five at 10x its time does not move it.
    policy = CostModelK(3)
    for round_ in range(5):
        for k in (1, 3, 5, 7):
            policy.update(step(k, 1, verify_time=(0.02 + 0.002 * k) * (10 if round_ == 2 else 1)))
    base, slope = policy._target_cost()
    assert base == pytest.approx(0.02) and slope == pytest.approx(0.002)


def test_cost_model_line_resists_a_lightly_sampled_slow_count():
    # Three passes at K = 11, two of them slowed 8x: least squares would tilt the line (its leverage
    # grows with distance); the resistant line keeps the slope the well-sampled counts show.
    policy = CostModelK(5)
    for k in (5, 6) * 24:
        policy.update(step(k, 1, verify_time=0.010 + 0.001 * k))
    for seconds in (0.021, 0.168, 0.168):
        policy.update(step(11, 1, verify_time=seconds))
    base, slope = policy._target_cost()
    assert base == pytest.approx(0.010) and slope == pytest.approx(0.001)


def test_cost_model_scan_stops_past_the_minimum_even_for_a_huge_k_max():
    # The scan over K stops at the first K that does not improve, so a huge k_max costs nothing:
    # the best K comes back, as a scan of only the first 64 candidates finds it.
    from quickdraft.draft_length import _best_drafting_k

    assert _best_drafting_k(0.7, 0.0001, 0.010, 0.001, 1, 10**12) == _best_drafting_k(0.7, 0.0001, 0.010, 0.001, 1, 64)
    policy = make_draft_length("cost", 10**6)
    for k in (0, 4, 8) * 3:
        policy.update(step(k, k // 2, draft_time=0.0001 * k, verify_time=0.010 + 0.001 * k))
    assert 0 < policy.next_k() < 50


def test_generations_of_one_decoder_share_what_passes_cost():
    # The second generation starts from the first one's timings: where drafting does not pay it
    # does not draft at its first step (a fresh policy would try its starting K first).
    costs = PassCosts()
    first = make_draft_length("cost", 8, costs=costs)
    simulate(first, Profile(0.2, 0.010, 0.005), 100)
    second = make_draft_length("cost", 8, costs=costs)
    assert second.next_k() == 0 and make_draft_length("cost", 8).next_k() == 8
    assert costs.verify and costs.step == 100


@dataclass(frozen=True)
class Profile:
    """A simulated machine and drafter: pass cost base + per_token * K (plain: K = 0), chain acceptance."""

    alpha: float
    base: float
    per_token: float
    draft_per_token: float = 0.0
    plain: float | None = None  # a plain pass's cost when it is not on the line (a 1-token fast path)
    outliers: float = 0.0  # share of passes slowed 10x (a busy machine)

    def pass_cost(self, k: int) -> float:
        return self.plain if k == 0 and self.plain is not None else self.base + self.per_token * k


def simulate(policy, profile: Profile, steps: int, seed: int = 0) -> tuple[float, list[int]]:
    """Drive a policy on a simulated clock; (seconds per token, the K asked at each step).

    Timing draws use their own generator, three per step whatever K is, so two policies run with
    the same seed see the same noise and outliers step by step."""
    timing, acceptance = random.Random(seed), random.Random(seed + 10_000)
    clock, tokens, ks = 0.0, 0, []
    for _ in range(steps):
        k = policy.next_k()
        ks.append(k)
        accepted = 0
        while accepted < k and acceptance.random() < profile.alpha:  # the chain model: stop at the first rejection
            accepted += 1
        noise, slow, draft_noise = timing.uniform(0.9, 1.1), timing.random(), timing.uniform(0.9, 1.1)
        verify = profile.pass_cost(k) * noise * (10.0 if slow < profile.outliers else 1.0)
        draft = profile.draft_per_token * k * draft_noise
        policy.update(step(k, accepted, draft_time=draft, verify_time=verify))
        clock += draft + verify
        tokens += accepted + 1
    return clock / tokens, ks


def mode(ks: list[int]) -> int:
    return Counter(ks).most_common(1)[0][0]


def test_cost_model_drafts_long_with_high_acceptance_and_a_flat_pass_cost():
    _, ks = simulate(CostModelK(4, k_max=16), Profile(0.95, 0.010, 0.0001, 0.0001), 400)
    assert mode(ks[200:]) >= 14


def test_cost_model_stops_drafting_when_nothing_passes_and_resumes_when_drafts_pass_again():
    policy = CostModelK(8, k_max=16)
    _, ks = simulate(policy, Profile(0.02, 0.010, 0.001, 0.0002), 400, seed=1)
    late = ks[200:]
    assert late.count(0) >= 0.85 * len(late)  # settles on plain decoding...
    assert 5 <= sum(k > 0 for k in late) <= 30  # ...yet still tries a draft now and then
    _, ks = simulate(policy, Profile(0.9, 0.010, 0.001, 0.0002), 200, seed=2)
    resumed = next(i for i, k in enumerate(ks) if all(later > 0 for later in ks[i : i + 20]))
    assert resumed <= 60
    assert mode(ks[100:]) >= 5


@pytest.mark.parametrize("seed", range(6))
def test_cost_model_resists_outliers_where_drafting_pays(seed):
    pays = Profile(0.8, 0.010, 0.001, 0.0001)
    _, clean = simulate(CostModelK(8, k_max=16), pays, 600, seed=seed)
    _, noisy = simulate(CostModelK(8, k_max=16), replace(pays, outliers=0.2), 600, seed=seed)
    assert mode(noisy[300:]) > 0
    assert abs(mode(noisy[300:]) - mode(clean[300:])) <= 2  # the optimum is flat: K = 4..7 are within 2%
    expected = {k: time_per_token(0.8, k, 0.0001, pays.pass_cost(k)) for k in range(17)}
    chosen = sum(expected[k] for k in noisy[300:]) / 300  # the model's own price of what was chosen
    assert chosen <= 1.10 * min(expected.values())


def test_cost_model_resists_outliers_where_drafting_does_not_pay():
    _, ks = simulate(CostModelK(8, k_max=16), Profile(0.2, 0.010, 0.005, outliers=0.2), 600, seed=4)
    assert ks[300:].count(0) >= 0.8 * 300


def test_cost_model_follows_a_change_in_pass_costs():
    # The machine gets busy and a longer pass gets dearer: old samples must age out.
    policy = CostModelK(8, k_max=16)
    _, ks = simulate(policy, Profile(0.45, 0.010, 0.0005), 400, seed=5)
    assert mode(ks[200:]) > 0
    _, ks = simulate(policy, Profile(0.45, 0.010, 0.006, outliers=0.1), 400, seed=6)
    assert ks[100:].count(0) >= 0.8 * 300  # plain decoding within ~100 steps


PROFILES = {
    "drafting pays": Profile(0.8, 0.010, 0.001, 0.0002, outliers=0.1),
    "drafting does not pay": Profile(0.2, 0.010, 0.005, outliers=0.1),
    "borderline": Profile(0.3, 0.010, 0.003, outliers=0.1),
    "plain pass on a fast path": Profile(0.5, 0.013, 0.001, plain=0.010, outliers=0.1),
    "long drafts pay": Profile(0.95, 0.010, 0.0003, 0.0001, outliers=0.1),
    # llama.cpp on a 2-core CPU (benchmarks/llama_cpp_passes.py): each drafted token adds ~0.6 of
    # a one-token pass, so drafting only pays at very high acceptance.
    "dear verification": Profile(0.5, 0.011, 0.0055, 0.0001, plain=0.0095, outliers=0.05),
}


@pytest.mark.parametrize("name", PROFILES)
def test_cost_model_is_close_to_the_best_fixed_k_on_a_simulated_clock(name):
    profile, steps = PROFILES[name], 2000
    fixed = {k: simulate(FixedK(k), profile, steps, seed=7)[0] for k in range(17)}
    adaptive, _ = simulate(CostModelK(8, k_max=16), profile, steps, seed=7)
    assert adaptive <= 1.10 * min(fixed.values()), f"{adaptive / min(fixed.values()):.3f}x the best fixed K"
    assert adaptive <= 1.10 * fixed[0], f"{adaptive / fixed[0]:.3f}x plain decoding"


def test_cost_model_explores_little_where_verification_is_dear():
    """Probes cost what their pass costs: where a drafting pass costs 5 plain ones, exploring must
    not eat what K = 0 saves."""
    profile = PROFILES["dear verification"]
    plain, _ = simulate(FixedK(0), profile, 2000, seed=8)
    adaptive, ks = simulate(CostModelK(8, k_max=16, prior_slope=0.5), profile, 2000, seed=8)
    assert adaptive <= 1.02 * plain, f"{adaptive / plain:.3f}x plain decoding"  # 1.033x before
    assert 0 < sum(k > 0 for k in ks[1000:]) <= 100  # probes, and follow-ups of the probes that paid


def test_unknown_policy_is_refused():
    with pytest.raises(QuickdraftError, match="draft length"):
        make_draft_length("random", 4)


@pytest.mark.speculation
@pytest.mark.parametrize(
    "options",
    [
        {"draft_length": "adaptive", "k_max": 6},
        {"draft_length": "cost", "k_max": 6},
        {"confidence": 0.6},
        {"draft_length": "adaptive", "k_max": 6, "confidence": 0.4},
    ],
)
def test_dynamic_draft_length_stays_lossless_and_in_bounds(tiny_target, tiny_draft, options):
    plain = Decoder(loaded(tiny_target, "t"), None, "none")
    spec = Decoder(loaded(tiny_target, "t"), loaded(tiny_draft, "d"), "draft", 3, **options)
    ks, outputs = [], []
    for prompt in PROMPTS:
        out = spec.generate(prompt, max_new_tokens=40)
        assert out.token_ids == plain.generate(prompt, max_new_tokens=40).token_ids
        for record in out.steps:
            assert 0 <= len(record.draft_tokens) <= record.k <= 6
        ks += [record.k for record in out.steps[:-1]]
        outputs.append(out)
    assert_speculated(outputs)
    if options.get("draft_length") in ("adaptive", "cost"):
        assert len(set(ks)) > 1, "K must react to what the steps measured"


def test_confidence_threshold_shortens_drafts(tiny_target):
    unsure = perturbed_copy(tiny_target, noise=0.05, seed=9)
    always = Decoder(loaded(tiny_target, "t"), loaded(unsure, "d"), "draft", 6)
    cautious = Decoder(loaded(tiny_target, "t"), loaded(unsure, "d"), "draft", 6, confidence=0.9)
    full = always.generate(PROMPTS[0], max_new_tokens=30)
    short = cautious.generate(PROMPTS[0], max_new_tokens=30)
    assert short.token_ids == full.token_ids
    assert short.stats.drafted_tokens < full.stats.drafted_tokens
    with pytest.raises(QuickdraftError, match="confidence"):
        Decoder(loaded(tiny_target, "t"), loaded(unsure, "d"), "draft", 6, confidence=1.5)


def test_the_prior_slope_comes_from_measured_pass_costs():
    """slope / base of the verify cost line through passes of n = K + 1 tokens (n = 1 stays out: a
    one-token pass may take a faster path); the generic guess where nothing was measured."""
    from quickdraft.draft_length import DEFAULT_PRIOR_SLOPE, prior_slope

    # T(K) = 10 + 5 K ms for K = n - 1 drafted tokens: slope / base = 0.5.
    assert prior_slope({1: 6.0, 2: 15.0, 4: 25.0, 8: 45.0, 16: 85.0}) == pytest.approx(0.5)
    assert prior_slope(None) == prior_slope({}) == prior_slope({1: 6.0, 2: 15.0}) == DEFAULT_PRIOR_SLOPE
    cheap = CostModelK(4, prior_slope=prior_slope({1: 6.0, 2: 6.2, 4: 6.6, 8: 7.4, 16: 9.0}))
    dear = CostModelK(4, prior_slope=prior_slope({1: 6.0, 2: 15.0, 4: 25.0, 8: 45.0, 16: 85.0}))
    assert cheap.prior_slope < 0.05 < dear.prior_slope
