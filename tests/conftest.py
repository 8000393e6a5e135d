"""Tiny randomly initialised models, built in seconds, for the unit tests."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from quickdraft.models import LoadedModel


def tiny_llama(seed: int, vocab: int = 32, layers: int = 2, hidden: int = 32, max_positions: int = 256,
               init_range: float = 0.3) -> LlamaForCausalLM:
    """A small Llama with weights wide enough that its next-token distributions are not flat."""
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        initializer_range=init_range,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(seed)  # test-only: makes the random weights reproducible
    return LlamaForCausalLM(config).eval()


def perturbed_copy(model: LlamaForCausalLM, noise: float, seed: int) -> LlamaForCausalLM:
    """A draft that agrees with the target often but not always: its weights plus noise."""
    draft = LlamaForCausalLM(model.config).eval()
    draft.load_state_dict(model.state_dict())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.add_(noise * torch.randn(parameter.shape, generator=generator))
    return draft


def loaded(model: LlamaForCausalLM, name: str) -> LoadedModel:
    return LoadedModel(model, None, name)


# The device-independent tests run on every device this machine has: the CPU always, CUDA where
# present (skipped elsewhere, with the reason in the report).
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                 reason="no CUDA device on this machine"))]


@pytest.fixture(scope="session")
def tiny_target() -> LlamaForCausalLM:
    return tiny_llama(seed=1)


@pytest.fixture(scope="session")
def tiny_draft(tiny_target: LlamaForCausalLM) -> LlamaForCausalLM:
    return perturbed_copy(tiny_target, noise=0.01, seed=2)
