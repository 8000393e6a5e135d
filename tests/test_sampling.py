import pytest
import torch

from quickdraft.errors import QuickdraftError
from quickdraft.sampling import SamplingParams, logits_to_probs, next_token


def test_temperature_scales_logits_before_softmax():
    logits = torch.tensor([2.0, 1.0, 0.0])
    probs = logits_to_probs(logits, SamplingParams(temperature=0.5))
    assert torch.allclose(probs, torch.softmax(logits / 0.5, dim=-1))


def test_top_k_keeps_k_most_likely_and_renormalises():
    logits = torch.tensor([0.0, 3.0, 1.0, 2.0])
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    expected = torch.softmax(torch.tensor([3.0, 2.0]), dim=-1)
    assert probs[0] == 0 and probs[2] == 0
    assert torch.allclose(probs[[1, 3]], expected)


def test_top_p_keeps_smallest_prefix_reaching_mass():
    probs_in = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs_in.log()
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.75))
    # 0.5 < 0.75 so the second token is needed; 0.8 >= 0.75 so the third is not.
    assert torch.allclose(probs, torch.tensor([0.625, 0.375, 0.0, 0.0]))


def test_top_p_always_keeps_the_most_likely_token():
    logits = torch.tensor([5.0, 0.0, 0.0])
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.01))
    assert torch.equal(probs, torch.tensor([1.0, 0.0, 0.0]))


def test_processing_is_batched_per_row():
    logits = torch.tensor([[0.0, 3.0, 1.0], [4.0, 0.0, 1.0]])
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=1))
    assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))


def test_greedy_is_argmax_and_sampling_uses_only_the_generator():
    logits = torch.tensor([0.1, 0.2, 3.0, 0.0])
    assert next_token(logits, SamplingParams(), torch.Generator()) == 2
    params = SamplingParams(temperature=1.0)
    first = [next_token(logits, params, torch.Generator().manual_seed(s)) for s in range(20)]
    torch.manual_seed(123)  # global state must not matter
    second = [next_token(logits, params, torch.Generator().manual_seed(s)) for s in range(20)]
    assert first == second


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1e-38),
        SamplingParams(temperature=1e-45),
        SamplingParams(temperature=1.0, top_p=1e-300),
        SamplingParams(temperature=1e-30, top_p=1e-300, top_k=10**9),
    ],
)
def test_extreme_parameters_give_a_distribution_never_nan(params):
    """Tiny temperatures behave as greedy, a top_p that keeps nothing keeps the top token (these gave NaN)."""
    logits = torch.tensor([[2.0, 30.0, -1.0, 29.999], [1e4, -1e4, 0.0, 5.0]])
    probs = logits_to_probs(logits, params)
    assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]))
    assert next_token(logits[0], params, torch.Generator()) == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -1.0},
        {"temperature": float("nan")},
        {"temperature": float("inf")},
        {"top_k": 0},
        {"top_p": 0.0},
        {"top_p": 1.5},
    ],
)
def test_bad_parameters_are_refused(kwargs):
    with pytest.raises(QuickdraftError):
        SamplingParams(**kwargs)
