"""Pass shapes chosen per machine: any kernel or padding gives every real row the same result,
the choice is measured once and read back from its file, and decoding is unchanged by it."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import torch
from conftest import loaded, tiny_llama
from seq_util import Seq
from spec_util import LOOPING, assert_speculated

from quickdraft import Decoder
from quickdraft.backends.hf import HFBackend
from quickdraft.backends.kernel_timing import (
    ROW_GRID,
    fastest_at_or_above,
    measure_pad_sizes,
    measure_pass_costs,
    measure_row_kernels,
)
from quickdraft.backends.native import NativeBackend
from quickdraft.models.linear import Kernel, apply_linear
from quickdraft.models.native_weights import NativeWeights

KERNELS = [Kernel(True, 0), Kernel(False, 0), Kernel(True, 16), Kernel(False, 12)]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8", "int4"])
def test_every_kernel_and_padding_gives_each_row_the_same_result(tiny_target, precision):
    weights = NativeWeights.from_model(tiny_target, precision)
    layers = [weights.lm_head, weights.layers[0].qkv, weights.layers[0].down]
    generator = torch.Generator().manual_seed(0)
    for linear in layers:
        x = torch.randn(5, linear.in_features, generator=generator).to(weights.dtype)  # [5, in]
        reference = apply_linear(linear, x, None)
        for kernel in KERNELS:
            got = apply_linear(linear, x, kernel)
            assert got.shape == reference.shape
            if precision == "fp32":  # two fp32 kernels may round differently in the last bits
                assert torch.allclose(got, reference, atol=1e-5), kernel
            else:  # below fp32 rows are computed on their own: padding changes nothing
                assert torch.equal(got, reference), kernel


def test_the_fastest_shape_at_or_above_each_row_count():
    costs = {(True, 1): 5.0, (False, 1): 2.0, (True, 2): 9.0, (False, 2): 9.0, (True, 4): 3.0, (False, 4): 8.0}
    assert fastest_at_or_above(costs, (1, 2, 4)) == {1: (False, 1), 2: (True, 4), 3: (True, 4), 4: (True, 4)}


def test_the_row_kernels_are_measured_once_then_read_from_their_file(tmp_path):
    weights = NativeWeights.from_model(tiny_llama(seed=1), "fp32")
    kernels = measure_row_kernels(weights, tmp_path, progress=False)
    [saved] = list(tmp_path.glob("*.json"))
    data = json.loads(saved.read_text())
    assert sorted(map(int, data["choice"])) == list(range(1, ROW_GRID[-1] + 1))
    assert all(isinstance(kernel, Kernel) and (kernel.rows == 0 or kernel.rows > n) for n, kernel in kernels.items())
    data["choice"] = {str(n): [False, 16] for n in range(1, 17)}  # as if this machine had measured that
    saved.write_text(json.dumps(data))
    assert measure_row_kernels(weights, tmp_path, progress=False) == {n: Kernel(False, 16) for n in range(1, 17)}
    # Nothing to choose for bf16: its column layout already pads every pass to 16 rows.
    assert measure_row_kernels(NativeWeights.from_model(tiny_llama(seed=1), "bf16"), tmp_path, progress=False) == {}


def test_the_timed_row_kernels_give_the_default_kernels_bits(tmp_path):
    """A choice made by timing changes speed, never an output: at fp32 the plain kernel, or padding,
    is kept for n rows only where those rows get the packed unpadded kernel's bits."""
    weights = NativeWeights.from_model(tiny_llama(seed=1), "fp32")
    kernels = measure_row_kernels(weights, tmp_path, progress=False)
    linears = [x for layer in weights.layers for x in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    generator = torch.Generator().manual_seed(9)
    with torch.inference_mode():
        for linear in [*linears, weights.lm_head]:
            x = torch.randn(ROW_GRID[-1], linear.in_features, generator=generator)
            for n, kernel in kernels.items():
                assert torch.equal(apply_linear(linear, x[:n], kernel), apply_linear(linear, x[:n], Kernel())), n


@pytest.mark.speculation
@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_forced_row_kernels_change_no_logit_and_no_token(tiny_target, precision):
    weights = NativeWeights.from_model(tiny_target, precision)
    plain, padded = (
        NativeBackend(weights, "t"),
        NativeBackend(weights, "t", row_kernels={n: Kernel(False, 16) for n in range(1, 17)}),
    )
    tokens = [5, 1, 4, 1, 5, 9, 2, 6]
    for n in (1, 3, 8):
        a, b = Seq(plain).forward(tokens[:n]), Seq(padded).forward(tokens[:n])
        assert torch.equal(a, b) if precision == "int4" else torch.allclose(a, b, atol=1e-5)
    target = loaded(tiny_target, "t")
    reference = Decoder(target, None, "none", precision=precision, measure_shapes=False)
    decoder = Decoder(
        target, None, "prompt-lookup", 4, precision=precision, measure_shapes=False, draft_length="fixed"
    )  # drafts every step: verify passes of several rows
    decoder.target_backend.row_kernels = padded.row_kernels  # this decoder's backend (not shared: measure_shapes=False)
    prompt = LOOPING  # drafts get accepted: passes of several rows decide tokens
    out = decoder.generate(prompt, 30)
    assert out.token_ids == reference.generate(prompt, 30).token_ids
    assert_speculated([out])


def test_the_transformers_backend_pads_passes_and_keeps_its_cache_exact(tiny_target, tmp_path):
    plain, padded = HFBackend(tiny_target, "t"), HFBackend(tiny_target, "t", pad_to={1: 4, 2: 4, 3: 8})
    a, b = Seq(plain), Seq(padded)
    for tokens in ([1, 2, 3, 4, 5], [6], [7, 8], [9, 10, 11]):
        assert torch.allclose(a.forward(tokens), b.forward(tokens), atol=1e-5)
        assert a.length == b.length
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)  # a tree pass, padded too
    mask = torch.cat([torch.ones(3, a.length, dtype=torch.bool), tree], dim=1)
    positions = [a.length, a.length + 1, a.length + 1]
    assert torch.allclose(
        a.forward([3, 4, 5], positions=positions, mask=mask),
        b.forward([3, 4, 5], positions=positions, mask=mask),
        atol=1e-5,
    )
    sizes = measure_pad_sizes(plain, tmp_path, progress=False)
    assert all(size > n for n, size in sizes.items()) and list(tmp_path.glob("*.json"))


def test_trees_read_in_place_only_below_fp32_where_the_check_passed_and_it_is_cached(tmp_path):
    from quickdraft.backends.kernel_timing import check_in_place_trees
    from quickdraft.models.row_attention import trees_read_in_place

    model = tiny_llama(seed=1)
    bf16 = NativeWeights.from_model(model, "bf16")
    assert check_in_place_trees(bf16, None) is False  # not checked: gather, always exact
    assert check_in_place_trees(NativeWeights.from_model(model, "fp32"), tmp_path) is False  # SDPA, no row groups
    assert not list(tmp_path.glob("*.json"))
    expected = trees_read_in_place(bf16.heads, bf16.kv_heads, bf16.head_dim)
    assert check_in_place_trees(bf16, tmp_path) is expected
    (saved,) = tmp_path.glob("*.json")
    saved.write_text(
        saved.read_text().replace(f'"choice": {str(expected).lower()}', f'"choice": {str(not expected).lower()}')
    )
    assert check_in_place_trees(bf16, tmp_path) is (not expected)  # read back, not checked again


class SleepingBackend:
    """A backend whose passes wait without computing: to this process, the cores were busy elsewhere."""

    name, precision, vocab_size, max_length, threads = "sleeper", "fp32", 16, 256, 1

    def __init__(self, device: str) -> None:
        self.device = torch.device(device)

    def new_cache(self, length=None):
        return SimpleNamespace(length=0, truncate=lambda n: None)

    def forward(self, passes):
        time.sleep(0.002)
        return [None for _ in passes]


def test_pass_costs_timed_while_the_cores_were_busy_are_used_not_kept(tmp_path):
    costs = measure_pass_costs(SleepingBackend("cpu"), tmp_path, progress=False)
    assert set(costs) == {1, 2, 4, 8, 16} and all(ms > 1 for ms in costs.values())
    assert not list(tmp_path.rglob("*.json"))  # nothing cached: a quiet load measures again
    measure_pass_costs(SleepingBackend("meta"), tmp_path, progress=False)  # not a CPU: waiting is the device's
    assert len(list(tmp_path.rglob("*.json"))) == 1


def test_the_bf16_kernel_is_measured_once_and_kept(tmp_path):
    from quickdraft.backends.kernel_timing import measure_dense_kernel
    from quickdraft.models.weights import ModuleWeights

    source = ModuleWeights(tiny_llama(seed=1))
    chosen = measure_dense_kernel(source.get, tmp_path, progress=False)
    assert chosen in ("bf16", "rows")
    kept = sorted(tmp_path.rglob("*"))
    assert kept and measure_dense_kernel(source.get, tmp_path, progress=False) == chosen
    assert sorted(tmp_path.rglob("*")) == kept


def test_whether_prompts_are_widened_is_measured_once_and_kept(tmp_path):
    from quickdraft.backends.kernel_timing import measure_prompt_kernel
    from quickdraft.models.weights import ModuleWeights

    source = ModuleWeights(tiny_llama(seed=1))
    chosen = measure_prompt_kernel(source.get, tmp_path, progress=False)
    assert isinstance(chosen, bool)
    kept = sorted(tmp_path.rglob("*"))
    assert kept and measure_prompt_kernel(source.get, tmp_path, progress=False) == chosen
    assert sorted(tmp_path.rglob("*")) == kept
