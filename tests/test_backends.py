"""The backend seam: both backends' caches roll back exactly, hidden states come back when asked,
several sequences of different methods share one pass, and a backend written from the protocol
alone runs every method."""

from __future__ import annotations

import pytest
import torch
from conftest import loaded, tiny_llama
from seq_util import Seq, hf, native, static
from spec_util import assert_speculated

from quickdraft import Decoder
from quickdraft.backends.backend import PassOutput, SeqPass, causal_mask, check_passes, logit_rows
from quickdraft.backends.hf import HFBackend
from quickdraft.backends.kv_cache import KVCache
from quickdraft.backends.native import NativeBackend
from quickdraft.draft_length import make_draft_length
from quickdraft.drafters import PromptLookupDrafter
from quickdraft.engine import Generation, prefill, step
from quickdraft.models.native_weights import NativeWeights
from quickdraft.sampling import SamplingParams


@pytest.mark.parametrize("make", [hf, native, static], ids=["hf", "native", "static"])
def test_truncate_then_forward_equals_fresh_forward(tiny_target, make):
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    seq = make(tiny_target)
    seq.forward(tokens[:5])
    seq.forward([7, 7, 7])  # drafts that will be rejected
    seq.truncate(5)
    assert seq.length == 5
    after_rollback = seq.forward(tokens[5:])  # [3, V]
    reference = make(tiny_target).forward(tokens)[5:]
    with torch.no_grad():
        full = tiny_target(torch.tensor([tokens])).logits[0, 5:]
    assert torch.allclose(after_rollback, reference, atol=1e-5)
    assert torch.allclose(after_rollback, full, atol=1e-4)


@pytest.mark.parametrize("make", [hf, native, static], ids=["hf", "native", "static"])
def test_logit_rows_and_length_bookkeeping(tiny_target, make):
    seq = make(tiny_target)
    last = seq.forward([1, 2, 3, 4], all_logits=False)
    assert last.shape == (1, seq.backend.vocab_size)
    assert seq.length == 4
    out = seq.backend.forward([SeqPass(seq.cache, [5, 6], logits="none")])[0]
    assert out.logits is None and out.hidden is None and seq.length == 6
    seq.truncate(10)  # longer than the cache: nothing to drop
    assert seq.length == 6
    seq.truncate(0)
    assert seq.length == 0


@pytest.mark.parametrize("make", [hf, native, static], ids=["hf", "native", "static"])
def test_a_pass_past_the_context_length_is_refused_and_changes_nothing(tiny_target, make):
    seq = make(tiny_target)
    seq.forward([1, 2])
    with pytest.raises(ValueError, match="context length"):
        seq.forward(list(range(seq.max_length)))
    assert seq.length == 2
    with pytest.raises(ValueError, match="once"):
        seq.backend.forward([SeqPass(seq.cache, [1]), SeqPass(seq.cache, [2])])


def test_both_backends_return_the_last_hidden_states_after_the_final_norm(tiny_target):
    expected = tiny_target.model(torch.tensor([[1, 2, 3, 4, 5]])).last_hidden_state[0]  # [5, H]
    for seq in (hf(tiny_target), native(tiny_target)):
        seq.forward([1, 2, 3], all_logits=False)  # every row's state, though only the last row's logits
        assert torch.allclose(seq.hidden, expected[:3], atol=1e-4)
        seq.forward([4, 5])
        assert seq.hidden.shape == (2, tiny_target.config.hidden_size)
        assert torch.allclose(seq.hidden, expected[3:], atol=1e-4)
    backend = HFBackend(tiny_target, "t")
    assert backend.forward([SeqPass(backend.new_cache(), [1, 2])])[0].hidden is None  # not computed unless asked


def test_the_kv_cache_grows_keeps_a_path_and_rolls_back_by_a_pointer():
    cache = KVCache(2, 1, 4, 100, ones_column=True, granularity=32)
    cache.reserve(5)
    assert cache.capacity == 32 and (cache.values[..., 4] == 1).all() and (cache.keys == 0).all()
    for layer in range(2):
        cache.write(layer, torch.arange(20.0).view(1, 5, 4) + layer, torch.ones(1, 5, 4))
    cache.advance(5)
    cache.reserve(40)
    assert cache.capacity == 64 and cache.length == 5  # doubled past the need, contents copied
    assert torch.equal(cache.keys[1, 0, :5], torch.arange(20.0).view(5, 4) + 1)
    cache.keep([0, 1, 3])
    assert cache.length == 3 and torch.equal(cache.keys[0, 0, 2], torch.tensor([12.0, 13, 14, 15]))
    cache.truncate(1)
    assert cache.length == 1 and torch.equal(cache.keys[0, 0, 1], torch.tensor([4.0, 5, 6, 7]))  # untouched
    with pytest.raises(ValueError, match="context length"):
        cache.reserve(101)
    plain = KVCache(1, 1, 4, 1000)
    plain.reserve(700)
    assert plain.capacity == 700  # no granules: just what is needed (doubling from 0 adds nothing)


def test_a_batched_pass_equals_each_sequence_alone():
    backend = NativeBackend(NativeWeights.from_model(tiny_llama(seed=3)), "t")
    prompts = [[1, 2, 3, 4, 5], [9, 8], [7, 7, 7, 1, 2, 3, 4, 5, 6]]
    alone, batched = [Seq(backend) for _ in prompts], [Seq(backend) for _ in prompts]
    for seq, prompt in zip(alone + batched, prompts + prompts):
        seq.forward(prompt)
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)  # root, two children
    passes = [
        dict(tokens=[3]),
        dict(tokens=[4, 5, 6, 7]),
        dict(
            tokens=[1, 2, 3], positions=[9, 10, 10], mask=torch.cat([torch.ones(3, 9, dtype=torch.bool), tree], dim=1)
        ),
    ]
    expected = [seq.forward(**p) for seq, p in zip(alone, passes)]
    got = backend.forward([SeqPass(seq.cache, **p) for seq, p in zip(batched, passes)])
    for e, g in zip(expected, got):
        assert e.shape == g.logits.shape and torch.allclose(e, g.logits, atol=1e-4)
    assert [s.length for s in batched] == [s.length for s in alone] == [6, 6, 12]
    # Ragged continuation: each sequence rolls back on its own, then decodes on in one batch.
    for seq in (alone[1], batched[1]):
        seq.truncate(3)
    expected = [seq.forward([5]) for seq in alone]
    got = backend.forward([SeqPass(seq.cache, [5]) for seq in batched])
    assert all(torch.allclose(e, g.logits, atol=1e-4) for e, g in zip(expected, got))
    with pytest.raises(ValueError, match="another backend"):
        NativeBackend(backend.weights, "t", layers=[0]).forward([SeqPass(batched[0].cache, [1])])


@pytest.mark.speculation
@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_two_sequences_of_different_methods_and_lengths_in_one_step_equal_each_alone(
    tiny_target, tiny_draft, precision
):
    """Below fp32 every row is computed on its own, so equality is exact by construction."""
    target = loaded(tiny_target, "t")
    draft = loaded(tiny_draft, "d")
    decoders = [
        Decoder(target, draft, "draft", 3, precision=precision),
        Decoder(target, draft, "lookahead", 2, precision=precision),
        Decoder(target, draft, "self-spec", 2, layers=1, precision=precision),
    ]
    prompts, lengths = [[1, 2, 3, 4, 5, 6, 7], [9, 9, 2], [5, 1, 5, 1, 5]], [30, 17, 23]
    together = [d.prepare(p, n) for d, p, n in zip(decoders, prompts, lengths)]
    assert decoders[0].target_backend is decoders[1].target_backend  # one backend: one batched pass
    prefill(together)
    while any(not g.done for g in together):
        step([g for g in together if not g.done])
    for decoder, prompt, length, generation in zip(decoders, prompts, lengths, together):
        alone = decoder.generate(prompt, max_new_tokens=length)
        assert generation.new_tokens == alone.token_ids
        assert generation.stats.target_passes == alone.stats.target_passes
    assert_speculated(together)


class ToyBackend:
    """A backend written from the protocol alone: a bigram table, where a token's logits depend only
    on the token before it (its cache is the list of tokens it has seen)."""

    class Cache:
        def __init__(self) -> None:
            self.tokens: list[int] = []

        @property
        def length(self) -> int:
            return len(self.tokens)

        def truncate(self, length: int) -> None:
            del self.tokens[max(0, length) :]

        def keep(self, indices: list[int]) -> None:
            self.tokens = [self.tokens[i] for i in indices]

    name, max_length, hidden_size, tokenizer, eos_ids = "toy", 64, 4, None, frozenset()
    device, dtype = torch.device("cpu"), torch.float32

    def __init__(self, vocab: int = 12, seed: int = 0) -> None:
        self.vocab_size = vocab
        self.table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed)) * 3  # [V, V]

    def new_cache(self, length: int | None = None) -> Cache:
        return ToyBackend.Cache()

    def forward(self, passes: list[SeqPass]) -> list[PassOutput]:
        check_passes(passes, self.max_length)
        outputs = []
        for p in passes:
            p.cache.tokens.extend(p.tokens)
            rows = self.table[torch.tensor(p.tokens)]  # [n, V]: a bigram model ignores positions and masks
            outputs.append(
                PassOutput(
                    None if p.logits == "none" else logit_rows(rows, p.logits),
                    torch.zeros(len(p.tokens), 4) if p.hidden else None,
                )
            )
        return outputs


def run_alone(backend, prompt: list[int], n: int, k: int, temperature: float = 0.0, seed: int = 0) -> Generation:
    generation = Generation(
        backend,
        PromptLookupDrafter(2, 1),
        prompt,
        draft_length=make_draft_length("fixed", k),
        max_new_tokens=n,
        sampling=SamplingParams(temperature),
        generator=torch.Generator().manual_seed(seed),
    )
    prefill([generation])
    while not generation.done:
        step([generation])
    return generation


@pytest.mark.speculation
def test_a_toy_backend_built_from_the_protocol_alone_runs_the_engine():
    backend = ToyBackend()
    prompt = [1, 2, 3, 1, 2]
    plain = run_alone(backend, prompt, 25, 0).new_tokens
    expected, token = [], prompt[-1]
    for _ in range(25):  # greedy bigram decoding, by hand
        token = int(backend.table[token].argmax())
        expected.append(token)
    assert plain == expected
    spec = run_alone(backend, prompt, 25, 4)
    assert spec.new_tokens == plain  # speculation over the toy backend is exact too
    assert_speculated([spec])
    # Two toy sequences in one step equal each alone, sampled with their own seeds.
    generations = [
        Generation(
            backend,
            PromptLookupDrafter(2, 1),
            p,
            draft_length=make_draft_length("fixed", 3),
            max_new_tokens=15,
            sampling=SamplingParams(1.0),
            generator=torch.Generator().manual_seed(s),
        )
        for s, p in enumerate([prompt, [4, 5, 4]])
    ]
    prefill(generations)
    while any(not g.done for g in generations):
        step([g for g in generations if not g.done])
    for seed, (g, p) in enumerate(zip(generations, [prompt, [4, 5, 4]])):
        assert g.new_tokens == run_alone(backend, p, 15, 3, 1.0, seed).new_tokens


def test_causal_mask_and_logit_rows():
    assert causal_mask(2, 3, torch.device("cpu")).tolist() == [
        [True, True, True, False, False],
        [True, True, True, True, False],
        [True, True, True, True, True],
    ]
    rows = torch.arange(6).view(3, 2)
    assert logit_rows(rows, "last").tolist() == [[4, 5]] and logit_rows(rows, "none").shape == (0, 2)
