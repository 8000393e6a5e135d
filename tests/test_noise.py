"""Noise drawn from (seed, position) alone: Gumbel-max picks are exact samples, and a seed gives
plain decoding's text whatever the method, K, draft length, batch or timing."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICES, loaded, perturbed_copy, tiny_llama
from spec_util import LOOPING, assert_speculated
from stats_util import chi_square_p_value, decode_together

from quickdraft import Decoder
from quickdraft.noise import PositionNoise, gumbel_of_bits, gumbel_row
from quickdraft.sampling import SamplingParams, gumbel_pick, logits_to_probs
from quickdraft.verify import verify_tree

PROMPTS = [[1, 2, 3], [5, 9, 9, 2, 7, 1, 5, 9], [30, 4, 17, 30, 4], LOOPING]
SAMPLED = dict(temperature=0.6, top_k=12, seed=11)  # peaked enough on the tiny model for drafts to land


def test_a_row_depends_on_seed_and_position_alone():
    row = gumbel_row(3, 17, 40)
    assert torch.equal(row, gumbel_row(3, 17, 40))
    assert torch.equal(row[:25], gumbel_row(3, 17, 25))  # a token's noise does not depend on the vocabulary's size
    assert not torch.equal(row, gumbel_row(3, 18, 40)) and not torch.equal(row, gumbel_row(4, 17, 40))
    # Seed s at position p + 1 is not seed s + 1 (or s + 2) at p: streams do not meet shifted.
    assert not torch.equal(gumbel_row(0, 1, 40), gumbel_row(1, 0, 40))
    assert not torch.equal(gumbel_row(0, 1, 40), gumbel_row(2, 0, 40))


def test_noise_is_finite_at_both_ends_of_its_bits():
    # A +inf would win every argmax whatever p says (it once picked a token top-k had filtered out).
    ends = gumbel_of_bits(torch.tensor([0, 1, 2**23 - 2, 2**23 - 1]))
    assert torch.isfinite(ends).all() and ends[0] < -2.5 and ends[-1] > 16
    probs = torch.tensor([0.0, 1.0])
    assert gumbel_pick(probs, gumbel_of_bits(torch.tensor([2**23 - 1, 0]))) == 1


def test_rows_are_gumbel_and_uncorrelated():
    rows = torch.stack([gumbel_row(seed, position, 4096) for seed in range(4) for position in range(4)])  # [16, V]
    # Gumbel(0, 1): mean Euler's gamma, deviation pi / sqrt(6).
    assert abs(rows.mean() - 0.5772) < 0.02 and abs(rows.std() - 1.2825) < 0.02 and torch.isfinite(rows).all()
    correlation = torch.corrcoef(rows) - torch.eye(16)
    assert correlation.abs().max() < 0.08  # 4 standard errors at 4096 samples


def test_position_noise_keeps_rows_until_they_are_decoded():
    noise = PositionNoise(5, 30)
    first = noise.rows([7, 8])
    assert first.shape == (2, 30) and torch.equal(first[1], gumbel_row(5, 8, 30))
    noise.forget_before(8)
    assert torch.equal(noise.rows([8, 9])[0], first[1])
    assert noise.rows([]).shape == (0, 30)


@pytest.mark.chance
def test_gumbel_pick_is_an_exact_sample_across_seeds():
    probs = logits_to_probs(torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0, 1.5, 0.2]), SamplingParams(1.0, top_k=6))
    counts = torch.zeros(8)
    for seed in range(6000):
        counts[gumbel_pick(probs, gumbel_row(seed, 0, 8))] += 1
    assert counts[probs == 0].sum() == 0  # filtered tokens are never picked
    assert chi_square_p_value(counts, probs) > 1e-3
    assert chi_square_p_value(counts, torch.full((8,), 1 / 8)) < 1e-6  # the test can fail


@pytest.mark.chance
def test_over_a_real_vocabulary_picks_stay_where_p_has_mass():
    # 49,152 ids, as SmolLM2's: with a noise of +inf once in 2^24 ids, one pick in 340 went anywhere.
    logits = torch.randn(49152, generator=torch.Generator().manual_seed(0))
    probs = logits_to_probs(logits, SamplingParams(1.0, top_k=4))  # [V]
    kept = probs.nonzero().flatten()
    counts = torch.zeros(49152)
    for seed in range(3000):
        counts[gumbel_pick(probs, gumbel_row(seed, 40, 49152))] += 1
    assert counts.sum() == counts[kept].sum()
    assert chi_square_p_value(counts[kept], probs[kept]) > 1e-3


def test_gumbel_pick_ignores_ids_without_noise():
    probs = torch.tensor([0.01, 0.02, 0.97])
    assert gumbel_pick(probs, torch.zeros(2)) == 1  # id 2 lies past the noise's vocabulary


def test_verification_follows_the_pick_of_each_depth():
    params = SamplingParams(1.0)
    logits = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))  # [M+1, V]: root and 3 nodes
    gumbel = torch.stack([gumbel_row(9, p, 6) for p in range(3)])  # [D+1, V]: a tree of depth 2
    pick = [gumbel_pick(logits_to_probs(logits[r], params), gumbel[d]) for r, d in ((0, 0), (1, 1), (2, 1), (3, 2))]
    # Two children of the root (nodes 0, 1), one grandchild under node 1 (node 2).
    tokens = [(pick[0] + 1) % 6, pick[0], pick[2]]
    verdict = verify_tree(tokens, [-1, -1, 1], logits, params, torch.Generator(), None, gumbel)
    assert verdict.path == (1, 2) and verdict.next_token == pick[3] and verdict.bonus
    wrong = [(pick[0] + 1) % 6]
    verdict = verify_tree(wrong, [-1], logits[:2], params, torch.Generator(), None, gumbel)
    assert verdict.path == () and verdict.next_token == pick[0] and not verdict.bonus


# --- the engine: a seed gives plain decoding's text -------------------------------------------


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(seed=1)
    return target, perturbed_copy(target, noise=0.01, seed=2)


def decoder(models, method: str, k: int | None = None, **options) -> Decoder:
    target, draft = models
    if method == "self-spec":
        options.setdefault("layers", 1)
    return Decoder(loaded(target, "t"), loaded(draft, "d") if method == "draft" else None, method, k, **options)


def plain_texts(models, max_new_tokens: int, **options) -> list[list[int]]:
    plain = decoder(models, "none", **options)
    return [plain.generate(p, max_new_tokens, **SAMPLED).token_ids for p in PROMPTS]


@pytest.mark.speculation
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", ["draft", "prompt-lookup", "self-spec", "lookahead"])
def test_seeded_sampling_equals_plain_seeded_decoding_at_every_k_and_draft_length(models, method, device):
    expected = plain_texts(models, 30, device=device)
    outputs = []
    for k in (1, 3, 8):
        for length in ("fixed", "adaptive", "cost"):
            spec = decoder(models, method, k, draft_length=length, device=device)
            for prompt, want in zip(PROMPTS, expected):
                out = spec.generate(prompt, 30, **SAMPLED)
                assert out.token_ids == want, (method, k, length, prompt)
                outputs.append(out)
    assert_speculated(outputs, min_rate=0.1)


@pytest.mark.speculation
@pytest.mark.parametrize("method", ["draft", "self-spec", "lookahead"])
def test_seeded_text_does_not_follow_the_timings_the_cost_model_reads(models, method):
    # Timings injected into the decoder's shared pass costs: drafting nearly free, then dear. The
    # cost model drafts long in one run and little in the other; the text stays plain decoding's.
    want = decoder(models, "none").generate(PROMPTS[3], 40, **SAMPLED).token_ids
    taken = {}
    for label, per_draft in (("cheap", 1e-6), ("dear", 5e-2)):
        spec = decoder(models, method, 4, draft_length="cost")
        for _ in range(24):
            for drafted in (0, 2, 6):
                spec.pass_costs.add(drafted, 1e-3 + per_draft * drafted, 1e-6 * drafted)
        out = spec.generate(PROMPTS[3], 40, **SAMPLED)
        assert out.token_ids == want, label
        taken[label] = [s.k for s in out.steps]
    assert sum(taken["cheap"]) > sum(taken["dear"]), taken  # the injected timings did move K


@pytest.mark.speculation
def test_seeded_sampling_batched_equals_each_alone_and_plain(models):
    # Methods and lengths mixed in one batched step: each row's text is its plain seeded text.
    jobs = [
        ("draft", 3),
        ("none", None),
        ("self-spec", 2),
        ("prompt-lookup", 4),
        ("lookahead", 2),
        ("draft", 8),
        ("suffix", 8),
    ]
    base = decoder(models, "draft", 3)
    gens = []
    for (method, k), prompt in zip(jobs, [*PROMPTS, *PROMPTS]):
        extra = {"layers": 1} if method == "self-spec" else {}
        gens.append(base.with_method(method, k, **extra).prepare(prompt, 25, **SAMPLED))
    decode_together(gens)
    expected = plain_texts(models, 25)
    for g, prompt in zip(gens, [*PROMPTS, *PROMPTS]):
        assert g.error is None and g.new_tokens == expected[PROMPTS.index(prompt)]


def test_rejection_sampling_stays_an_option_and_a_seed_still_repeats(models):
    spec = decoder(models, "draft", 3, sampler="rejection")
    a = spec.generate(PROMPTS[0], 25, **SAMPLED).token_ids
    assert a == spec.generate(PROMPTS[0], 25, **SAMPLED).token_ids
    with pytest.raises(Exception, match="sampler"):
        decoder(models, "draft", 3, sampler="maximal")


@pytest.mark.speculation
@pytest.mark.parametrize("backend", ["native", "hf", "static"])
def test_seeded_sampling_equals_plain_seeded_decoding_on_every_backend(models, backend):
    settings = dict(backend=backend, measure_shapes=False)
    expected = plain_texts(models, 30, **settings)
    outputs = []
    for method in ("draft", "prompt-lookup", "self-spec", "lookahead", "suffix"):
        for k in (2, 5):
            spec = decoder(models, method, k, draft_length="adaptive", **settings)
            assert spec.backend_kind == backend
            for prompt, want in zip(PROMPTS, expected):
                outputs.append(spec.generate(prompt, 30, **SAMPLED))
                assert outputs[-1].token_ids == want, (backend, method, k, prompt)
    assert_speculated(outputs, min_rate=0.1)
