"""Weight sources: the native backend built tensor by tensor from a GGUF file or a safetensors folder
computes what it computes from the transformers model of the same weights, bit for bit; a file's
4-bit blocks are its own weights; bad files give one clear error naming the file and the tensor."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from quickdraft.backends.backend import SeqPass
from quickdraft.backends.native import NativeBackend
from quickdraft.errors import QuickdraftError
from quickdraft.models import gguf_convert
from quickdraft.models.embedded import default_gguf_path
from quickdraft.models.loading import load_model
from quickdraft.models.native_weights import NativeWeights
from quickdraft.models.quantize import dequantize_int4
from quickdraft.models.weights import GgufWeights, SafetensorsWeights, build_model

PROMPT = [1, 510, 3575, 282, 4649, 314, 7]


def logits(weights: NativeWeights, prompt: list[int]) -> torch.Tensor:
    backend = NativeBackend(weights, "m")
    return backend.forward([SeqPass(backend.new_cache(), prompt, logits="all")])[0].logits


@pytest.fixture(scope="module")
def default_gguf():
    path = default_gguf_path()
    config = gguf_convert.read_config(path)
    return path, config, build_model(config, GgufWeights(path, config))


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])  # int8: rounded a block of rows at a time
def test_native_from_the_gguf_file_equals_native_from_the_transformers_model(default_gguf, precision):
    path, config, model = default_gguf
    source = GgufWeights(path, config)
    ours = NativeWeights.from_source(config, source, precision)
    old = NativeWeights.from_model(model, precision)
    assert torch.equal(logits(ours, PROMPT), logits(old, PROMPT))


def test_int4_from_the_gguf_file_takes_its_blocks_unchanged(default_gguf):
    """Every Q4_1 matrix of the default target becomes int4 with the file's own values (no second
    rounding): the blocks de-quantize to what transformers reads from the file."""
    path, config, model = default_gguf
    source, state = GgufWeights(path, config), model.state_dict()
    names = [name for name in source.names() if source.int4_blocks(name) is not None]
    assert len(names) == 7 * config.num_hidden_layers
    for name in names:
        assert torch.equal(dequantize_int4(source.int4_blocks(name)), state[name]), name


def test_q4_k_blocks_of_a_quantized_file_are_its_weights(random_ggufs):
    path = random_ggufs.get(("llama", "Q4_K_M"))
    if path is None:
        pytest.skip("llama.cpp's quantizer is not installed")
    config = gguf_convert.read_config(path)
    source = GgufWeights(path, config)
    q4_k = [name for name in source.names() if source.tensor(name).kind.name == "Q4_K"]
    assert any("q_proj" in name for name in q4_k)  # rows permuted on the way (Llama's q and k)
    for name in q4_k:
        np.testing.assert_allclose(
            dequantize_int4(source.int4_blocks(name)).numpy(), source.get(name).numpy(), rtol=0, atol=1e-5, err_msg=name
        )


def test_row_blocks_are_the_rows_of_the_whole_tensor(default_gguf, random_ggufs, tiny_target, tmp_path):
    """row_blocks on every source, blocks of at most the rows asked for; in a GGUF file through
    Llama's q/k row permutation and a Q4_K file's blocks."""
    path, config, _ = default_gguf
    tiny_target.save_pretrained(tmp_path / "m")
    sources = [GgufWeights(path, config), SafetensorsWeights(tmp_path / "m"), load_model(tiny_target).weights]
    quantized = random_ggufs.get(("llama", "Q4_K_M"))
    if quantized is not None:
        sources.append(GgufWeights(quantized, gguf_convert.read_config(quantized)))
    for source in sources:
        names = [n for n in sorted(source.names()) if len(source.shape(n)) == 2 and "layers.0." in n or "embed" in n]
        assert any("q_proj" in name for name in names)
        for name in names:
            blocks = list(source.row_blocks(name, 7))
            assert max(len(block) for block in blocks) == 7 and len(blocks) == -(-source.shape(name)[0] // 7)
            assert torch.equal(torch.cat(blocks), source.get(name)), (type(source), name)


def test_native_from_a_bf16_safetensors_folder_equals_native_from_its_transformers_model(tiny_target, tmp_path):
    copy.deepcopy(tiny_target).to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    folder = tmp_path / "bf16"
    source = SafetensorsWeights(folder)
    assert source.get("model.norm.weight").dtype == torch.bfloat16  # read in the checkpoint's dtype
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    loaded = load_model(folder)
    for precision in ("bf16", "int4"):
        ours = NativeWeights.from_source(loaded.config, loaded.weights, precision)
        old = NativeWeights.from_model(model, precision)
        assert torch.equal(logits(ours, [3, 4, 5, 6]), logits(old, [3, 4, 5, 6])), precision
    assert not loaded.built  # no transformers model was built


def test_a_safetensors_folder_missing_a_tensor_names_it(tiny_target, tmp_path):
    tiny_target.save_pretrained(tmp_path / "m")
    tensors = load_file(tmp_path / "m" / "model.safetensors")
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, tmp_path / "m" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(QuickdraftError, match=r"model folder .*/m has no tensor model.layers.1.mlp.down_proj.weight"):
        load_model(tmp_path / "m")


def test_a_config_that_does_not_match_the_tensors_names_the_tensor(tiny_target, tmp_path):
    tiny_target.save_pretrained(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["intermediate_size"] *= 2
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        QuickdraftError,
        match=r"tensor model.layers.0.mlp.gate_proj.weight has shape \[64, 32\], "
        r"its config says \[128, 32\]",
    ):
        load_model(tmp_path / "m")


def test_a_gguf_whose_metadata_does_not_match_its_tensors_names_the_tensor(random_ggufs, tmp_path):
    data = bytearray(random_ggufs["llama", "F32"].read_bytes())
    key = b"llama.feed_forward_length"
    at = data.index(key) + len(key) + 4  # past the value's type: the uint32 itself
    data[at : at + 4] = (1024).to_bytes(4, "little")
    path = tmp_path / "odd.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(
        QuickdraftError,
        match=r"GGUF file .*odd.gguf: tensor model.layers.0.mlp.\w+_proj.weight has "
        r"shape \[\d+, \d+\], its config says",
    ):
        load_model(path, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()  # nothing cached for a bad file


def test_a_truncated_safetensors_file_names_the_tensor(tiny_target, tmp_path):
    tiny_target.save_pretrained(tmp_path / "m")
    file = tmp_path / "m" / "model.safetensors"
    file.write_bytes(file.read_bytes()[:-1000])
    with pytest.raises(QuickdraftError, match=r"model.safetensors ends inside tensor \S+ .*truncated"):
        load_model(tmp_path / "m")
