"""The one-read GGUF conversion gives transformers' own conversion, value for value: config,
every tensor (Llama's permuted q/k rows, Gemma's norm offsets, each quantized type), tokenizer."""

from __future__ import annotations

import pytest
import torch
from conftest import RANDOM_SHAPES
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from quickdraft.models import gguf_convert
from quickdraft.models.weights import GgufWeights, build_model

TEXT = "Hello world! The quick brown fox, 12345 <|im_start|> naïve   spaces\n\ttabs <eos>"
# transformers' own conversion takes 12 s a file for SmolLM2's vocabulary: one type there, all for Gemma's cut one.
KINDS = {"llama": ["Q4_K_M"], "gemma3": ["F32", "Q4_1", "Q4_K_M", "Q6_K"]}


def transformers_own(path):
    folder, name = str(path.parent), path.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, config=config, dtype=torch.float32)
    return config, model, AutoTokenizer.from_pretrained(folder, gguf_file=name)


@pytest.mark.parametrize("arch", list(RANDOM_SHAPES))
def test_it_equals_transformers_conversion(random_ggufs, arch):
    files = [random_ggufs[arch, kind] for kind in KINDS[arch] if (arch, kind) in random_ggufs]
    if not files:
        pytest.skip("the Gemma 3 270M packages are not installed (./setup.sh installs them)")
    for path in files:
        assert gguf_convert.fast_path(path)
        config = gguf_convert.read_config(path)
        model, tokenizer = build_model(config, GgufWeights(path, config)), gguf_convert.read_tokenizer(path, config)
        their_config, their_model, their_tokenizer = transformers_own(path)
        ours, theirs = config.to_dict(), their_config.to_dict()
        for key in ("_name_or_path", "dtype"):  # where it was read from; the dtype asked of from_config
            ours.pop(key), theirs.pop(key)
        assert ours == theirs, path.name
        mine, their_state = model.state_dict(), their_model.state_dict()
        assert mine.keys() == their_state.keys()
        assert all(torch.equal(mine[k], their_state[k]) for k in mine), path.name
        assert type(tokenizer) is type(their_tokenizer)
        assert tokenizer(TEXT)["input_ids"] == their_tokenizer(TEXT)["input_ids"]
        assert tokenizer.get_vocab() == their_tokenizer.get_vocab()
        assert tokenizer.chat_template == their_tokenizer.chat_template
        assert tokenizer.eos_token == their_tokenizer.eos_token
