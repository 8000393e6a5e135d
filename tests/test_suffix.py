"""Suffix decoding on tiny models: what it drafts from, tenants kept apart, bounded pools, drafts sized
by the pass costs. (Greedy and sampled losslessness: test_engine, test_noise, test_llama_cpp_backend.)"""

from __future__ import annotations

import pytest
import torch
from conftest import loaded
from spec_util import LOOPING

from quickdraft import Decoder
from quickdraft.drafters.drafter import DraftRequest
from quickdraft.drafters.suffix import SuffixDrafter, SuffixPools
from quickdraft.errors import QuickdraftError
from quickdraft.memory import POOL_BYTES_PER_TOKEN, loaded_memory
from quickdraft.sampling import SamplingParams

PROMPT = [5, 9, 9, 2, 7, 1, 5, 9]
DEAR = {1: 10.0, 2: 14.0, 4: 45.0, 8: 85.0, 16: 170.0}  # ms by rows: a second row pays only for a sure token


def suffix_decoder(tiny_target, **options) -> Decoder:
    return Decoder(loaded(tiny_target, "target"), None, "suffix", draft_length="fixed", **options)


def drafts(out) -> list[list[int]]:
    return [step.draft_tokens for step in out.steps]


def test_a_stream_learns_from_earlier_outputs_and_each_tenant_only_from_its_own(tiny_target):
    decoder = suffix_decoder(tiny_target)
    plain = Decoder(loaded(tiny_target, "target"), None, "none").generate(PROMPT, max_new_tokens=30)
    first = decoder.generate(PROMPT, max_new_tokens=30, tenant="alpha")
    again = decoder.generate(PROMPT, max_new_tokens=30, tenant="alpha")
    other = decoder.generate(PROMPT, max_new_tokens=30, tenant="beta")
    assert first.token_ids == again.token_ids == other.token_ids == plain.token_ids
    # The second request of alpha drafts its first answer back: far fewer passes.
    assert again.stats.target_passes < first.stats.target_passes / 2
    assert again.stats.accepted_tokens > first.stats.accepted_tokens
    # beta saw nothing of alpha's: it drafts exactly as alpha's first request did.
    assert drafts(other) == drafts(first)
    pools = decoder.drafter.pools
    assert pools.tenants == 2 and pools.store("alpha").tokens_held == 2 * (30 + 1)  # two outputs and their ends
    assert pools.store("beta").tokens_held == 30 + 1


def test_no_pool_drafts_from_the_sequence_alone(tiny_target):
    decoder = suffix_decoder(tiny_target, shared_tokens=0)
    first = decoder.generate(PROMPT, max_new_tokens=30)
    again = decoder.generate(PROMPT, max_new_tokens=30)
    assert drafts(again) == drafts(first) and decoder.drafter.pools.tokens_held == 0


def test_prompts_join_the_pool_when_asked(tiny_target):
    decoder = suffix_decoder(tiny_target, share_prompts=True)
    decoder.generate(PROMPT, max_new_tokens=5)
    assert decoder.drafter.pools.store(None).tokens_held == len(PROMPT) + 1 + 5 + 1


def test_a_sequence_that_fails_teaches_nothing(tiny_target):
    decoder = suffix_decoder(tiny_target)
    generation = decoder.start(PROMPT, max_new_tokens=20)
    generation.step()
    generation.fail(RuntimeError("injected"))
    assert decoder.drafter.pools.tokens_held == 0


def request(state, tokens, k=8) -> DraftRequest:
    return DraftRequest(state, tokens, k, SamplingParams(), torch.Generator())


def test_drafts_are_sized_by_the_pass_costs_and_none_where_rows_are_dear():
    pools = SuffixPools(1000)
    pools.store(None).add([1, 2, 3, 4, 5, 6, 7, 8])
    text = [9, 1, 2, 3, 4]
    cheap = SuffixDrafter(24, 1.0, 0.1, pools, {1: 10.0, 2: 10.1, 4: 10.3, 8: 10.8, 16: 12.0})
    dear = SuffixDrafter(24, 1.0, 0.1, pools, DEAR)
    unsure = SuffixDrafter(24, 1.0, 0.1, SuffixPools(1000), {1: 10.0, 2: 10.1, 4: 10.3, 8: 10.8, 16: 12.0})
    assert cheap.draft(request(cheap.begin(text), text)).tokens == [5, 6, 7, 8]  # 4 matched tokens: 4 nodes
    assert dear.draft(request(dear.begin(text), text)).tokens == [5]  # one sure node pays, more do not
    unsure.pools.store(None).add([1, 2, 3, 4, 5])
    unsure.pools.store(None).add([1, 2, 3, 4, 6])
    unsure.pools.store(None).add([1, 2, 3, 4, 7])
    draft = unsure.draft(request(unsure.begin(text), text))
    assert sorted(draft.tokens) == [5, 6, 7] and draft.parents == [-1, -1, -1]  # a tree of three chances
    dear_unsure = SuffixDrafter(24, 1.0, 0.1, unsure.pools, DEAR)
    assert dear_unsure.draft(request(dear_unsure.begin(text), text)).tokens == []  # declines: plain decoding
    limited = cheap.draft(request(cheap.begin(text), text, k=2))
    assert limited.tokens == [5, 6]  # K is the tree's depth


def test_memory_reports_the_pools_bound(tiny_target):
    decoder = suffix_decoder(tiny_target, shared_tokens=1000)
    assert loaded_memory(decoder).pool == 1000 * POOL_BYTES_PER_TOKEN
    assert "earlier outputs" in "\n".join(loaded_memory(decoder).lines())
    assert loaded_memory(Decoder(loaded(tiny_target, "target"), None, "none")).pool == 0


def test_bad_settings_are_refused(tiny_target):
    for options in ({"min_prob": 1.5}, {"spec_factor": 0.0}, {"shared_tokens": -1}, {"max_match": 0}):
        with pytest.raises(QuickdraftError, match=next(iter(options))):
            suffix_decoder(tiny_target, **options)
    with pytest.raises(QuickdraftError, match="does not apply"):
        Decoder(loaded(tiny_target, "target"), None, "prompt-lookup", min_prob=0.2)


def test_looping_text_is_drafted_long(tiny_target):
    out = suffix_decoder(tiny_target).generate(LOOPING, max_new_tokens=40)
    assert max(len(step.draft_tokens) for step in out.steps) >= 4 and out.stats.accepted_tokens > 10
