"""The row-exact matrix products of setup.sh's llama.cpp (patches/llama-cpp-row-exact-matmul.patch):
for every weight type they cover, a token's row of an N-row decode equals its row of one-token
decodes bit for bit, N = 1..63, on this machine's kernels; and they compute the product (their rows
agree with stock ggml's, which a 64-row decode still takes, within quantization noise)."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import torch
from llama_cpp_util import random_tokens

from quickdraft.backends.backend import SeqPass
from quickdraft.backends.llama_cpp import (
    ROW_EXACT_MATMUL,
    ROW_INVARIANT_ROWS,
    LlamaCppBackend,
    build_description,
    installed_patches,
    llama_cpp_installed,
)
from quickdraft.models.random_gguf import quantize_gguf

pytestmark = pytest.mark.skipif(
    not llama_cpp_installed() or ROW_EXACT_MATMUL not in installed_patches(),
    reason="needs setup.sh's llama.cpp build (patches/llama-cpp-row-exact-matmul.patch)",
)

# file type -> the matrix types the kernels must meet in it (llama.cpp's quantizer mixes K-quant files)
KINDS = {
    "Q4_0": {"Q4_0"},
    "Q4_1": {"Q4_1"},
    "Q5_0": {"Q5_0"},
    "Q8_0": {"Q8_0"},
    "Q4_K_M": {"Q4_K", "Q6_K"},
    "Q5_K_M": {"Q5_K", "Q6_K"},
    "Q6_K": {"Q6_K"},
}
SIZES = (1, 2, 3, 4, 5, 7, 8, 9, 16, 33, 63)
CONTEXT = 40


@pytest.fixture(scope="module")
def files(random_ggufs, tmp_path_factory) -> dict:
    """(arch, kind) -> a random file of each KINDS type: the shared ones, and the rest quantized here."""
    folder = tmp_path_factory.mktemp("kernel_files")
    made = {}
    for arch in {arch for arch, _ in random_ggufs}:
        for kind in KINDS:
            made[arch, kind] = random_ggufs.get((arch, kind)) or quantize_gguf(
                random_ggufs[arch, "F32"], folder / f"{arch}-{kind}.gguf", kind
            )
    return made


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_rows_of_a_decode_of_any_size_equal_one_token_rows(files, arch, kind):
    if (arch, kind) not in files:
        pytest.skip("the Gemma 3 270M packages are not installed (./setup.sh installs them)")
    path = files[arch, kind]
    held = {t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
    assert KINDS[kind] <= held, (kind, held)  # the kernels under test are the ones the file takes
    backend = LlamaCppBackend(path, kind, threads=2, check_exact_rows=lambda _: ROW_INVARIANT_ROWS)
    generator = torch.Generator().manual_seed(3)
    context, new = (
        random_tokens(generator, CONTEXT, backend.vocab_size),
        random_tokens(generator, ROW_INVARIANT_ROWS, backend.vocab_size),
    )
    cache = backend.new_cache()
    backend.forward([SeqPass(cache, context, logits="none")])
    one = backend._rows_after(cache, CONTEXT, [[token] for token in new])  # [63, V]
    for n in SIZES:
        rows = backend._rows_after(cache, CONTEXT, [new[:n]])  # one decode of n rows
        assert torch.equal(rows, one[:n]), (arch, kind, n, (rows - one[:n]).abs().max().item())
    cache.truncate(0)
    assert backend.measure_exact_rows() == ROW_INVARIANT_ROWS  # the load-time guard finds the same


@pytest.mark.parametrize("kind", KINDS)
def test_the_kernels_compute_what_stock_ggml_does(files, kind):
    """A decode of 64 rows still takes ggml's own kernels (and tiled attention): the row-exact rows
    of the same tokens agree with its rows up to quantization noise. A wrong scale, sign or offset in
    a kernel would not."""
    backend = LlamaCppBackend(files["llama", kind], kind, threads=2, check_exact_rows=lambda _: ROW_INVARIANT_ROWS)
    new = random_tokens(torch.Generator().manual_seed(5), ROW_INVARIANT_ROWS + 1, backend.vocab_size)
    cache = backend.new_cache()
    ours = torch.cat([backend.forward([SeqPass(cache, part)])[0].logits for part in (new[:-1], new[-1:])])
    cache.truncate(0)
    stock = decode_at_once(backend, cache.seq, new)
    error = (ours - stock).abs().mean() / stock.abs().mean()
    agree = (ours.argmax(-1) == stock.argmax(-1)).float().mean()
    assert error < 0.03 and agree >= 0.9, (kind, error.item(), agree.item())


def decode_at_once(backend: LlamaCppBackend, seq: int, new: list[int]) -> torch.Tensor:
    """Logits [len(new), V] of one llama.cpp decode of `new` in sequence `seq` from position 0, through
    its own API (the backend never decodes more than ROW_INVARIANT_ROWS tokens at once); rolled back."""
    import llama_cpp as lib
    import numpy as np

    batch = lib.llama_batch_init(len(new), 0, 1)
    try:
        batch.n_tokens = len(new)
        for i, token in enumerate(new):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, i, 1, True
            batch.seq_id[i][0] = seq
        assert lib.llama_decode(backend._context, batch) == 0
        rows = [
            np.ctypeslib.as_array(lib.llama_get_logits_ith(backend._context, i), shape=(backend.vocab_size,))
            for i in range(len(new))
        ]
        return torch.from_numpy(np.stack(rows)).clone()
    finally:
        lib.llama_batch_free(batch)
        lib.llama_memory_seq_rm(lib.llama_get_memory(backend._context), seq, 0, -1)


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="reads the CPU's flags from /proc/cpuinfo")
@pytest.mark.skipif("llama-cpp-cpu-variants.patch" not in installed_patches(), reason="a build without CPU variants")
def test_the_cpu_back_end_is_the_best_variant_this_cpu_runs():
    """setup.sh builds the CPU back end for AVX2 and for AVX-512 VNNI, installed beside libggml, which
    loads the best one the CPU runs: the row-exact kernels then use VNNI dot products where it has them."""
    import llama_cpp as lib

    folder = Path(lib.__file__).parent / "lib"
    assert {"libggml-cpu-haswell.so", "libggml-cpu-cascadelake.so"} <= {p.name for p in folder.iterdir()}
    lib.llama_backend_init()
    info = lib.llama_print_system_info().decode()
    flags = set(Path("/proc/cpuinfo").read_text().split())
    vnni = {"avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw", "avx512_vnni"} <= flags
    assert "AVX2 = 1" in info
    assert ("AVX512_VNNI = 1" in info) == vnni, info


def test_reports_name_the_build_they_measured():
    """Bench reports print this beside llama.cpp's figures: a stock build and setup.sh's differ in speed."""
    assert build_description().startswith("llama-cpp-python 0.3.36, setup.sh's build (")
    assert ROW_EXACT_MATMUL in build_description()
