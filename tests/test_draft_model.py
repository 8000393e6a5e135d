"""Draft-model drafting at the edges a new user meets: a draft with a shorter context than the
prompt, and a draft with fewer logits than the target (a padded target vocabulary)."""

from __future__ import annotations

import pytest
import torch
from conftest import loaded, tiny_llama
from spec_util import assert_speculated
from transformers import LlamaForCausalLM

from quickdraft import Decoder


def narrower_copy(model: LlamaForCausalLM, vocab: int) -> LlamaForCausalLM:
    """The model with only its first `vocab` token rows (embeddings and LM head): a draft that lacks
    the target's last ids and otherwise agrees with it."""
    config = model.config.__class__(**(model.config.to_dict() | {"vocab_size": vocab}))
    draft = LlamaForCausalLM(config).eval()
    rows = ("model.embed_tokens.weight", "lm_head.weight")
    state = {name: value[:vocab] if name in rows else value for name, value in model.state_dict().items()}
    draft.load_state_dict(state)
    return draft


@pytest.mark.speculation
def test_a_draft_whose_context_is_shorter_than_the_prompt_stops_drafting_for_that_sequence(tiny_target):
    short = tiny_llama(seed=1, max_positions=16)  # the target's own weights, a 16-token context
    target, draft = loaded(tiny_target, "t"), loaded(short, "short")
    plain = Decoder(target, None, "none")
    spec = Decoder(target, draft, "draft", 3)
    long_prompt = [(5 * i) % 32 for i in range(20)]
    out = spec.generate(long_prompt, max_new_tokens=20)
    assert out.token_ids == plain.generate(long_prompt, max_new_tokens=20).token_ids
    assert out.stats.drafted_tokens == 0  # no crash: this sequence is simply not drafted for
    # A prompt that fits: drafts until the sequence outgrows the draft's context, then plain steps.
    out = spec.generate([1, 2, 3, 4, 5], max_new_tokens=40)
    assert out.token_ids == plain.generate([1, 2, 3, 4, 5], max_new_tokens=40).token_ids
    assert_speculated([out])
    assert all(not step.draft_tokens for step in out.steps[-10:])


@pytest.mark.speculation
def test_a_draft_with_fewer_logits_skips_the_steps_after_an_id_it_lacks(tiny_target):
    target = loaded(tiny_target, "t")
    spec = Decoder(target, loaded(narrower_copy(tiny_target, 24), "narrow"), "draft", 3)
    plain = Decoder(target, None, "none")
    prompt = [30, 2, 27, 4, 31, 6]  # ids 24..31 exist only in the target
    out = spec.generate(prompt, max_new_tokens=40)
    assert out.token_ids == plain.generate(prompt, max_new_tokens=40).token_ids
    assert_speculated([out], min_rate=0.1)  # the steps after an id the draft lacks verify nothing
    sampled = [spec.generate(prompt, max_new_tokens=30, temperature=1.0, seed=seed) for seed in range(20)]
    tokens = [t for out in sampled for t in out.token_ids]
    assert max(tokens) >= 24  # the target did sample ids the draft lacks, and nothing broke
    for out in sampled:
        sequence = list(prompt)
        for step in out.steps:  # no draft right after a token the draft lacks
            if sequence[-1] >= 24:
                assert step.draft_tokens == []
            sequence += step.emitted
    assert all(torch.tensor(s.draft_tokens).lt(24).all() for out in sampled for s in out.steps if s.draft_tokens)
