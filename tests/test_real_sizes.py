"""Real sizes, made in the test at TinyLlama-1.1B's shape with random weights: a Q4_0 GGUF (the
default target's tokenizer) loads and generates on the llama.cpp backend with memory close to
llama-cpp-python's on the same file, writing nothing but the tokenizer; a bf16 safetensors folder
loads on the native backend at bf16 within 1.2x the checkpoint and at int4 within 1.2x its int4
weights and one layer at bf16. Memory is asserted, never time."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from transformers import LlamaConfig

from quickdraft.backends.llama_cpp import llama_cpp_installed
from quickdraft.bench.footprint import IMPORTS, LLAMA_CPP_PYTHON, QUICKDRAFT, footprint, python
from quickdraft.memory import backend_weight_bytes, shape_from_config
from quickdraft.models.embedded import default_gguf_path
from quickdraft.models.random_checkpoint import random_checkpoint
from quickdraft.models.random_gguf import GgufShape, random_gguf

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads peak RSS the Linux way")
needs_llama_cpp = pytest.mark.skipif(not llama_cpp_installed(), reason="llama-cpp-python is not installed")

ONE_B = GgufShape(hidden=2048, layers=22, ffn=5632, heads=32, kv_heads=4, head_dim=64, context=2048)
ONE_B_CONFIG = LlamaConfig(
    vocab_size=49152,
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=22,
    num_attention_heads=32,
    num_key_value_heads=4,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)
MEMORY_SHARE = 1.2  # the budget: peak RSS over the reference it names


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    return os.environ | {"XDG_CACHE_HOME": str(tmp_path_factory.mktemp("xdg")), "OMP_NUM_THREADS": "2"}


@pytest.fixture(scope="module")
def imports(env) -> int:
    """Peak RSS of a process that imports quickdraft and does nothing else."""
    return footprint(python(IMPORTS), env).peak_rss


@pytest.fixture(scope="module")
def one_b(tmp_path_factory) -> Path:
    return random_gguf(
        default_gguf_path(), tmp_path_factory.mktemp("real_sizes") / "r1b-Q4_0.gguf", ONE_B, dtype="Q4_0"
    )


@pytest.fixture(scope="module")
def one_b_bf16(tmp_path_factory) -> Path:
    return random_checkpoint(ONE_B_CONFIG, tmp_path_factory.mktemp("real_sizes") / "r1b-bf16")


@needs_llama_cpp
def test_a_1b_gguf_runs_on_llama_cpp_in_the_memory_llama_cpp_python_takes(one_b, env, imports):
    generate = [
        sys.executable,
        "-m",
        "quickdraft.cli",
        "generate",
        "The capital of France is",
        "--target",
        str(one_b),
        "--backend",
        "llama.cpp",
        "--method",
        "none",
        "--max-new-tokens",
        "8",
        "--threads",
        "2",
        "--no-chat",
    ]
    ours = footprint(generate, env).peak_rss
    peer = footprint(python(LLAMA_CPP_PYTHON, one_b, 8, 2), env).peak_rss
    file = one_b.stat().st_size
    print(json.dumps({"file": file, "quickdraft": ours, "llama-cpp-python": peer, "imports": imports}))
    # The model's share of the peak: what the process holds beyond its libraries.
    # (llama.cpp itself holds about twice the file here: its mapping, and the copy it repacks the
    # 4-bit blocks into for this CPU's kernels; a converted fp32 copy would add 7x the file.)
    assert ours - imports <= MEMORY_SHARE * peer, (ours, imports, peer)
    # Nothing converted: the cache holds the tokenizer and this machine's measurements only.
    cache = Path(env["XDG_CACHE_HOME"]) / "quickdraft"
    written = {path.relative_to(cache).parts[0] for path in cache.rglob("*") if path.is_file()}
    assert written <= {"tokenizers", "pass_shapes"}, written
    assert sum(path.stat().st_size for path in cache.rglob("*") if path.is_file()) < 20 << 20


@pytest.mark.parametrize("precision", ["bf16", "int4"])
def test_a_1b_bf16_checkpoint_loads_on_native_within_its_budget(one_b_bf16, env, imports, precision):
    ours = footprint(python(QUICKDRAFT, one_b_bf16, "native", precision, 1), env).peak_rss
    checkpoint = sum(path.stat().st_size for path in one_b_bf16.glob("*.safetensors"))
    shape = shape_from_config(ONE_B_CONFIG)
    if precision == "bf16":
        budget = checkpoint
    else:  # the int4 weights, and one layer's matrices at bf16 while they are rounded
        budget = backend_weight_bytes(shape, "native", "int4") + shape.layer_linear_params * 2
    print(json.dumps({"checkpoint": checkpoint, "peak": ours, "imports": imports, "budget": budget}))
    assert ours - imports <= MEMORY_SHARE * budget, (ours, imports, budget)


def test_a_1b_gguf_loads_on_native_int4_within_its_budget(one_b, env, imports):
    """The file's 4-bit blocks taken as they are, other tensors de-quantized a block of rows at a
    time, the file read rather than mapped: the int4 weights and one layer's budget, as from bf16."""
    ours = footprint(python(QUICKDRAFT, one_b, "native", "int4", 1), env).peak_rss
    shape = shape_from_config(ONE_B_CONFIG)
    budget = backend_weight_bytes(shape, "native", "int4") + shape.layer_linear_params * 2
    print(json.dumps({"peak": ours, "imports": imports, "budget": budget}))
    assert ours - imports <= MEMORY_SHARE * budget, (ours, imports, budget)
