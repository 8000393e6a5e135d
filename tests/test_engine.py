"""The engine loop on tiny random models: losslessness, rollback and stopping."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICES, loaded, perturbed_copy, tiny_llama
from faults import FaultyDrafter
from spec_util import LOOPING, assert_speculated
from stats_util import chi_square_p_value, sample_batched

from quickdraft import Decoder
from quickdraft.backends.backend import SeqPass
from quickdraft.draft_length import FixedK
from quickdraft.engine import Generation, prefill, step
from quickdraft.options import SAMPLERS
from quickdraft.sampling import SamplingParams, logits_to_probs

PROMPTS = [[1, 2, 3], [5, 9, 9, 2, 7, 1, 5, 9], [30, 4, 17, 30, 4], LOOPING]  # LOOPING: drafts get accepted


def make_decoder(target, draft, method: str, k: int | None = None, device: str = "cpu", **options) -> Decoder:
    draft_model = loaded(draft, "draft") if method == "draft" else None
    if method == "self-spec":
        options["layers"] = 1  # the tiny models have 2 layers
    if method != "none":  # drafts every step: the cost model may choose K = 0 on tiny models (test_draft_length)
        options["draft_length"] = "fixed"
    return Decoder(loaded(target, "target"), draft_model, method, k, device=device, **options)


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_plain_decoding_equals_transformers_greedy(tiny_target, prompt):
    out = make_decoder(tiny_target, None, "none").generate(prompt, max_new_tokens=30)
    assert out.token_ids == hf_greedy(tiny_target, prompt, 30)
    assert out.stats.target_passes == 30 and out.stats.drafted_tokens == 0


@pytest.mark.speculation
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", ["draft", "prompt-lookup", "self-spec", "lookahead", "suffix"])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_speculation_equals_plain_greedy(tiny_target, tiny_draft, method, k, device):
    plain = make_decoder(tiny_target, None, "none", device=device)
    spec = make_decoder(tiny_target, tiny_draft, method, k, device=device)
    outputs = []
    for prompt in PROMPTS:
        for max_new in (37, 11):  # 37 ends mid-step for every k > 1
            reference = plain.generate(prompt, max_new_tokens=max_new)
            out = spec.generate(prompt, max_new_tokens=max_new)
            assert out.token_ids == reference.token_ids
            assert len(out.token_ids) == max_new
            outputs.append(out)
    assert_speculated(outputs)  # the test must exercise accepted drafts, not only rejections


def test_steps_and_stats_are_consistent(tiny_target, tiny_draft):
    out = make_decoder(tiny_target, tiny_draft, "draft", 4).generate(PROMPTS[1], max_new_tokens=40)
    stats = out.stats
    assert stats.target_passes == len(out.steps)
    assert stats.new_tokens == len(out.token_ids) == sum(len(s.emitted) for s in out.steps)
    assert stats.accepted_tokens == sum(s.accepted for s in out.steps)
    assert stats.drafted_tokens == sum(len(s.draft_tokens) for s in out.steps)
    assert stats.mean_accepted_tokens == pytest.approx(40 / stats.target_passes)
    assert 0 < stats.acceptance_rate <= 1
    assert stats.wall_time >= stats.draft_time + stats.verify_time
    assert sum(stats.accepted_by_position) == stats.accepted_tokens
    assert any(s.bonus for s in out.steps) and any(not s.bonus for s in out.steps)
    for record in out.steps:
        assert record.emitted == [*record.draft_tokens[: record.accepted], record.next_token][: len(record.emitted)]
    assert stats.finish_reason == "length"


def test_draft_cache_is_rolled_back_not_recomputed(tiny_target, tiny_draft):
    decoder = make_decoder(tiny_target, tiny_draft, "draft", 3)
    generation = decoder.start(PROMPTS[1], max_new_tokens=20)
    draft_cache = generation.draft_state.cache
    while not generation.done:
        generation.step()
        if not generation.done:
            # Both caches hold exactly the accepted tokens except the newest (or fewer for the draft).
            assert generation.cache.length == len(generation.tokens) - 1
            assert draft_cache.length <= len(generation.tokens) - 1
    # The draft cache after a rollback gives the logits a fresh forward gives.
    tokens = generation.tokens
    draft_cache.truncate(len(tokens) - 3)
    cached = decoder.drafter.backend.forward([SeqPass(draft_cache, tokens[len(tokens) - 3 :])])[0].logits
    with torch.no_grad():
        fresh = tiny_draft(torch.tensor([tokens])).logits[0, -3:]
    assert torch.allclose(cached, fresh, atol=1e-5)


def test_eos_stops_and_is_kept(tiny_target):
    plain = make_decoder(tiny_target, None, "none")
    reference = plain.generate(PROMPTS[0], max_new_tokens=20).token_ids
    eos = reference[6]
    first = reference.index(eos)
    for method in ("none", "prompt-lookup"):
        decoder = make_decoder(tiny_target, None, method, 8 if method != "none" else None)
        decoder.eos_ids = frozenset({eos})
        out = decoder.generate(PROMPTS[0], max_new_tokens=20)
        assert out.token_ids == reference[: first + 1]
        assert out.finish_reason == "eos"


@pytest.mark.speculation
def test_max_new_tokens_is_exact_even_when_a_step_accepts_many(tiny_target):
    # A draft identical to the target is always accepted: every step yields k + 1 tokens.
    plain = make_decoder(tiny_target, None, "none")
    spec = make_decoder(tiny_target, perturbed_copy(tiny_target, noise=0.0, seed=0), "draft", 4)
    for n in (1, 2, 5, 13):
        out = spec.generate(PROMPTS[0], max_new_tokens=n)
        assert len(out.token_ids) == n
        assert out.token_ids == plain.generate(PROMPTS[0], max_new_tokens=n).token_ids
    out = spec.generate(PROMPTS[0], max_new_tokens=13)
    assert [len(step.emitted) for step in out.steps] == [5, 5, 3]
    assert out.stats.acceptance_rate == 1.0


def test_same_seed_same_output_and_global_rng_ignored(tiny_target, tiny_draft):
    decoder = make_decoder(tiny_target, tiny_draft, "draft", 3)
    a = decoder.generate(PROMPTS[0], max_new_tokens=25, temperature=1.0, seed=7).token_ids
    torch.manual_seed(999)
    b = decoder.generate(PROMPTS[0], max_new_tokens=25, temperature=1.0, seed=7).token_ids
    c = decoder.generate(PROMPTS[0], max_new_tokens=25, temperature=1.0, seed=8).token_ids
    assert a == b and a != c


# --- distribution: sampled speculative output follows the target exactly -------------------

VOCAB = 8
RUNS = 2000


@pytest.fixture(scope="module")
def small_target():
    return tiny_llama(seed=3, vocab=VOCAB, init_range=0.25)


@pytest.fixture(scope="module")
def small_draft(small_target):
    return perturbed_copy(small_target, noise=0.06, seed=4)


def exact_joint(model, prompt: list[int], params: SamplingParams) -> torch.Tensor:
    """[V, V] probability of the first two generated tokens, computed from the logits."""
    with torch.no_grad():
        first = logits_to_probs(model(torch.tensor([prompt])).logits[0, -1], params)  # [V]
        batch = torch.tensor([[*prompt, t] for t in range(VOCAB)])  # [V, L+1]
        second = logits_to_probs(model(batch).logits[:, -1], params)  # [V, V]
    return first[:, None] * second


def sampled_joint(decoder: Decoder, prompt: list[int], params: SamplingParams, k: int) -> torch.Tensor:
    counts = torch.zeros(VOCAB, VOCAB)
    outputs = sample_batched(
        decoder, prompt, RUNS, k + 1, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p
    )
    for out in outputs:
        counts[out.token_ids[0], out.token_ids[1]] += 1
    # Drafts were accepted, well above a drafter of wrong tokens (its chance acceptances: 3% or less).
    assert_speculated(outputs, min_rate=0.15)
    return counts


DISTRIBUTION_CASES = [
    ("draft", 3, SamplingParams(temperature=1.0)),
    ("draft", 2, SamplingParams(temperature=1.0, top_k=4)),
    ("draft", 3, SamplingParams(temperature=0.7, top_p=0.8)),
    ("prompt-lookup", 3, SamplingParams(temperature=1.0)),
    ("prompt-lookup", 2, SamplingParams(temperature=1.0, top_k=3, top_p=0.9)),
    ("self-spec", 3, SamplingParams(temperature=1.0, top_p=0.9)),
    ("lookahead", 2, SamplingParams(temperature=1.0)),
    ("lookahead", 2, SamplingParams(temperature=0.8, top_k=5)),
    ("suffix", 3, SamplingParams(temperature=1.0)),
    ("suffix", 2, SamplingParams(temperature=0.7, top_k=3, top_p=0.9)),
]


@pytest.mark.chance
@pytest.mark.speculation
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("method,k,params", DISTRIBUTION_CASES)
def test_sampled_output_follows_target_distribution(small_target, small_draft, method, k, params, sampler, device):
    # Repeats what the target continues with (0 after 2 3, p = 0.72): prompt lookup's drafts get
    # accepted (after [1, 2, 3, 1, 2, 3, 1] its 2 had p = 0.01, outside top-k 3). Both samplers:
    # Gumbel-max over noise from each run's seed, and rejection sampling.
    prompt = [2, 3, 0, 0, 2, 3]
    decoder = make_decoder(small_target, small_draft, method, k, device, sampler=sampler)
    counts = sampled_joint(decoder, prompt, params, k)
    expected = exact_joint(small_target, prompt, params)
    assert chi_square_p_value(counts, expected) > 1e-3


def test_distribution_test_can_tell_draft_from_target(small_target, small_draft):
    # Power check: samples from the draft's own distribution are rejected by the same test.
    prompt = [1, 2, 3, 1, 2, 3, 1]
    params = SamplingParams(temperature=1.0)
    target = exact_joint(small_target, prompt, params)
    draft = exact_joint(small_draft, prompt, params)
    draws = torch.multinomial(draft.flatten(), RUNS, replacement=True, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(draws, minlength=VOCAB * VOCAB).float()
    assert chi_square_p_value(counts, target) < 1e-6
    out = make_decoder(small_target, small_draft, "draft", 3).generate(prompt, max_new_tokens=200, temperature=1.0)
    assert 0.3 < out.stats.acceptance_rate < 0.95, "draft must be rejected sometimes for the test to bite"


@pytest.mark.parametrize("stage", ["begin", "propose", "update"])
@pytest.mark.parametrize("method", ["draft", "prompt-lookup"])
def test_a_fault_in_one_sequence_ends_it_alone(tiny_target, tiny_draft, method, stage):
    decoder = make_decoder(tiny_target, tiny_draft, method, 3)
    faulty = FaultyDrafter(decoder.drafter, marked=PROMPTS[1][0], stage=stage)
    gens = [
        Generation(
            decoder.target_backend,
            faulty,
            prompt,
            draft_length=FixedK(3),
            max_new_tokens=12,
            sampling=SamplingParams(),
            generator=torch.Generator(),
        )
        for prompt in PROMPTS
    ]
    prefill(gens)
    while live := [g for g in gens if not g.done]:
        records = step(live)
        assert all((record is None) == (g.error is not None) for g, record in zip(live, records))
    for g, prompt in zip(gens, PROMPTS):
        if prompt is PROMPTS[1]:
            assert g.finish_reason == "error" and "injected fault" in str(g.error)
        else:  # the others are untouched: the same tokens as decoding each alone
            assert g.error is None and g.new_tokens == decoder.generate(prompt, max_new_tokens=12).token_ids
    with pytest.raises(RuntimeError, match="injected fault"):  # alone, the fault is raised to the caller
        alone = Generation(
            decoder.target_backend,
            faulty,
            PROMPTS[1],
            draft_length=FixedK(3),
            max_new_tokens=12,
            sampling=SamplingParams(),
            generator=torch.Generator(),
        )
        list(alone)


@pytest.mark.parametrize("method, temperature", [("none", 0.0), ("draft", 0.0), ("prompt-lookup", 0.0), ("draft", 1.0)])
def test_logprobs_are_the_targets_own(tiny_target, tiny_draft, method, temperature):
    """Each emitted token's log-probability is the target's (raw logits), whichever pass scored it."""
    prompt = PROMPTS[1]
    out = make_decoder(tiny_target, tiny_draft, method, 3).generate(
        prompt, max_new_tokens=10, logprobs=3, temperature=temperature, seed=1
    )
    with torch.no_grad():
        logits = tiny_target(torch.tensor([prompt + out.token_ids])).logits[0]  # [T, V]
    expected = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)  # [10, V]: the row before each new token
    assert [e.token for e in out.logprobs] == out.token_ids
    chosen = expected.gather(-1, torch.tensor(out.token_ids)[:, None])[:, 0]
    assert [e.logprob for e in out.logprobs] == pytest.approx(chosen.tolist(), abs=1e-4)
    best = expected.topk(3, dim=-1).values
    assert [lp for e in out.logprobs for _, lp in e.top] == pytest.approx(best.flatten().tolist(), abs=1e-4)
    assert make_decoder(tiny_target, tiny_draft, method, 3).generate(prompt, max_new_tokens=4).logprobs is None
