"""`quickdraft export-head`: an EAGLE-3 head written in the layout vLLM's and SGLang's EAGLE-3
loaders read, its config, its vocabulary maps, its round trip back into quickdraft (drafting
the same tokens) and the CLI's refusals. Tiny random models and heads, built in the test."""

import json
from dataclasses import replace

import pytest
import torch
from conftest import loaded, tiny_llama
from safetensors.torch import load_file
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from quickdraft.cli import main
from quickdraft.drafters.drafter import DraftRequest
from quickdraft.drafters.eagle import EagleDrafter
from quickdraft.errors import QuickdraftError
from quickdraft.heads.config import Eagle3Config, EagleConfig
from quickdraft.heads.eagle3 import Eagle3Head
from quickdraft.heads.eagle_head import EagleHead
from quickdraft.heads.export import export_head, read_export
from quickdraft.heads.format import write_head
from quickdraft.heads.store import load_head
from quickdraft.memory import shape_from_config
from quickdraft.sampling import SamplingParams

V, H, LAYERS, DRAFT_V = 32, 32, 8, 20
FEATURES = (1, 4, 6)  # not the engines' default (2, 4, 5): the ids must be written, each engine its way


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=3, vocab=V, layers=LAYERS, hidden=H)


def save_quickdraft_head(folder, head, extra: dict) -> None:
    """A head folder as `quickdraft train` writes it."""
    folder.mkdir(parents=True)
    write_head(
        folder, head, {"kind": "eagle", "target": "t", **extra, "hidden": H, "vocab": V, "draft_vocab": len(head.vocab)}
    )


@pytest.fixture(scope="module")
def head_folder(target, tmp_path_factory):
    """A random EAGLE-3 head over a draft vocabulary of 20 of the 32 ids."""
    torch.manual_seed(0)  # test-only: the head's random weights
    config = replace(Eagle3Config.from_target(target.config), features=FEATURES)
    vocab = torch.randperm(V)[:DRAFT_V].sort().values
    return saved_random_head(target, config, vocab, tmp_path_factory.mktemp("heads") / "eagle3")


def saved_random_head(target, config: Eagle3Config, vocab: torch.Tensor, folder):
    """An EAGLE-3 head of `config` over `vocab`, its weights moved off the target's, saved in `folder`."""
    head = Eagle3Head(config, target.model.embed_tokens.weight, vocab, target.lm_head.weight, target.model.norm.weight)
    with torch.no_grad():  # norms away from 1 and a non-trivial fc, so a misplaced tensor shows
        for p in head.parameters():
            p.add_(0.1 * torch.randn_like(p))
    save_quickdraft_head(folder, head, {"layer": config.to_dict()})
    return folder


@pytest.fixture(scope="module")
def exported(target, head_folder, tmp_path_factory):
    shape = shape_from_config(target.config, "t")
    out = tmp_path_factory.mktemp("exported")
    return {fmt: export_head(head_folder, out / fmt, fmt, shape) for fmt in ("vllm", "sglang")}


def expected_layout(h: int, inter: int, heads: int, kv: int, d: int, draft: int, vocab: int) -> dict:
    """name -> (shape, dtype) that both engines' EAGLE-3 loaders take, from their code:
    vLLM vllm/model_executor/models/llama_eagle3.py (commit 00bd1493b3e82d6c13c68ee8a0e1c5a96707e190,
    https://github.com/vllm-project/vllm): LlamaModel.fc = ReplicatedLinear(target_hidden_size * 3,
    hidden_size); layer 0's qkv_proj = QKVParallelLinear(2 * hidden_size, head_dim, heads, kv_heads);
    LlamaMLP(hidden_size, intermediate_size); input_layernorm, hidden_norm, post_attention_layernorm,
    norm: RMSNorm(hidden_size); lm_head = ParallelLMHead(draft_vocab_size, hidden_size);
    draft_id_to_target_id = zeros(draft_vocab_size, dtype=torch.long) loaded from "d2t"; "t2d" skipped;
    embed_tokens optional (the target's is shared when absent).
    SGLang python/sglang/srt/models/llama_eagle3.py (commit 03d5a7771f6082e7737a5f19cae7d1e863087013,
    https://github.com/sgl-project/sglang): fc = nn.Linear(hidden_size_in * 3, hidden_size), the same
    midlayer (qkv over 2 * hidden_size), lm_head = ParallelLMHead(draft_vocab_size, hidden_size),
    "d2t" -> hot_token_id = d2t + arange, "t2d" skipped, embed_tokens set from the target (set_embed).
    Weights in bf16, as EAGLE-3 checkpoints ship."""
    bf16 = torch.bfloat16
    return {
        "fc.weight": ((h, 3 * h), bf16),
        "midlayer.input_layernorm.weight": ((h,), bf16),
        "midlayer.hidden_norm.weight": ((h,), bf16),
        "midlayer.self_attn.q_proj.weight": ((heads * d, 2 * h), bf16),
        "midlayer.self_attn.k_proj.weight": ((kv * d, 2 * h), bf16),
        "midlayer.self_attn.v_proj.weight": ((kv * d, 2 * h), bf16),
        "midlayer.self_attn.o_proj.weight": ((h, heads * d), bf16),
        "midlayer.post_attention_layernorm.weight": ((h,), bf16),
        "midlayer.mlp.gate_proj.weight": ((inter, h), bf16),
        "midlayer.mlp.up_proj.weight": ((inter, h), bf16),
        "midlayer.mlp.down_proj.weight": ((h, inter), bf16),
        "norm.weight": ((h,), bf16),
        "lm_head.weight": ((draft, h), bf16),
        "d2t": ((draft,), torch.int64),
        "t2d": ((vocab,), torch.bool),
    }


STACKED = [
    (".q_proj", ".qkv_proj"),
    (".k_proj", ".qkv_proj"),
    (".v_proj", ".qkv_proj"),
    (".gate_proj", ".gate_up_proj"),
    (".up_proj", ".gate_up_proj"),
]  # both loaders' stacked_params_mapping


def vllm_name(name: str) -> str | None:
    """Eagle3LlamaForCausalLM.load_weights + LlamaModel.load_weights (vLLM, commit above)."""
    if "t2d" in name:
        return None
    if "d2t" in name:
        return name.replace("d2t", "draft_id_to_target_id")
    name = name.replace("midlayer.", "layers.0.")
    name = name if "lm_head" in name else "model." + name
    return next((name.replace(a, b) for a, b in STACKED if a in name), name)


def sglang_name(name: str, params: set) -> str | None:
    """LlamaForCausalLMEagle3.load_weights (SGLang, commit above): names not in the model get
    "model." in front; names still unknown are skipped silently (so they must be right)."""
    if "d2t" in name or "t2d" in name:
        return None
    name = next((name.replace(a, b) for a, b in STACKED if a in name), name)
    return name if name in params else f"model.{name}"


VLLM_PARAMS = {
    "model.fc.weight",
    "model.layers.0.self_attn.qkv_proj.weight",
    "model.layers.0.self_attn.o_proj.weight",
    "model.layers.0.mlp.gate_up_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
    "model.layers.0.input_layernorm.weight",
    "model.layers.0.hidden_norm.weight",
    "model.layers.0.post_attention_layernorm.weight",
    "model.norm.weight",
    "lm_head.weight",
    "draft_id_to_target_id",
}  # and model.embed_tokens.weight, shared from the target
SGLANG_PARAMS = {
    "model.fc.weight",
    "model.midlayer.self_attn.qkv_proj.weight",
    "model.midlayer.self_attn.o_proj.weight",
    "model.midlayer.mlp.gate_up_proj.weight",
    "model.midlayer.mlp.down_proj.weight",
    "model.midlayer.input_layernorm.weight",
    "model.midlayer.hidden_norm.weight",
    "model.midlayer.post_attention_layernorm.weight",
    "model.norm.weight",
    "lm_head.weight",
}  # and model.embed_tokens.weight, set from the target


@pytest.mark.parametrize("fmt", ["vllm", "sglang"])
def test_exported_tensors_have_the_engines_layout(target, exported, fmt):
    tensors = load_file(str(exported[fmt] / "model.safetensors"))
    c = Eagle3Config.from_target(target.config)
    expected = expected_layout(H, c.intermediate, c.heads, c.kv_heads, c.head_dim, DRAFT_V, V)
    assert {k: (tuple(v.shape), v.dtype) for k, v in tensors.items()} == expected
    assert {vllm_name(k) for k in tensors} - {None} == VLLM_PARAMS
    assert {sglang_name(k, SGLANG_PARAMS) for k in tensors} - {None} == SGLANG_PARAMS


def test_exported_configs_name_the_sizes_and_each_engines_layer_ids(target, exported):
    from transformers import AutoConfig

    c = Eagle3Config.from_target(target.config)
    for out in exported.values():
        config = json.loads((out / "config.json").read_text())
        assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["model_type"] == "llama"
        sizes = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")
        assert [config[k] for k in sizes] == [H, c.intermediate, c.heads, c.kv_heads, c.head_dim]
        assert config["num_hidden_layers"] == 1 and config["hidden_act"] == "silu"
        assert (config["rms_norm_eps"], config["rope_theta"]) == (c.eps, c.rope_theta)
        assert config["max_position_embeddings"] == target.config.max_position_embeddings
        assert (config["vocab_size"], config["draft_vocab_size"], config["target_hidden_size"]) == (V, DRAFT_V, H)
        assert config["tie_word_embeddings"] is False and config["torch_dtype"] == "bfloat16"
        hf = AutoConfig.from_pretrained(out)  # what both engines parse it with
        assert hf.model_type == "llama" and hf.draft_vocab_size == DRAFT_V and not hf.tie_word_embeddings
    vllm = json.loads((exported["vllm"] / "config.json").read_text())
    sglang = json.loads((exported["sglang"] / "config.json").read_text())
    # vLLM captures layer i's input for id i; SGLang layer i + 1's (set_eagle3_layers_to_capture adds 1).
    assert vllm["eagle_aux_hidden_state_layer_ids"] == list(FEATURES) and "eagle_config" not in vllm
    assert sglang["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [f - 1 for f in FEATURES]
    assert "eagle_aux_hidden_state_layer_ids" not in sglang


@pytest.mark.parametrize("fmt", ["vllm", "sglang"])
def test_d2t_and_t2d_match_the_draft_vocabulary(head_folder, exported, fmt):
    vocab = load_file(str(head_folder / "heads.safetensors"))["vocab"]
    tensors = load_file(str(exported[fmt] / "model.safetensors"))
    d2t, t2d = tensors["d2t"], tensors["t2d"]
    assert torch.equal(torch.arange(DRAFT_V) + d2t, vocab)  # target id = draft id + d2t[draft id]
    assert torch.equal(t2d.nonzero()[:, 0], vocab) and int(t2d.sum()) == DRAFT_V
    assert (d2t >= 0).all() and (d2t[1:] >= d2t[:-1]).all()  # ascending ids: offsets never fall


def engine_forward(
    tensors: dict, config: dict, embed: torch.Tensor, features: torch.Tensor, tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The EAGLE-3 draft pass as vLLM and SGLang run it on an exported folder (their llama_eagle3.py
    forward, commits above): features [T, 3H], tokens [T] -> (pre-norm h [T, H] fed back, logits
    [T, V] over the target vocabulary, -inf outside the draft's). Written from their code, not
    quickdraft's, in float32."""
    w = {k: v.float() for k, v in tensors.items() if v.is_floating_point()}
    heads, kv, d, eps = (
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["head_dim"],
        config["rms_norm_eps"],
    )

    def rms(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    def rope(x):  # neox style (Llama): rotate halves, theta^(-2i/D)
        freq = 1.0 / config["rope_theta"] ** (torch.arange(0, d, 2).float() / d)
        angle = torch.arange(x.shape[0]).float()[:, None] * freq  # [T, D/2]
        cos, sin = angle.cos()[:, None], angle.sin()[:, None]
        a, b = x[..., : d // 2], x[..., d // 2 :]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    t = len(tokens)

    def attention(x, layer):  # [T, in] -> [T, heads * D], causal
        q = rope((x @ w[f"{layer}self_attn.q_proj.weight"].T).view(t, heads, d))
        k = rope((x @ w[f"{layer}self_attn.k_proj.weight"].T).view(t, kv, d)).repeat_interleave(heads // kv, 1)
        v = (x @ w[f"{layer}self_attn.v_proj.weight"].T).view(t, kv, d).repeat_interleave(heads // kv, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / d**0.5
        scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
        return (
            torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(t, heads * d)
            @ w[f"{layer}self_attn.o_proj.weight"].T
        )

    def mlp(x, layer):
        silu = torch.nn.functional.silu(x @ w[f"{layer}mlp.gate_proj.weight"].T)
        return (silu * (x @ w[f"{layer}mlp.up_proj.weight"].T)) @ w[f"{layer}mlp.down_proj.weight"].T

    hidden = features @ w["fc.weight"].T  # combine_hidden_states
    residual = hidden  # norm_before_residual false: the residual is the un-normed state
    x = torch.cat(
        [rms(embed[tokens], w["midlayer.input_layernorm.weight"]), rms(hidden, w["midlayer.hidden_norm.weight"])],
        dim=-1,
    )  # [embeds, hidden_states]
    residual = attention(x, "midlayer.") + residual  # post_attention_layernorm(h, residual)
    out = mlp(rms(residual, w["midlayer.post_attention_layernorm.weight"]), "midlayer.")
    for i in range(1, config["num_hidden_layers"]):  # vLLM's later layers: input_layernorm(h, residual)
        residual = out + residual
        residual = attention(rms(residual, w[f"layers.{i}.input_layernorm.weight"]), f"layers.{i}.") + residual
        out = mlp(rms(residual, w[f"layers.{i}.post_attention_layernorm.weight"]), f"layers.{i}.")
    prenorm = out + residual  # self.norm(hidden_states, residual): (normed, pre-norm)
    logits = rms(prenorm, w["norm.weight"]) @ w["lm_head.weight"].T  # [T, V']
    full = logits.new_full((t, config["vocab_size"]), float("-inf"))
    full[:, torch.arange(config["draft_vocab_size"]) + tensors["d2t"]] = logits  # compute_logits
    return prenorm, full


def assert_engine_forward_equals_the_heads(target, head_folder, export, seed: int) -> None:
    """engine_forward on the export's files == the quickdraft head's own pass, over random features."""
    head = load_head("eagle", loaded(target, "t"), head_folder)
    generator = torch.Generator().manual_seed(seed)
    features, tokens = torch.randn(7, 3 * H, generator=generator), torch.randint(V, (7,), generator=generator)
    config = json.loads((export / "config.json").read_text())
    tensors = load_file(str(export / "model.safetensors"))
    prenorm, logits = engine_forward(tensors, config, target.model.embed_tokens.weight.detach(), features, tokens)
    with torch.no_grad():
        h = head(features[None], tokens[None], torch.arange(7)[None], torch.ones(1, 7, 7, dtype=torch.bool).tril())[0]
        mine = torch.full((7, V), float("-inf"))
        mine[:, head.vocab] = head.logits(h)
    torch.testing.assert_close(prenorm, h, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logits, mine, rtol=1e-4, atol=1e-4)


def test_the_engines_forward_on_an_export_equals_the_heads(target, head_folder, exported):
    assert_engine_forward_equals_the_heads(target, head_folder, exported["vllm"], seed=3)


@pytest.fixture(scope="module")
def deeper(target, tmp_path_factory):
    """A random two-layer EAGLE-3 head and its vLLM export."""
    torch.manual_seed(1)  # test-only: the head's random weights
    config = replace(Eagle3Config.from_target(target.config, layers=2), features=FEATURES)
    folder = saved_random_head(target, config, torch.arange(0, V, 2), tmp_path_factory.mktemp("heads") / "deeper")
    out = export_head(
        folder, tmp_path_factory.mktemp("exported") / "vllm", "vllm", shape_from_config(target.config, "t")
    )
    return folder, out


def test_a_deeper_head_exports_to_vllm_as_its_later_layers_and_loads_back(target, deeper, tmp_path):
    folder, out = deeper
    tensors = load_file(str(out / "model.safetensors"))
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 2
    later = {vllm_name(k) for k in tensors} - VLLM_PARAMS - {None}
    # vLLM's layers.1 is a plain Llama layer: qkv over the hidden size, no hidden_norm.
    assert later == {n.replace("layers.0.", "layers.1.") for n in VLLM_PARAMS if "layers.0." in n} - {
        "model.layers.1.hidden_norm.weight"
    }
    assert tensors["layers.1.self_attn.q_proj.weight"].shape[1] == H
    assert_engine_forward_equals_the_heads(target, folder, out, seed=4)
    head = load_head("eagle", loaded(target, "t"), folder)
    again = load_head("eagle", loaded(target, "t"), out)
    assert again.config == head.config and again.config.layers == 2
    assert drafts(again, target) == drafts(head, target)
    with pytest.raises(QuickdraftError, match="SGLang runs one-layer EAGLE-3 heads only"):
        export_head(folder, tmp_path / "sglang", "sglang", shape_from_config(target.config, "t"))
    assert not (tmp_path / "sglang").exists()


def drafts(head, target, seed: int = 7) -> list:
    """What an EAGLE drafter over `head` proposes for a prompt and random target features."""
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(V, (9,), generator=generator).tolist()
    features = torch.randn(len(prompt) - 1, 3 * H, generator=generator)  # [P - 1, 3H]
    drafter = EagleDrafter(head, max_length=64, top_k=3, nodes=8)
    state = drafter.begin(prompt, features)
    draft = drafter.draft(DraftRequest(state, prompt, 4, SamplingParams(), torch.Generator().manual_seed(0)))
    return [draft.tokens, draft.parents]


@pytest.mark.parametrize("fmt", ["vllm", "sglang"])
def test_an_exported_head_loads_back_and_drafts_the_same_tokens(target, head_folder, exported, fmt):
    original = load_head("eagle", loaded(target, "t"), head_folder)
    again = load_head("eagle", loaded(target, "t"), exported[fmt])  # found by its config's architectures
    direct = read_export(exported[fmt], target.model.embed_tokens.weight.detach())
    assert original.config == again.config == direct.config
    for name, value in original.state_dict().items():
        assert torch.equal(value, again.state_dict()[name]) and torch.equal(value, direct.state_dict()[name]), name
    tokens = drafts(original, target)
    assert tokens[0] and tokens == drafts(again, target) == drafts(direct, target)


def test_export_head_refuses_clearly(target, head_folder, tmp_path, capsys):
    target_dir = tmp_path / "tiny"
    target.config.save_pretrained(target_dir)  # the CLI reads the target's sizes only
    eagle1 = tmp_path / "eagle1"
    config = EagleConfig.from_target(target.config)
    head = EagleHead(config, target.model.embed_tokens.weight, target.lm_head.weight, torch.arange(V))
    save_quickdraft_head(eagle1, head, {"layer": config.to_dict()})

    def run(*args: str) -> tuple[int, str]:
        code = main(["export-head", "--target", str(target_dir), "--output", str(tmp_path / "out"), *args])
        out, err = capsys.readouterr()
        return code, out + err

    code, text = run("--head", str(eagle1), "--format", "vllm")
    assert code == 2 and "EAGLE-1 head; only EAGLE-3 heads export" in text
    code, text = run("--head", str(head_folder), "--format", "onnx")
    assert code == 2 and "unknown export format 'onnx'; choose one of: vllm, sglang" in text
    code, text = run("--head", str(tmp_path / "nothing"), "--format", "vllm")
    assert code == 2 and "no head in" in text
    assert not (tmp_path / "out").exists()
    code, text = run("--head", str(head_folder), "--format", "sglang")
    assert code == 0 and (tmp_path / "out" / "model.safetensors").is_file()
    assert f"--model-path {target_dir} --speculative-algorithm EAGLE3 --speculative-draft-model-path" in text
    assert "vllm serve" in text and '"method": "eagle3"' in text


@pytest.mark.parametrize("fmt", ["vllm", "sglang"])
def test_the_cli_drafts_with_an_exported_folder(target, exported, tmp_path, capsys, fmt):
    """`--method eagle:head=<export-head's folder>`: the README says --head takes one."""
    folder = tmp_path / "target"
    target.save_pretrained(folder)
    characters = {chr(65 + i): i for i in range(V)}  # one token per character: text prompts work
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE(vocab=characters, merges=[]))).save_pretrained(folder)
    outputs = {}
    for method in ("none", f"eagle:head={exported[fmt]}"):
        assert (
            main(
                ["generate", "ABCABD", "--target", str(folder), "--method", method, "--max-new-tokens", "12", "--json"]
            )
            == 0
        )
        outputs[method] = json.loads(capsys.readouterr().out)
    plain, eagle = outputs.values()
    assert eagle["token_ids"] == plain["token_ids"] and len(plain["token_ids"]) == 12
    assert eagle["stats"]["target_passes"] <= plain["stats"]["target_passes"]
