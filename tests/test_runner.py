"""The HF runner's cache: rollback must leave it exactly as a fresh forward would."""

import torch

from quickdraft.models.runner import HFRunner


def test_truncate_then_forward_equals_fresh_forward(tiny_target):
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    runner = HFRunner(tiny_target)
    runner.reset()
    runner.forward(tokens[:5])
    runner.forward([7, 7, 7])  # drafts that will be rejected
    runner.truncate(5)
    assert runner.length == 5
    after_rollback = runner.forward(tokens[5:])  # [3, V]

    fresh = HFRunner(tiny_target)
    fresh.reset()
    reference = fresh.forward(tokens)[5:]
    with torch.no_grad():
        full = tiny_target(torch.tensor([tokens])).logits[0, 5:]
    assert torch.allclose(after_rollback, reference, atol=1e-5)
    assert torch.allclose(after_rollback, full, atol=1e-5)


def test_last_only_logits_and_length_bookkeeping(tiny_target):
    runner = HFRunner(tiny_target)
    runner.reset()
    last = runner.forward([1, 2, 3, 4], all_logits=False)
    assert last.shape == (1, runner.vocab_size)
    assert runner.length == 4
    runner.truncate(10)  # longer than the cache: nothing to drop
    assert runner.length == 4
    runner.reset()
    assert runner.length == 0


def test_forward_past_context_length_is_refused(tiny_target):
    runner = HFRunner(tiny_target)
    runner.reset()
    try:
        runner.forward(list(range(runner.max_length + 1)))
    except ValueError as error:
        assert "context length" in str(error)
    else:
        raise AssertionError("expected a ValueError")


def test_both_runners_keep_the_last_hidden_states_after_the_final_norm(tiny_target):
    from quickdraft.models.native import NativeRunner, NativeWeights

    expected = tiny_target.model(torch.tensor([[1, 2, 3, 4, 5]])).last_hidden_state[0]  # [5, H]
    hf = HFRunner(tiny_target, keep_hidden=True)
    hf.forward([1, 2, 3], all_logits=False)
    assert torch.allclose(hf.hidden, expected[:3], atol=1e-5)
    native = NativeRunner(NativeWeights.from_model(tiny_target))
    native.forward([1, 2, 3], all_logits=False)  # every row's state, though only the last row's logits
    native.forward([4, 5])
    assert native.hidden.shape == (2, tiny_target.config.hidden_size)
    assert torch.allclose(native.hidden, expected[3:], atol=1e-4)
    assert HFRunner(tiny_target).hidden is None  # not kept unless asked
