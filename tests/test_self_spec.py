"""Self-speculative drafting: the target's own layers, shared, never copied."""

import copy

import pytest
import torch
from conftest import loaded, tiny_llama
from seq_util import hf
from spec_util import assert_speculated

from quickdraft import Decoder, QuickdraftError
from quickdraft.calibrate import calibrate_self_spec, candidate_depths
from quickdraft.models.layer_subset import layer_subset_model, resolve_layers


@pytest.fixture(scope="module")
def deep_target():
    return tiny_llama(seed=11, layers=6)


def test_view_shares_weights_and_matches_a_truncated_model(deep_target):
    view = layer_subset_model(deep_target, [0, 1, 2])
    target_storage = {p.data_ptr() for p in deep_target.parameters()}
    assert all(p.data_ptr() in target_storage for p in view.parameters())
    # Reference: a truncated copy. Not the target's hidden states: transformers captures them with
    # hooks on each layer, and a view that ran on shared layers left its own hooks there, so after
    # another test's view the target's hidden_states[3] was not layer 2's output (a reversed run).
    truncated = copy.deepcopy(deep_target)
    truncated.model.layers = truncated.model.layers[:3]
    truncated.config.num_hidden_layers = 3
    tokens = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        reference = truncated(tokens).logits[0]
    runner = hf(view, cache_config=deep_target.config)
    assert torch.allclose(runner.forward(tokens[0].tolist()), reference, atol=1e-5)


def test_skipping_layers_keeps_cache_slots_and_rolls_back(deep_target):
    view = layer_subset_model(deep_target, [0, 2, 5])
    runner = hf(view, cache_config=deep_target.config)
    runner.forward([1, 2, 3, 4])
    runner.forward([9, 9])
    runner.truncate(4)
    after = runner.forward([5])
    fresh = hf(view, cache_config=deep_target.config)
    assert torch.allclose(after, fresh.forward([1, 2, 3, 4, 5])[-1:], atol=1e-5)


@pytest.mark.speculation
@pytest.mark.parametrize("runner", ["native", "hf"])
@pytest.mark.parametrize("layers", [2, [0, 3], [0, 1, 4, 5]])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_self_spec_greedy_equals_plain(deep_target, layers, k, runner):
    plain = Decoder(loaded(deep_target, "t"), None, "none", backend=runner)
    spec = Decoder(loaded(deep_target, "t"), None, "self-spec", k, layers=layers, backend=runner)
    outputs = []
    for prompt in ([1, 2, 3], [7, 7, 8, 9, 7, 7]):
        outputs.append(spec.generate(prompt, max_new_tokens=29))
        assert outputs[-1].token_ids == plain.generate(prompt, max_new_tokens=29).token_ids
    assert_speculated(outputs, min_rate=0.1)  # a random model's early layers: 12-24% of passes accept


@pytest.mark.parametrize(
    "layers, message", [(0, "within"), (6, "skip at least one"), ([1, 2], "layer 0"), ([0, 9], "within")]
)
def test_bad_layer_choices_are_refused(deep_target, layers, message):
    with pytest.raises(QuickdraftError, match=message):
        resolve_layers(deep_target.config.num_hidden_layers, layers)
    with pytest.raises(QuickdraftError, match=message):
        Decoder(loaded(deep_target, "t"), None, "self-spec", 3, layers=layers)


def test_calibration_tries_each_depth_and_keeps_the_fastest(deep_target):
    base = Decoder(loaded(deep_target, "t"), None, "none")
    chosen = calibrate_self_spec(base, "self-spec", 3, tokens=12)
    assert set(chosen.calibration) == set(candidate_depths(6)) == {1, 2, 3}
    assert chosen.config.layers == max(chosen.calibration, key=chosen.calibration.get)
    assert chosen.method == "self-spec" and chosen.k == 3


def test_default_depth_is_a_quarter(deep_target):
    native = Decoder(loaded(deep_target, "t"), None, "self-spec", backend="native")
    assert native.drafter.backend.layer_ids == [0]
    hf = Decoder(loaded(deep_target, "t"), None, "self-spec", backend="hf")
    assert hf.drafter.backend.model.config.num_hidden_layers == 1
