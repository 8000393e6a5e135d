"""The native backend computes what the transformers backend computes, within fp32 rounding."""

import pytest
import torch
from conftest import loaded, tiny_llama
from seq_util import hf, native
from spec_util import LOOPING, assert_speculated
from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

from quickdraft import Decoder, QuickdraftError
from quickdraft.backends.hf import HFBackend
from quickdraft.backends.select import make_backend
from quickdraft.models.loading import LoadedModel
from quickdraft.models.native_weights import NativeWeights, supports
from quickdraft.tree import tree_mask


def tiny_qwen2(seed: int = 4) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        initializer_range=0.3,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)  # test-only: reproducible random weights
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:  # Qwen2 has q/k/v biases: make them matter
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.3)
    return model


MODELS = {
    "llama": lambda: tiny_llama(seed=1),
    "qwen2": tiny_qwen2,
    "llama-mha-tied": lambda: tiny_llama(seed=2, layers=3),
}


@pytest.mark.parametrize("name", MODELS)
def test_native_matches_transformers_through_a_whole_session(name):
    model = MODELS[name]()
    ours, reference = native(model), hf(model)
    script = [
        ("forward", [5, 1, 4, 1, 5, 9, 2]),  # prefill
        ("forward", [6]),  # one-token decode
        ("forward", [5, 3, 5, 8]),  # multi-token verify
        ("truncate", 9),  # rollback
        ("forward", [7, 7]),
    ]
    for op, arg in script:
        if op == "truncate":
            ours.truncate(arg)
            reference.truncate(arg)
            continue
        assert torch.allclose(ours.forward(arg), reference.forward(arg), atol=1e-4), (name, op, arg)
    # A tree pass with explicit positions and mask, then keeping one path.
    parents = [-1, 0, -1, 2]
    start = ours.length
    mask = torch.cat([torch.ones(5, start, dtype=torch.bool), tree_mask(parents)], dim=1)
    positions = [start, start + 1, start + 2, start + 1, start + 2]
    a = ours.forward([3, 1, 2, 8, 9], positions=positions, mask=mask)
    b = reference.forward([3, 1, 2, 8, 9], positions=positions, mask=mask)
    assert torch.allclose(a, b, atol=1e-4)
    keep = [*range(start + 1), start + 3, start + 4]
    ours.keep(keep)
    reference.keep(keep)
    assert ours.length == reference.length == start + 3
    assert torch.allclose(ours.forward([4]), reference.forward([4]), atol=1e-4)


def test_rollback_is_a_pointer_and_equals_a_fresh_forward():
    model = tiny_llama(seed=1)
    seq = native(model)
    seq.forward([1, 2, 3, 4, 5, 6])
    seq.truncate(3)
    again = seq.forward([4, 5, 6])
    seq.reset()
    assert torch.allclose(again, seq.forward([1, 2, 3, 4, 5, 6])[3:], atol=1e-5)


def test_cache_grows_past_its_first_allocation():
    model = tiny_llama(seed=1, max_positions=600)
    ours, reference = native(model), hf(model)
    for seq in (ours, reference):
        seq.forward(list(range(1, 31)) * 9)  # 270 tokens: past the first 256 slots
    assert torch.allclose(ours.forward([3]), reference.forward([3]), atol=1e-4)


@pytest.mark.speculation
@pytest.mark.parametrize("method", ["draft", "prompt-lookup", "self-spec", "lookahead"])
def test_speculation_on_the_native_backend_equals_plain_transformers_decoding(tiny_target, tiny_draft, method):
    plain = Decoder(loaded(tiny_target, "t"), None, "none", backend="hf")
    draft = loaded(tiny_draft, "d") if method == "draft" else None
    options = {"layers": 1} if method == "self-spec" else {}
    # fixed: every step drafts (prompt lookup's cost model may choose K = 0)
    spec = Decoder(loaded(tiny_target, "t"), draft, method, 3, backend="native", draft_length="fixed", **options)
    outputs = []
    for prompt in ([1, 2, 3], [5, 9, 9, 2, 7, 1, 5, 9], LOOPING):
        outputs.append(spec.generate(prompt, max_new_tokens=33))
        assert outputs[-1].token_ids == plain.generate(prompt, max_new_tokens=33).token_ids
    assert_speculated(outputs)


def test_unsupported_architecture_falls_back_or_is_refused():
    config = GPT2Config(vocab_size=32, n_embd=16, n_layer=1, n_head=2, n_positions=64)
    gpt2 = LoadedModel.of(GPT2LMHeadModel(config).eval(), None, "gpt2-tiny")
    assert not supports(gpt2.config)
    assert isinstance(make_backend(gpt2, "auto"), HFBackend)
    with pytest.raises(QuickdraftError, match="native backend supports"):
        make_backend(gpt2, "native")
    with pytest.raises(QuickdraftError, match="unknown backend"):
        make_backend(gpt2, "fast")
    out = Decoder(gpt2, None, "prompt-lookup", 3).generate([1, 2, 3, 1, 2], max_new_tokens=10)
    assert len(out.token_ids) == 10


def test_backends_and_weights_are_made_once_per_model(tiny_target):
    target = loaded(tiny_target, "t")
    first = make_backend(target)
    second = make_backend(target, layers=[0])
    assert first.weights is second.weights and first.row_kernels is second.row_kernels
    assert make_backend(target) is first
    a, b = Decoder(target, None, "prompt-lookup"), Decoder(target, None, "none").with_method("lookahead")
    assert a.target_backend is b.target_backend is first


def test_bf16_logits_stay_close_to_fp32(tiny_target):
    tokens = [5, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    a, b = native(tiny_target).forward(tokens), native(tiny_target, "bf16").forward(tokens)
    # bfloat16 keeps 8 bits of mantissa: logits agree to a few percent of their spread.
    assert (a - b).abs().max() < 0.05 * (a.max() - a.min())
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.9
    # Decoding runs end to end at bf16 (exact equality with plain bf16 decoding is not promised:
    # bf16 rounding depends on how many tokens share a pass; see the README).
    out = Decoder(loaded(tiny_target, "t"), None, "prompt-lookup", 3, precision="bf16").generate(
        [1, 2, 3], max_new_tokens=20
    )
    assert len(out.token_ids) == 20


def test_bf16_on_the_hf_backend_is_transformers_model_in_bf16(tiny_target):
    target = loaded(tiny_target, "t")
    assert Decoder(target, None, "none", backend="hf", precision="bf16").target_backend.model.dtype == torch.bfloat16
    assert tiny_target.dtype == torch.float32  # a copy: the model passed in is left as it is
    with pytest.raises(QuickdraftError, match="unknown precision"):
        Decoder(loaded(tiny_target, "t"), None, "none", precision="fp8")


def test_packed_linear_matches_f_linear_for_every_row_count():
    from quickdraft.models.linear import PackedLinear

    torch.manual_seed(0)  # test-only: reproducible random weights
    weight, bias = torch.randn(48, 32), torch.randn(48)
    for dtype, tolerance in ((torch.float32, 1e-4), (torch.bfloat16, 0.1)):
        layer = PackedLinear(weight.to(dtype), bias.to(dtype))
        for rows in (1, 2, 3, 8, 17):
            x = torch.randn(rows, 32).to(dtype)
            expected = torch.nn.functional.linear(x.float(), weight.to(dtype).float(), bias.to(dtype).float())
            assert torch.allclose(layer(x).float(), expected, atol=tolerance, rtol=0.02), (dtype, rows)


def test_unpacked_weights_compute_the_same_logits():
    model = tiny_llama(seed=2)
    packed = native(model)
    plain_weights = NativeWeights.from_model(model, pack=False)
    assert all(layer.qkv._packed is None for layer in plain_weights.layers)
    plain = native(model, weights=plain_weights)
    tokens = [5, 9, 2, 7, 1, 3, 8, 4]
    assert torch.allclose(packed.forward(tokens), plain.forward(tokens), atol=1e-4)
    assert torch.allclose(packed.forward([6]), plain.forward([6]), atol=1e-4)


def tiny_gemma3(seed: int = 0):
    """A small Gemma 3 with sliding layers (window 6) around a full one, norms away from their zero start."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        sliding_window=6,
        max_position_embeddings=128,
        query_pre_attn_scalar=8,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(seed)  # test-only: reproducible random weights
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return model


def test_gemma3_logits_equal_transformers_across_the_sliding_window():
    model = tiny_gemma3()
    tokens = [(7 * i + 3) % 64 for i in range(20)]
    with torch.no_grad():
        reference = model(torch.tensor([tokens])).logits[0]  # [20, V]
    seq = native(model)
    got = torch.cat([seq.forward(tokens[:9]), seq.forward(tokens[9:12]), seq.forward(tokens[12:])])
    assert torch.allclose(got, reference, atol=1e-4)
    seq.truncate(10)  # roll back past the window edge and go again
    assert torch.allclose(seq.forward(tokens[10:]), reference[10:], atol=1e-4)


@pytest.mark.speculation
def test_gemma3_speculation_equals_plain_greedy_and_transformers():
    model = tiny_gemma3()
    target = LoadedModel.of(model, None, "gemma")
    plain = Decoder(target, None, "none", measure_shapes=False)
    assert plain.backend_kind == "native"
    prompt = [5, 9, 9, 2, 7, 1, 5, 9]
    reference = plain.generate(prompt, max_new_tokens=30).token_ids
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=30, min_new_tokens=30, do_sample=False)
    assert reference == out[0, len(prompt) :].tolist()
    for method, options in (
        ("prompt-lookup", {"draft_length": "fixed"}),
        ("lookahead", {}),
        ("self-spec", {"layers": 2}),
    ):
        spec = Decoder(target, None, method, 4, measure_shapes=False, **options)
        out = spec.generate(prompt, max_new_tokens=30)
        assert out.token_ids == reference, method
        assert_speculated([out], label=method)


def test_gemma3_below_fp32_and_on_the_static_backend_is_refused_or_goes_to_transformers():
    model = tiny_gemma3()
    with pytest.raises(QuickdraftError, match="Gemma 3 runs on the native backend at fp32"):
        Decoder(
            LoadedModel.of(model, None, "gemma"), None, "none", backend="native", precision="bf16", measure_shapes=False
        )
    with pytest.raises(QuickdraftError, match="static backend supports"):
        Decoder(LoadedModel.of(model, None, "gemma"), None, "none", backend="static", measure_shapes=False)
    assert supports(model.config) and supports(model.config, "fp32") and not supports(model.config, "bf16")
