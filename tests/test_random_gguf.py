"""Random GGUF files at chosen shapes in a real file's architecture and tokenizer, and their
quantized copies made by llama.cpp's quantizer."""

from __future__ import annotations

import pytest
from conftest import RANDOM_SHAPES
from gguf import GGMLQuantizationType

from quickdraft.backends.backend import SeqPass
from quickdraft.backends.llama_cpp import LlamaCppBackend, llama_cpp_installed
from quickdraft.errors import QuickdraftError
from quickdraft.models import default_gguf_path
from quickdraft.models.gguf_convert import read_table
from quickdraft.models.random_gguf import GgufShape, quantize_gguf, random_gguf


@pytest.mark.parametrize("arch", list(RANDOM_SHAPES))
def test_the_file_has_the_asked_shapes_and_the_real_files_tokenizer(random_ggufs, arch):
    if (arch, "F32") not in random_ggufs:
        pytest.skip("the Gemma 3 270M packages are not installed (./setup.sh installs them)")
    shape = RANDOM_SHAPES[arch]
    metadata, tensors = read_table(random_ggufs[arch, "F32"])
    assert metadata["general.architecture"] == arch and metadata[f"{arch}.block_count"] == shape.layers
    assert metadata[f"{arch}.embedding_length"] == shape.hidden and metadata["general.file_type"] == 0
    by_name = {t.name: t for t in tensors}
    assert {t.kind for t in tensors} == {GGMLQuantizationType.F32}
    assert by_name["blk.0.attn_q.weight"].shape == (shape.heads * shape.head_dim, shape.hidden)
    assert by_name[f"blk.{shape.layers - 1}.ffn_down.weight"].shape == (shape.hidden, shape.ffn)
    vocab = by_name["token_embd.weight"].shape[0]
    assert metadata["tokenizer.ggml.tokens"] == vocab == (8192 if arch == "gemma3" else 49152)
    if shape.window:
        assert metadata[f"{arch}.attention.sliding_window"] == shape.window


@pytest.mark.skipif(not llama_cpp_installed(), reason="llama-cpp-python is not installed (./setup.sh builds it)")
def test_quantized_copies_hold_the_types_named_and_run(random_ggufs):
    kinds = {
        name: {t.kind for t in read_table(random_ggufs["llama", name])[1]}
        for name in ("Q4_0", "Q4_1", "Q8_0", "Q4_K_M", "Q6_K")
    }
    Q = GGMLQuantizationType
    assert Q.Q4_0 in kinds["Q4_0"] and Q.Q4_1 in kinds["Q4_1"] and Q.Q8_0 in kinds["Q8_0"]
    assert Q.Q4_K in kinds["Q4_K_M"] and Q.Q6_K in kinds["Q4_K_M"] and Q.Q6_K in kinds["Q6_K"]
    backend = LlamaCppBackend(random_ggufs["llama", "Q4_K_M"], "random")
    assert backend.vocab_size == 49152 and backend.hidden_size == RANDOM_SHAPES["llama"].hidden


@pytest.mark.skipif(not llama_cpp_installed(), reason="llama-cpp-python is not installed (./setup.sh builds it)")
def test_an_unknown_file_type_is_refused(random_ggufs, tmp_path):
    with pytest.raises(QuickdraftError, match="not one of"):
        quantize_gguf(random_ggufs["llama", "F32"], tmp_path / "x.gguf", "Q3_X")
    assert not (tmp_path / "x.gguf").exists()


def test_f16_files_keep_norms_in_f32_and_bad_dtypes_are_refused(tmp_path):
    shape = GgufShape(hidden=64, layers=1, ffn=128, heads=2, kv_heads=1, head_dim=32)
    path = random_gguf(default_gguf_path(), tmp_path / "half.gguf", shape, dtype="F16")
    metadata, tensors = read_table(path)
    kinds = {t.name: t.kind for t in tensors}
    assert metadata["general.file_type"] == 1 and kinds["blk.0.attn_q.weight"] == GGMLQuantizationType.F16
    assert kinds["blk.0.attn_norm.weight"] == GGMLQuantizationType.F32
    with pytest.raises(QuickdraftError, match="F32, F16 or Q4_0"):
        random_gguf(default_gguf_path(), tmp_path / "x.gguf", shape, dtype="BF16")


def test_q4_0_files_are_written_as_blocks_with_the_asked_spread(tmp_path):
    shape = GgufShape(hidden=256, layers=1, ffn=512, heads=4, kv_heads=2, head_dim=64)
    path = random_gguf(default_gguf_path(), tmp_path / "q4.gguf", shape, dtype="Q4_0")
    metadata, tensors = read_table(path)
    by_name = {t.name: t for t in tensors}
    assert metadata["general.file_type"] == 2
    assert by_name["blk.0.ffn_up.weight"].kind == GGMLQuantizationType.Q4_0
    assert by_name["blk.0.ffn_up.weight"].shape == (512, 256)
    assert by_name["blk.0.attn_norm.weight"].kind == GGMLQuantizationType.F32
    values = by_name["blk.0.ffn_up.weight"].values()  # ~ N(0, 1/256) in spread, as the float files are
    assert abs(values.std() * 256**0.5 - 1) < 0.05
    if llama_cpp_installed():  # llama.cpp loads it and computes finite logits
        backend = LlamaCppBackend(path, "q4")
        logits = backend.forward([SeqPass(backend.new_cache(), [1, 2, 3])])[0].logits
        assert logits.isfinite().all()
