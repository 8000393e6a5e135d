import pytest

from quickdraft import Decoder, QuickdraftError
from quickdraft.draft_length import AdaptiveK, CostModelK, make_draft_length
from quickdraft.stats import StepRecord

from conftest import loaded, perturbed_copy

PROMPTS = [[1, 2, 3], [5, 9, 9, 2, 7, 1, 5, 9]]


def step(drafted: int, accepted: int, draft_time: float = 0.0, verify_time: float = 0.01) -> StepRecord:
    return StepRecord(k=drafted, draft_tokens=[0] * drafted, accepted=accepted, next_token=0,
                      bonus=accepted == drafted, emitted=[0] * (accepted + 1),
                      draft_time=draft_time, verify_time=verify_time)


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
    good = CostModelK(4, k_max=16)
    bad = CostModelK(4, k_max=16)
    for k in (2, 4, 6, 8) * 5:
        good.update(step(k, k, draft_time=0.0005 * k, verify_time=0.030 + 0.001 * k))
        bad.update(step(k, 0, draft_time=0.005 * k, verify_time=0.030 + 0.001 * k))
    assert good.alpha > 0.9 and bad.alpha < 0.2
    assert good.next_k() >= 10
    assert bad.next_k() == 1


def test_cost_model_fits_the_target_cost_line():
    policy = CostModelK(3)
    for k in (1, 3, 5, 7):
        policy.update(step(k, 1, verify_time=0.02 + 0.002 * k))
    base, slope = policy._target_cost()
    assert base == pytest.approx(0.02) and slope == pytest.approx(0.002)


def test_unknown_policy_is_refused():
    with pytest.raises(QuickdraftError, match="draft length"):
        make_draft_length("random", 4)


@pytest.mark.parametrize("options", [
    {"draft_length": "adaptive", "k_max": 6},
    {"draft_length": "cost", "k_max": 6},
    {"confidence": 0.6},
    {"draft_length": "adaptive", "k_max": 6, "confidence": 0.4},
])
def test_dynamic_draft_length_stays_lossless_and_in_bounds(tiny_target, tiny_draft, options):
    plain = Decoder(loaded(tiny_target, "t"), None, "none")
    spec = Decoder(loaded(tiny_target, "t"), loaded(tiny_draft, "d"), "draft", 3, **options)
    ks = []
    for prompt in PROMPTS:
        out = spec.generate(prompt, max_new_tokens=40)
        assert out.token_ids == plain.generate(prompt, max_new_tokens=40).token_ids
        for record in out.steps:
            assert 0 <= len(record.draft_tokens) <= record.k <= 6
        ks += [record.k for record in out.steps[:-1]]
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
