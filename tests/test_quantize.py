"""Weight-only quantization: the formats, the CPU kernels that use them, and GGUF's 4-bit blocks."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from quickdraft.models.gguf_blocks import unpack_int4_blocks
from quickdraft.models.quantize import dequantize_int4, dequantize_int8, quantize_int4, quantize_int8, stack_int4
from quickdraft.models.quantized_linear import Int4Linear, Int8Linear, quantized_linear


def weight(out_features: int = 64, in_features: int = 96, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(out_features, in_features, generator=generator) * 0.05 + 0.01


def test_int8_rounds_each_weight_to_within_half_a_step():
    w = weight()
    q = quantize_int8(w)
    assert q.q.dtype == torch.int8 and q.q.abs().max() <= 127
    assert ((dequantize_int8(q) - w).abs() <= q.scales[:, None] / 2 + 1e-7).all()
    assert torch.equal(q.q.abs().amax(dim=1), torch.full((64,), 127, dtype=torch.int8))  # full range used


def test_int4_rounds_each_weight_to_within_half_a_step_of_its_group():
    w = weight()
    q = quantize_int4(w, group=32)
    assert q.q.dtype == torch.uint8 and int(q.q.max()) <= 15 and q.scales.shape == (64, 3)
    error = (dequantize_int4(q) - w).abs().view(64, 3, 32)
    assert (error <= q.scales[..., None] / 2 + 1e-6).all()


def test_int4_needs_whole_groups():
    with pytest.raises(ValueError, match="divisible"):
        quantize_int4(weight(in_features=48), group=32)


def test_stacking_int4_weights_stacks_their_rows():
    a, b = quantize_int4(weight(seed=1)), quantize_int4(weight(out_features=32, seed=2))
    assert torch.equal(dequantize_int4(stack_int4([a, b])), torch.cat([dequantize_int4(a), dequantize_int4(b)]))


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_quantized_linear_computes_x_times_its_dequantized_weight(kind):
    w, bias = weight(), torch.randn(64)
    layer = quantized_linear(w, bias, kind, torch.bfloat16)
    exact_weight = dequantize_int8(quantize_int8(w)) if kind == "int8" else dequantize_int4(quantize_int4(w))
    x = torch.randn(5, 96).bfloat16()
    expected = x.float() @ exact_weight.T + bias
    # bf16 activations, scales and output: within a few bf16 steps of the fp32 product.
    assert (layer(x).float() - expected).abs().max() < 0.02 * expected.abs().max()


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_each_row_of_a_pass_gets_the_bits_it_gets_alone(kind):
    """The property that makes low-precision speculation exact: a verify pass of n rows gives
    each row what a one-token pass gives it."""
    layer = quantized_linear(weight(), None, kind, torch.bfloat16)
    x = torch.randn(33, 96).bfloat16()
    alone = torch.cat([layer(x[i : i + 1]) for i in range(33)])
    for n in (2, 3, 8, 17, 33):
        assert torch.equal(layer(x[:n]), alone[:n]), n


def test_int4_falls_back_to_int8_where_its_kernel_cannot_go():
    assert isinstance(quantized_linear(weight(out_features=40), None, "int4", torch.bfloat16), Int8Linear)
    assert isinstance(quantized_linear(weight(in_features=48), None, "int4", torch.bfloat16), Int8Linear)
    assert isinstance(quantized_linear(weight(), None, "int4", torch.bfloat16), Int4Linear)
    with pytest.raises(ValueError, match="unknown"):
        quantized_linear(weight(), None, "int2", torch.bfloat16)


@pytest.mark.parametrize("kind", [GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1])
def test_gguf_4_bit_blocks_map_onto_int4_exactly(kind):
    w = weight(out_features=16, in_features=128).numpy()
    raw = quantize(w, kind)  # [16, 4 blocks * bytes]
    mapped = unpack_int4_blocks(raw, kind)
    assert mapped.group == 32 and mapped.q.shape == (16, 128)
    # Our (q - 8) * scale + zero reproduces gguf's own dequantisation to fp32 rounding.
    np.testing.assert_allclose(dequantize_int4(mapped).numpy(), dequantize(raw, kind), rtol=0, atol=1e-6)


def test_q4_k_super_blocks_map_onto_int4_exactly():
    rng = np.random.default_rng(0)  # test-only: arbitrary bytes are valid Q4_K blocks, but for d and dmin
    raw = rng.integers(0, 256, (8, 2, 144), dtype=np.uint8)  # 8 rows of 512 weights
    raw[..., 0:2] = np.full((8, 2, 1), 0.01, dtype=np.float16).view(np.uint8)
    raw[..., 2:4] = np.full((8, 2, 1), 0.003, dtype=np.float16).view(np.uint8)
    raw = raw.reshape(8, -1)
    mapped = unpack_int4_blocks(raw, GGMLQuantizationType.Q4_K)
    assert mapped.group == 32 and mapped.q.shape == (8, 512)
    np.testing.assert_allclose(
        dequantize_int4(mapped).numpy(), dequantize(raw, GGMLQuantizationType.Q4_K), rtol=0, atol=1e-5
    )
