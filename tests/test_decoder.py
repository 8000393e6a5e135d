"""The public API on tiny models: bad input gets a clear error and leaves the decoder usable."""

import pytest
from conftest import loaded, tiny_llama

import quickdraft
from quickdraft import Decoder, QuickdraftError
from quickdraft.models.loading import LoadedModel, same_vocabulary


@pytest.fixture
def decoder(tiny_target, tiny_draft):
    return Decoder(loaded(tiny_target, "t"), loaded(tiny_draft, "d"), "draft", 3)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda d: d.generate([], max_new_tokens=4), "empty"),
        (lambda d: d.generate("hello"), "no tokenizer"),
        (lambda d: d.generate([1, 2], max_new_tokens=0), "max_new_tokens"),
        (lambda d: d.generate([1, 99]), "outside the vocabulary"),
        (lambda d: d.generate(list(range(30)) * 9, max_new_tokens=4), "context length"),
        (lambda d: d.generate([1, 2], max_new_tokens=300), "context length"),
        (lambda d: d.generate([1, 2], temperature=-1), "temperature"),
        (lambda d: d.generate([1, 2], stop=[""]), "stop"),
    ],
)
def test_bad_generate_input_is_refused_and_state_survives(decoder, call, message):
    before = decoder.generate([1, 2, 3], max_new_tokens=12).token_ids
    with pytest.raises(QuickdraftError, match=message):
        call(decoder)
    assert decoder.generate([1, 2, 3], max_new_tokens=12).token_ids == before


def test_k_below_one_is_refused(tiny_target, tiny_draft):
    with pytest.raises(QuickdraftError, match="k"):
        Decoder(loaded(tiny_target, "t"), loaded(tiny_draft, "d"), "draft", 0)
    with pytest.raises(QuickdraftError, match="k"):
        quickdraft.load(tiny_target, method="prompt-lookup", k=-1)


def test_unknown_method_is_refused_before_loading():
    with pytest.raises(QuickdraftError, match="unknown method 'medusa-x'.*none, draft, prompt-lookup"):
        quickdraft.load("/no/such/model", method="medusa-x")


def test_draft_method_needs_a_draft_model(tiny_target):
    with pytest.raises(QuickdraftError, match="needs a draft model"):
        quickdraft.load(tiny_target, method="draft")


def test_method_none_ignores_k_and_default_method_follows_draft(tiny_target, tiny_draft):
    assert Decoder(loaded(tiny_target, "t"), None, "none", 5).k == 0
    assert quickdraft.load(tiny_target, tiny_draft).method == "draft"
    assert quickdraft.load(tiny_target).method == "prompt-lookup"


def test_vocabularies_that_cannot_be_matched_are_refused(tiny_target):
    # Without tokenizers, token ids of another vocabulary size cannot be matched to the target's.
    other = tiny_llama(seed=5, vocab=48)
    with pytest.raises(QuickdraftError, match="vocabulary"):
        same_vocabulary(loaded(tiny_target, "t"), loaded(other, "d"))
    with pytest.raises(QuickdraftError, match="vocabulary"):
        quickdraft.load(tiny_target, other)


class FakeTokenizer:
    """Only what same_vocabulary reads (a real one is needed to draft across vocabularies)."""

    def __init__(self, vocab):
        self.vocab = vocab

    def get_vocab(self):
        return dict(self.vocab)

    def __len__(self):
        return len(self.vocab)


def test_same_size_but_different_tokens_is_another_vocabulary(tiny_target, tiny_draft):
    target = LoadedModel.of(tiny_target, FakeTokenizer({"a": 0, "b": 1}), "t")
    assert not same_vocabulary(target, LoadedModel.of(tiny_draft, FakeTokenizer({"a": 1, "b": 0}), "d"))
    assert same_vocabulary(target, LoadedModel.of(tiny_draft, FakeTokenizer({"a": 0, "b": 1}), "d"))


def test_streaming_yields_every_step(decoder):
    steps = list(decoder.stream([1, 2, 3], max_new_tokens=15))
    assert sum(len(step.emitted) for step in steps) == 15
    assert [t for step in steps for t in step.emitted] == decoder.generate([1, 2, 3], max_new_tokens=15).token_ids
