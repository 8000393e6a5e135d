"""The static backend (fixed-shape passes; CUDA graphs on a GPU), run here without graphs: the same
code path a GPU replays. A token's bits do not depend on the pass that computes it, so every
drafter's greedy output equals plain decoding's, and sampling follows the target."""

from __future__ import annotations

import gc

import pytest
import torch
from conftest import loaded, tiny_llama
from seq_util import Seq, native, static
from spec_util import assert_speculated
from stats_util import chi_square_p_value
from test_engine import PROMPTS, exact_joint, sampled_joint

from quickdraft import Decoder
from quickdraft.backends.backend import SeqPass
from quickdraft.backends.static import StaticBackend, window_keys
from quickdraft.draft_length import FixedK
from quickdraft.drafters.drafter import Draft, NoDrafter
from quickdraft.engine import Generation
from quickdraft.errors import QuickdraftError
from quickdraft.models.native_weights import NativeWeights
from quickdraft.sampling import SamplingParams

ON_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_passes_in_parts_equal_native_and_transformers(tiny_target, rows):
    tokens = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8]
    logits = static(tiny_target, rows=rows).forward(tokens)  # [19, V]: parts of `rows`
    with torch.no_grad():
        full = tiny_target(torch.tensor([tokens])).logits[0]
    assert torch.allclose(logits, native(tiny_target).forward(tokens), atol=1e-5)
    assert torch.allclose(logits, full, atol=1e-4)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_token_gets_the_same_bits_in_any_pass(tiny_target, precision):
    """One token at a time, a verify pass of 7, a rollback and the pass again: the same bits."""
    tokens = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9]
    one = static(tiny_target, precision)
    rows = torch.cat([one.forward([t]) for t in tokens])  # [13, V]
    many = static(tiny_target, precision)
    many.forward(tokens[:6])
    verify = many.forward(tokens[6:])  # [7, V]
    assert torch.equal(verify, rows[6:])
    many.forward([7, 7, 7])  # drafts, rejected
    many.truncate(len(tokens))
    assert torch.equal(many.forward([2]), one.forward([2]))


def test_tree_rows_equal_chain_rows_and_a_kept_path_moves_to_the_front(tiny_target):
    """Bit for bit: a tree row reads its ancestors (which sit after their siblings) as near keys,
    gathered in path order, as the chain's row reads the same tokens."""
    prefix = [3, 1, 4, 1, 5]
    seq = static(tiny_target)
    seq.forward(prefix)
    # Root 9 with children 2 and 6; 6 has child 5. Layout: [9, 2, 6, 5].
    n, start = 4, len(prefix)
    mask = torch.zeros(n, start + n, dtype=torch.bool)
    mask[:, :start] = True
    for row, seen in enumerate([[0], [0, 1], [0, 2], [0, 2, 3]]):
        mask[row, [start + s for s in seen]] = True
    tree = seq.forward([9, 2, 6, 5], positions=[5, 6, 6, 7], mask=mask)
    chain = static(tiny_target)
    chain.forward(prefix)
    chain_rows = chain.forward([9, 6, 5])
    assert torch.equal(tree[[0, 2, 3]], chain_rows)
    seq.keep([*range(start), start, start + 2, start + 3])  # the path 9 -> 6 -> 5
    assert seq.length == start + 3
    assert torch.equal(seq.forward([1]), chain.forward([1]))


def test_window_keys_split_each_row_into_far_and_near_keys():
    # Row 0: causal at entry 5 with its split at 4 -> far 0..3, near [4, 5].
    # Row 1: a tree row seeing 0..5 and 8 (its ancestor sits at 8) -> far 0..3, near [4, 5, 8].
    # Row 2: more than W = 3 entries after its split -> the last 3 are near, the rest far.
    visible = torch.zeros(3, 10, dtype=torch.bool)
    visible[0, :6] = True
    visible[1, :6] = visible[1, 8] = True
    visible[2, :9] = True
    far, near, near_visible = window_keys(visible, torch.tensor([4, 4, 2]), 3)
    assert far[0].nonzero().flatten().tolist() == [0, 1, 2, 3]
    assert near[0].tolist()[:2] == [4, 5] and near_visible[0].tolist() == [True, True, False]
    assert far[1].nonzero().flatten().tolist() == [0, 1, 2, 3]
    assert near[1].tolist() == [4, 5, 8] and near_visible[1].all()
    assert far[2].nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 5]
    assert near[2].tolist() == [6, 7, 8] and near_visible[2].all()


def test_a_tree_is_cut_below_the_window_and_keeps_the_drafters_indices():
    # Root's children 0 and 1; 2 under 0; 3 under 2; 4 under 1. Depth limit 2 drops node 3.
    draft = Draft([10, 11, 12, 13, 14], None, [-1, -1, 0, 2, 1])
    cut, kept = draft.within_depth(2)
    assert kept == [0, 1, 2, 4] and cut.tokens == [10, 11, 12, 14] and cut.parents == [-1, -1, 0, 1]
    assert draft.within_depth(3) == (draft, None)
    chain, kept = Draft([1, 2, 3], torch.rand(3, 5)).within_depth(1)
    assert chain.tokens == [1] and chain.probs.shape == (1, 5) and kept == [0]


def test_batched_sequences_of_different_lengths_equal_each_alone(tiny_target):
    backend = static(tiny_target, rows=4).backend
    a, b = backend.new_cache(), backend.new_cache()
    outs = backend.forward([SeqPass(a, [1, 2, 3, 4, 5, 6]), SeqPass(b, [7, 8], logits="last", hidden=True)])
    alone_a, alone_b = static(tiny_target, rows=4), static(tiny_target, rows=4)
    assert torch.allclose(outs[0].logits, alone_a.forward([1, 2, 3, 4, 5, 6]), atol=1e-5)
    assert torch.allclose(outs[1].logits, alone_b.forward([7, 8], all_logits=False), atol=1e-5)
    assert outs[1].hidden.shape == (2, backend.hidden_size) and outs[0].hidden is None
    assert (a.length, b.length) == (6, 2)


def test_the_pool_grows_keeps_every_sequence_and_takes_slots_back(tiny_target):
    backend = static(tiny_target).backend
    first = Seq(backend)
    reference = first.forward([1, 2, 3])
    others = [Seq(backend) for _ in range(4)]  # more than the 2 slots it starts with
    assert backend.slots >= 5 and len({s.cache.slot for s in [first, *others]}) == 5
    for seq in others:
        seq.forward([4, 5])
    assert torch.equal(first.forward([4]), static(tiny_target).forward([1, 2, 3, 4])[-1:])
    assert reference.shape == (3, backend.vocab_size)
    free = len(backend._free)
    del others, seq
    gc.collect()
    assert len(backend._free) == free + 4


def test_bad_passes_are_refused_and_change_nothing(tiny_target):
    seq = static(tiny_target)
    seq.forward([1, 2])
    with pytest.raises(ValueError, match="context length"):
        seq.forward(list(range(seq.max_length)))
    other = static(tiny_target).backend.new_cache()
    with pytest.raises(ValueError, match="another backend"):
        seq.backend.forward([SeqPass(other, [1])])
    assert seq.length == 2
    with pytest.raises(ValueError, match="rows and slots"):
        StaticBackend(NativeWeights.from_model(tiny_target, "fp32", dense_kernel="linear"), "t", rows=0)
    with pytest.raises(ValueError, match="CUDA"):  # graphs of a CPU model
        StaticBackend(NativeWeights.from_model(tiny_target, "fp32", dense_kernel="linear"), "t", graphs=True)


def test_the_decoder_takes_the_static_backend_and_refuses_what_it_cannot_run(tiny_target):
    decoder = Decoder(loaded(tiny_target, "t"), None, "none", backend="static", measure_shapes=False)
    assert decoder.backend_kind == "static" and decoder.precision == "fp32"
    assert isinstance(decoder.target_backend, StaticBackend)
    with pytest.raises(QuickdraftError, match="the static backend computes at fp32, bf16, not int4"):
        Decoder(loaded(tiny_target, "t"), None, "none", backend="static", precision="int4")


def static_decoder(target, draft, method: str, k: int | None = None, precision: str = "fp32") -> Decoder:
    options = {"layers": 1} if method == "self-spec" else {}
    if method != "none":
        options["draft_length"] = "fixed"
    return Decoder(
        loaded(target, "target"),
        loaded(draft, "draft") if method == "draft" else None,
        method,
        k,
        backend="static",
        precision=precision,
        measure_shapes=False,
        **options,
    )


@pytest.mark.speculation
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("method", ["draft", "prompt-lookup", "self-spec", "lookahead"])
def test_greedy_speculation_equals_plain_greedy(tiny_target, tiny_draft, method, precision):
    plain = static_decoder(tiny_target, None, "none", precision=precision)
    outputs = []
    for k in (1, 4):
        spec = static_decoder(tiny_target, tiny_draft, method, k, precision)
        for prompt in PROMPTS:
            # 90 tokens: passes cross the window (64) and the tiny model's 2 x 64 key blocks.
            out = spec.generate(prompt, max_new_tokens=90)
            assert out.token_ids == plain.generate(prompt, max_new_tokens=90).token_ids, (method, k, prompt)
            outputs.append(out)
    assert_speculated(outputs)


@pytest.mark.chance
@pytest.mark.speculation
@pytest.mark.parametrize("method,k,params", [("draft", 3, SamplingParams(temperature=1.0, top_p=0.9))])
def test_sampled_output_follows_target_distribution(small_target, small_draft, method, k, params):
    # One case (2,000 runs of 64-row passes on a CPU take a minute); tests/test_engine.py runs every
    # method's sampling on the device's default backend, on CUDA too.
    prompt = [1, 2, 3, 1, 2, 3, 1]
    decoder = static_decoder(small_target, small_draft, method, k)
    assert (
        chi_square_p_value(sampled_joint(decoder, prompt, params, k), exact_joint(small_target, prompt, params)) > 1e-3
    )


@pytest.fixture(scope="module")
def small_target():
    # A 16-token context: the static backend's every pass attends over its whole context, and the
    # sampled test's sequences need 11 positions.
    return tiny_llama(seed=3, vocab=8, init_range=0.25, max_positions=16)


@pytest.fixture(scope="module")
def small_draft(small_target):
    from conftest import perturbed_copy

    return perturbed_copy(small_target, noise=0.06, seed=4)


@ON_CUDA
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cuda_graph_replays_equal_the_eager_passes(tiny_target, precision):
    model = tiny_llama(seed=1, max_positions=256).to("cuda")
    weights = NativeWeights.from_model(model, precision, device="cuda", dense_kernel="linear")
    graphed = Seq(StaticBackend(weights, "t", rows=8, graphs=True))
    eager = Seq(StaticBackend(weights, "t", rows=8, graphs=False))
    for tokens in ([3, 1, 4, 1, 5, 9, 2, 6, 5, 3], [5], [8, 9, 7]):
        assert torch.equal(graphed.forward(tokens), eager.forward(tokens))
    graphed.truncate(4)
    eager.truncate(4)
    assert torch.equal(graphed.forward([2, 2]), eager.forward([2, 2]))


def test_the_engine_cuts_a_tree_at_the_backends_window(tiny_target):
    """Root at position 6 of a window of 8: tree nodes may reach depth 1 only (position 7)."""
    backend = static(tiny_target, rows=8).backend
    generation = Generation(
        backend,
        NoDrafter(),
        list(range(1, 8)),
        draft_length=FixedK(3),
        max_new_tokens=10,
        sampling=SamplingParams(),
        generator=torch.Generator(),
    )
    tree = Draft([10, 11, 12, 13], None, [-1, -1, 0, 2])
    layout = generation.lay_out(3, 100, tree, 0.0)
    assert layout.draft.tokens == [10, 11] and layout.kept == [0, 1] and layout.positions == [6, 7, 7]
    chain = generation.lay_out(3, 100, Draft([10, 11, 12]), 0.0)  # chains cross freely: exact either way
    assert chain.draft.tokens == [10, 11, 12] and chain.kept is None


def test_a_sequence_attends_over_its_span_and_grows_it_when_it_outgrows_the_hint():
    model = tiny_llama(seed=1, max_positions=2048)
    backend = static(model, rows=8).backend
    short, whole = Seq(backend), Seq(backend)
    short.cache = backend.new_cache(100)  # 100 + one pass -> 256 keys
    assert (short.cache.span, whole.cache.span) == (256, 2048)
    tokens = [(7 * i) % 32 for i in range(300)]
    a, b = short.forward(tokens[:250]), whole.forward(tokens[:250])
    assert torch.allclose(a, b, atol=1e-5)  # the same maths over more (masked) keys
    short.forward(tokens[250:])  # past its hint: 300 + a pass -> 512 keys
    assert short.cache.span == 512 and short.length == 300
    assert torch.allclose(short.forward([3]), whole.forward(tokens[250:] + [3])[-1:], atol=1e-5)
