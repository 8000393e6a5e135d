"""Each precision of the native backend: logits within a stated tolerance of fp32, and greedy
speculation equal, token for token, to plain greedy decoding at the same precision."""

import copy

import pytest
import torch
from conftest import loaded, tiny_llama
from seq_util import Seq, native
from spec_util import assert_speculated, speculated
from test_native import tiny_qwen2

from quickdraft import Decoder, QuickdraftError
from quickdraft.backends.native import NativeBackend
from quickdraft.models.native_weights import NativeWeights
from quickdraft.models.quantize import dequantize_int4, dequantize_int8, quantize_int4, quantize_int8
from quickdraft.models.quantized_linear import Int4Linear, Int8Linear

TOKENS = [5, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3]


def on_quantized_values(model: torch.nn.Module, kind: str) -> torch.nn.Module:
    """A copy whose layer weights are their int8/int4 values (the LM head its int8 values), in fp32:
    what the quantized backend computes, minus its bf16 arithmetic."""
    copied = copy.deepcopy(model)
    with torch.no_grad():
        for name, module in copied.named_modules():
            if isinstance(module, torch.nn.Linear):
                w = module.weight
                int4 = kind == "int4" and name != "lm_head"
                module.weight.copy_(dequantize_int4(quantize_int4(w)) if int4 else dequantize_int8(quantize_int8(w)))
    return copied


@pytest.mark.parametrize("precision", ["bf16", "int8", "int4"])
def test_logits_stay_within_bf16_rounding_of_fp32_on_the_same_weight_values(precision):
    model = tiny_llama(seed=1)
    reference_model = model if precision == "bf16" else on_quantized_values(model, precision)
    fp32 = native(reference_model).forward(TOKENS)
    spread = fp32.max(-1).values - fp32.min(-1).values  # [n]
    for dense in ("bf16", "rows", "fp32") if precision == "bf16" else ("bf16",):  # bf16 columns, rows, widened
        low = native(model, precision, dense_kernel=dense).forward(TOKENS)
        # Stated tolerance: bf16 activations keep 8 bits of mantissa; over 2 layers every logit
        # stays within 5% of its row's spread of the fp32 logits (measured: 2.2% bf16).
        assert ((low - fp32).abs().max(-1).values <= 0.05 * spread).all(), dense
        assert (low.argmax(-1) == fp32.argmax(-1)).float().mean() >= 0.9, dense


def test_quantized_weights_are_what_each_precision_says():
    weights = NativeWeights.from_model(tiny_llama(seed=1), "int4")
    assert all(isinstance(layer.qkv, Int4Linear) and isinstance(layer.down, Int4Linear) for layer in weights.layers)
    assert isinstance(weights.lm_head, Int8Linear)  # the head is int8 unless the file has 4-bit blocks for it
    assert weights.dtype == torch.bfloat16 and weights.precision == "int4"
    int8 = NativeWeights.from_model(tiny_llama(seed=1), "int8")
    assert all(isinstance(layer.gate_up, Int8Linear) for layer in int8.layers)
    # Qwen2: biases ride along; shapes the int4 kernel cannot take (48 inputs, 40 outputs) fall back to int8.
    qwen = NativeWeights.from_model(tiny_qwen2(), "int4")
    assert isinstance(qwen.layers[0].qkv, Int4Linear) and qwen.layers[0].qkv.bias is not None
    assert isinstance(qwen.layers[0].down, Int8Linear) and isinstance(qwen.lm_head, Int8Linear)


# bf16 every way a machine may multiply it: as columns, row by row, or widened to fp32.
ROW_INVARIANT = [("bf16", "bf16"), ("bf16", "rows"), ("bf16", "fp32"), ("int8", "bf16"), ("int4", "bf16")]


@pytest.mark.parametrize("precision, dense", ROW_INVARIANT)
def test_a_verify_pass_gives_each_token_the_logits_of_one_token_passes(precision, dense):
    weights = NativeWeights.from_model(tiny_llama(seed=1, max_positions=600), precision, dense_kernel=dense)
    backend = NativeBackend(weights, "t")
    for prefix in (3, 60, 250, 254):  # 60 + 8 and 250 + 8 cross a key chunk (32 keys)
        one, many = Seq(backend), Seq(backend)
        prompt = [(7 * i) % 32 for i in range(prefix)]
        one.forward(prompt)
        many.forward(prompt)
        extra = [5, 1, 4, 1, 5, 9, 2, 6]
        alone = torch.cat([one.forward([t]) for t in extra])
        assert torch.equal(many.forward(extra), alone), prefix


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("precision, dense", ROW_INVARIANT)
def test_a_tree_pass_gives_each_node_the_logits_of_one_token_passes_along_its_path(precision, dense, in_place):
    # Nodes whose ancestors sit after their siblings read the keys in the order of their path:
    # gathered, or in place with their siblings masked where this machine's kernel allows it.
    from quickdraft.models.row_attention import trees_read_in_place
    from quickdraft.tree import ancestors, pass_layout

    model = tiny_llama(seed=1, max_positions=600, hidden=64)
    weights = NativeWeights.from_model(model, precision, dense_kernel=dense)
    if in_place and not trees_read_in_place(weights.heads, weights.kv_heads, weights.head_dim):
        pytest.skip("this machine's matmul kernel does not keep trees read in place exact (the backend gathers)")
    backend = NativeBackend(weights, "t", in_place_trees=in_place)
    tokens, parents = [5, 6, 7, 8, 9, 3, 2], [-1, -1, -1, 1, 3, 0, 4]  # a bushy tree, depth 4
    for prefix in (40, 62, 254):  # 62, 254: deep nodes sit past a key chunk that starts inside the tree
        prompt = [(7 * i) % 32 for i in range(prefix)]
        tree = Seq(backend)
        tree.forward(prompt[:-1])
        mask, offsets = pass_layout(parents, [], None)
        full = torch.cat([torch.ones(len(tokens) + 1, prefix - 1, dtype=torch.bool), mask], dim=1)
        rows = tree.forward([prompt[-1], *tokens], positions=[prefix - 1 + o for o in offsets], mask=full)
        for node in range(len(tokens)):
            path = [tokens[a] for a in ancestors(node, parents)]
            one = Seq(backend)
            one.forward(prompt[:-1])
            alone = torch.cat([one.forward([t]) for t in [prompt[-1], *path]])
            assert torch.equal(rows[node + 1], alone[-1]), (prefix, node)


# Fixed prompts, then seeded spares tried until a draft is accepted: whether a random model's greedy
# text repeats itself (what prompt lookup needs) depends on this machine's bf16 rounding.
PROMPTS = [[1, 2, 3], [5, 9, 9, 2, 7, 1, 5, 9, 9, 2, 7]]
SPARE_PROMPTS = [torch.randint(0, 32, (12,), generator=torch.Generator().manual_seed(s)).tolist() for s in range(40)]


@pytest.mark.speculation
@pytest.mark.parametrize("precision", ["bf16", "int8", "int4"])
@pytest.mark.parametrize("method", ["draft", "prompt-lookup", "self-spec", "lookahead"])
def test_greedy_speculation_equals_plain_greedy_at_the_same_precision(tiny_target, tiny_draft, precision, method):
    target = loaded(tiny_target, "t")
    plain = Decoder(target, None, "none", precision=precision)
    draft = loaded(tiny_draft, "d") if method == "draft" else None
    options = {"layers": 1} if method == "self-spec" else {}
    # fixed: every step drafts (prompt lookup's cost model may choose K = 0 where verify passes are dear)
    specs = [Decoder(target, draft, method, k, precision=precision, draft_length="fixed", **options) for k in (1, 3, 8)]
    outputs = []
    for number, prompt in enumerate(PROMPTS + SPARE_PROMPTS):
        if number >= len(PROMPTS) and speculated(outputs):
            break
        expected = plain.generate(prompt, max_new_tokens=40).token_ids
        for spec in specs:
            outputs.append(spec.generate(prompt, max_new_tokens=40))
            assert outputs[-1].token_ids == expected, (spec.k, prompt)
    assert_speculated(outputs)  # drafts were accepted: the equality was tested, not skipped


@pytest.mark.speculation
def test_qwen2_with_biases_and_fallbacks_speculates_exactly_at_int4():
    target = loaded(tiny_qwen2(), "q")
    plain = Decoder(target, None, "none", precision="int4")
    spec = Decoder(target, None, "prompt-lookup", 4, precision="int4", draft_length="fixed")  # drafts every step
    prompt = [3, 8, 1, 3, 8, 1, 3, 8]
    out = spec.generate(prompt, max_new_tokens=40)
    assert out.token_ids == plain.generate(prompt, max_new_tokens=40).token_ids
    assert_speculated([out])


def test_quantized_precisions_need_the_native_backend(tiny_target):
    for precision in ("int8", "int4"):
        with pytest.raises(QuickdraftError, match="native backend"):
            Decoder(loaded(tiny_target, "t"), None, "none", backend="hf", precision=precision)
    with pytest.raises(QuickdraftError, match="unknown precision 'fp8'; choose one of: fp32, bf16, int8, int4, fp16"):
        Decoder(loaded(tiny_target, "t"), None, "none", precision="fp8")


def test_widened_prompt_rows_are_each_computed_on_their_own_and_near_the_fp32_product():
    from quickdraft.models.linear import RowLinear

    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(300, 48, generator=generator).to(torch.bfloat16)  # 300 outputs: blocks, and a short last one
    linear = RowLinear(weight, torch.randn(300, generator=generator).to(torch.bfloat16))
    x = torch.randn(40, 48, generator=generator).to(torch.bfloat16)
    alone = torch.cat([linear.widened(x[i : i + 1]) for i in range(40)])
    for n in (2, 16, 17, 40):  # within one column block, exactly one, and past one
        assert torch.equal(linear.widened(x[:n]), alone[:n]), n
    exact = x.float() @ weight.float().T + linear.bias.float()
    assert torch.allclose(alone.float(), exact, rtol=0.02, atol=0.05)  # rounded once to bf16, then the bias


def widening_backend(model) -> NativeBackend:
    """bf16 one row at a time (a CPU without bf16 arithmetic), prompts widened to fp32."""
    backend = NativeBackend(NativeWeights.from_model(model, "bf16", dense_kernel="rows"), "t")
    backend.widen_prompts = True
    return backend


def test_a_prompt_prefilled_beside_other_passes_gives_the_same_rows_as_alone():
    from quickdraft.backends.backend import SeqPass

    backend = widening_backend(tiny_llama(seed=1))
    prompt, other = [3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8]
    alone = Seq(backend)
    backend.forward([SeqPass(alone.cache, prompt, logits="none", prompt=True)])
    expected = alone.forward([5, 3])
    mixed, busy, decoding = Seq(backend), Seq(backend), Seq(backend)
    decoding.forward(other)
    one_row = Seq(backend)
    one_row.forward(other)
    by_itself = one_row.forward([4])
    # A prompt, another prompt and a decode row in one pass: the decode row is not widened.
    outputs = backend.forward(
        [
            SeqPass(mixed.cache, prompt, logits="none", prompt=True),
            SeqPass(busy.cache, other * 3, logits="none", prompt=True),
            SeqPass(decoding.cache, [4]),
        ]
    )
    assert torch.equal(outputs[2].logits, by_itself)
    assert torch.equal(mixed.forward([5, 3]), expected)
    # Rows not flagged as a prompt's are never widened: the same as on a backend that widens nothing.
    assert torch.equal(Seq(backend).forward(prompt), Seq(NativeBackend(backend.weights, "t")).forward(prompt))


@pytest.mark.speculation
@pytest.mark.parametrize("method", ["draft", "prompt-lookup"])
def test_greedy_speculation_over_widened_prompts_equals_plain_greedy(tiny_target, tiny_draft, method):
    from quickdraft.draft_length import make_draft_length
    from quickdraft.drafters import DraftModelDrafter, PromptLookupDrafter
    from quickdraft.engine import Generation, prefill, step
    from quickdraft.sampling import SamplingParams

    target = widening_backend(tiny_target)

    def run(k: int, prompt: list[int]) -> Generation:
        drafter = (
            DraftModelDrafter(widening_backend(tiny_draft)) if method == "draft" and k else PromptLookupDrafter(2, 1)
        )
        generation = Generation(
            target,
            drafter,
            prompt,
            draft_length=make_draft_length("fixed", k),
            max_new_tokens=40,
            sampling=SamplingParams(0.0),
            generator=torch.Generator(),
        )
        prefill([generation])
        while not generation.done:
            step([generation])
        return generation

    generations = []
    for number, prompt in enumerate(PROMPTS + SPARE_PROMPTS):
        if number >= len(PROMPTS) and speculated(generations, min_rate=0.1):
            break  # as above: spares only until a draft was accepted, whatever this machine's bf16 rounding
        plain = run(0, prompt).new_tokens
        for k in (1, 4):
            generations.append(run(k, prompt))
            assert generations[-1].new_tokens == plain, (prompt, k)
    assert_speculated(generations, min_rate=0.1)  # drafts were accepted: the equality was tested


@pytest.mark.speculation
def test_a_draft_model_takes_the_bf16_kernel_of_one_token_passes_the_target_that_of_verify_passes(
    tiny_target, tiny_draft, tmp_path
):
    """Where bf16 kernels cost differently by pass size (on a CPU with bf16 arithmetic, bf16 columns
    cost as much for 1 row as for 16), the target keeps the kernel chosen for verify passes whatever
    its method, so plain decoding has speculation's bits; a draft model, whose bits never reach the
    output, takes the kernel chosen for the one-token passes it drafts with."""
    from quickdraft.backends.kernel_timing import DECODE_ROWS, DENSE_QUESTION, FIRST_LAYER, VERIFY_ROWS, bf16_signature
    from quickdraft.measured import write_choice
    from quickdraft.models.linear import ColumnLinear, RowLinear

    folder = tmp_path / "pass_shapes"  # this machine's choices, made to differ by pass size
    matrices = [tiny_target.get_parameter(f"model.layers.0.{name}.weight") for name in FIRST_LAYER]
    write_choice(folder, bf16_signature(DENSE_QUESTION, VERIFY_ROWS, matrices), "bf16")
    write_choice(folder, bf16_signature(DENSE_QUESTION, DECODE_ROWS, matrices), "rows")
    target, draft = loaded(tiny_target, "t"), loaded(tiny_draft, "d")
    options = {"precision": "bf16", "backend": "native", "cache_dir": tmp_path}
    plain = Decoder(target, None, "none", **options)
    spec = Decoder(target, draft, "draft", 3, draft_length="fixed", **options)
    assert isinstance(plain.target_backend.weights.layers[0].qkv, ColumnLinear)
    assert spec.target_backend is plain.target_backend
    assert isinstance(spec.drafter.backend.weights.layers[0].qkv, RowLinear)
    outputs = []
    for prompt in PROMPTS:
        outputs.append(spec.generate(prompt, max_new_tokens=40))
        assert outputs[-1].token_ids == plain.generate(prompt, max_new_tokens=40).token_ids, prompt
    assert_speculated(outputs)
