"""Drafts from a model with another tokenizer (drafters/cross_vocab.py): tokens matched by the bytes
they spell, drafts over the intersection; greedy output equals plain greedy decoding and sampled
output follows the target's distribution (the same chi-square test as every method)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama
from spec_util import assert_speculated
from stats_util import chi_square_p_value
from test_engine import exact_joint, sampled_joint
from tokenizers import Tokenizer, models
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from quickdraft import Decoder
from quickdraft.drafters.cross_vocab import CrossVocabDrafter, VocabMap, token_bytes
from quickdraft.models.loading import LoadedModel
from quickdraft.sampling import SamplingParams

# Two vocabularies over the letters a-d. Shared spellings: a b c d ab. Only the target has cd,
# abcd and ba (the draft re-tokenises them); only the draft has bc and da (never drafted).
TARGET_VOCAB = {"a": 0, "b": 1, "c": 2, "d": 3, "ab": 4, "cd": 5, "abcd": 6, "ba": 7}
TARGET_MERGES = [("a", "b"), ("c", "d"), ("ab", "cd"), ("b", "a")]
DRAFT_VOCAB = {"ab": 0, "d": 1, "c": 2, "b": 3, "a": 4, "bc": 5, "da": 6}
DRAFT_MERGES = [("a", "b"), ("b", "c"), ("d", "a")]


def bpe(vocab: dict[str, int], merges: list[tuple[str, str]]) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE(vocab=vocab, merges=merges)))


@pytest.fixture(scope="module")
def pair():
    """A target of 8 tokens and a draft of 7 that predicts like it on the tokens both spell."""
    target = tiny_llama(seed=3, vocab=8, init_range=0.25)
    draft = LlamaForCausalLM(tiny_llama(seed=4, vocab=7).config).eval()
    state = {k: v for k, v in target.state_dict().items() if "embed_tokens" not in k and "lm_head" not in k}
    draft.load_state_dict(state, strict=False)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, token in DRAFT_VOCAB.items():
            if name in TARGET_VOCAB:  # the same token: the target's rows, a little noise
                for rows, source in (
                    (draft.model.embed_tokens.weight, target.model.embed_tokens.weight),
                    (draft.lm_head.weight, target.lm_head.weight),
                ):
                    rows[token] = source[TARGET_VOCAB[name]] + 0.05 * torch.randn(rows.shape[1], generator=generator)
    return (
        LoadedModel.of(target, bpe(TARGET_VOCAB, TARGET_MERGES), "target"),
        LoadedModel.of(draft, bpe(DRAFT_VOCAB, DRAFT_MERGES), "draft"),
    )


def test_tokens_are_matched_by_the_bytes_they_spell(pair):
    target, draft = pair
    vocab = VocabMap.build(target.tokenizer, draft.tokenizer, 7)
    assert vocab.draft_to_target.tolist() == [4, 3, 2, 1, 0, -1, -1]  # ab d c b a, then bc and da: none
    assert vocab.target_to_draft == {4: 0, 3: 1, 2: 2, 1: 3, 0: 4} and vocab.shared == 5


TEXT = "Hello  wörld, naïve café ✓ 🦜 tabs\tand\nnew lines"


@pytest.mark.integration
def test_a_byte_level_tokenizer_spells_its_texts_byte_for_byte():
    """SmolLM2's byte-level BPE: a text's tokens, their bytes joined, are the text's bytes."""
    from quickdraft.models.loading import load_model

    tokenizer = load_model(None).tokenizer
    spelled = token_bytes(tokenizer)
    assert b"".join(spelled[i] for i in tokenizer.encode(TEXT, add_special_tokens=False)) == TEXT.encode()
    assert spelled[tokenizer.eos_token_id] is None


def test_a_sentencepiece_style_tokenizer_spells_spaces_and_byte_pieces():
    """'▁' for a space and <0xNN> byte-fallback pieces (Gemma's and Llama 2's layout), here a
    SentencePiece-style BPE built in the test: the letters of the text, three merges, and byte
    pieces for the rest (the accents, the check mark, the emoji, the tab and the newline)."""
    from tokenizers import decoders, normalizers

    letters = sorted(set("▁Helowrd,naivcftbs"))
    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}}
    for piece in [*letters, "He", "ll", "▁w"]:
        vocab[piece] = len(vocab)
    model = Tokenizer(
        models.BPE(vocab=vocab, merges=[("H", "e"), ("l", "l"), ("▁", "w")], byte_fallback=True, unk_token="<unk>")
    )
    model.normalizer = normalizers.Replace(" ", "▁")
    model.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=model, unk_token="<unk>")
    spelled = token_bytes(tokenizer)
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    assert any(tokenizer.convert_ids_to_tokens(i).startswith("<0x") for i in ids)  # the emoji, as bytes
    assert b"".join(spelled[i] for i in ids) == TEXT.encode()


def test_the_draft_reads_target_tokens_it_lacks_in_its_own_tokens(pair):
    target, draft = pair
    drafter = Decoder(target, draft, "draft", 3, measure_shapes=False).drafter
    assert isinstance(drafter, CrossVocabDrafter)
    state = drafter.begin([6, 7, 0], None)  # abcd ba a -> the draft's ab c d, b a (no "ba"), a
    assert state.tokens == [0, 2, 1, 3, 4, 4] and state.synced == 3


@pytest.mark.speculation
@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_speculation_across_vocabularies_equals_plain_greedy(pair, k):
    target, draft = pair
    plain = Decoder(target, None, "none", measure_shapes=False)
    spec = Decoder(target, draft, "draft", k, measure_shapes=False)
    outputs = []
    for prompt in ([0, 1, 2, 3], [6, 7, 5, 4, 0], [2]):
        outputs.append(spec.generate(prompt, max_new_tokens=37))
        assert outputs[-1].token_ids == plain.generate(prompt, max_new_tokens=37).token_ids
    assert_speculated(outputs)  # the test must exercise accepted drafts


@pytest.mark.speculation
@pytest.mark.parametrize("k", [1, 3, 6])
def test_seeded_sampling_across_vocabularies_equals_plain_seeded_decoding(pair, k):
    # The draft reads the target's noise at the target id each of its ids drafts.
    target, draft = pair
    sampled = dict(temperature=0.7, seed=4)
    plain = Decoder(target, None, "none", measure_shapes=False)
    spec = Decoder(target, draft, "draft", k, measure_shapes=False, draft_length="adaptive")
    outputs = []
    for prompt in ([0, 1, 2, 3], [6, 7, 5, 4, 0], [2]):
        outputs.append(spec.generate(prompt, max_new_tokens=37, **sampled))
        assert outputs[-1].token_ids == plain.generate(prompt, max_new_tokens=37, **sampled).token_ids
    assert_speculated(outputs)


@pytest.mark.chance
@pytest.mark.speculation
@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=4)])
def test_sampling_across_vocabularies_follows_the_target(pair, params):
    target, draft = pair
    prompt = [1, 2, 3, 1, 2, 3, 1]
    decoder = Decoder(target, draft, "draft", 3, measure_shapes=False)
    counts = sampled_joint(decoder, prompt, params, 3)
    assert chi_square_p_value(counts, exact_joint(target.model, prompt, params)) > 1e-3
    out = decoder.generate(prompt, max_new_tokens=200, temperature=1.0)
    assert 0.05 < out.stats.acceptance_rate < 0.98, "drafts must be both accepted and rejected for the test to bite"
