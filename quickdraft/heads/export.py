"""An EAGLE-3 head as a vLLM or SGLang draft model, and back.

The layout is the EAGLE-3 checkpoint's, as read by vLLM's Eagle3LlamaForCausalLM.load_weights
(vllm/model_executor/models/llama_eagle3.py) and SGLang's LlamaForCausalLMEagle3.load_weights
(python/sglang/srt/models/llama_eagle3.py). model.safetensors holds the head's own tensors
under its own names, bf16: fc.weight [H, 3H], midlayer.* (q/k/v_proj read [*, 2H]), norm.weight,
lm_head.weight [V', H]; d2t int64 [V'] (target id = draft id + d2t[draft id]) and t2d bool [V]
(the target ids the draft vocabulary holds). No embed_tokens: both engines then share the
target's. config.json is a Llama config of the head's layers (tie_word_embeddings false: the
head has its own LM head) with draft_vocab_size and target_hidden_size. A head of more than one
layer exports to vLLM only (layers.1.* are its later layers' names; SGLang's EAGLE-3 model
refuses num_hidden_layers above 1).

The one difference between the engines is how the config names the target layers whose inputs
are fused (Eagle3Config.features). vLLM reads a top-level eagle_aux_hidden_state_layer_ids and
captures the input of layer i for id i; SGLang reads eagle_config.eagle_aux_hidden_state_layer_ids
and captures the input of layer i + 1 for id i. Both default to (2, L // 2, L - 3) when absent.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from quickdraft.errors import QuickdraftError
from quickdraft.heads.config import Eagle3Config
from quickdraft.heads.eagle3 import Eagle3Head
from quickdraft.heads.format import CONFIG_FILE, HEADS_FILE, read_config
from quickdraft.memory import ModelShape

FORMATS = ("vllm", "sglang")
WEIGHTS_FILE = "model.safetensors"
ARCHITECTURE = "LlamaForCausalLMEagle3"  # SGLang's EAGLE-3 class; vLLM's registry maps it to Eagle3LlamaForCausalLM


def export_tensors(state: dict[str, torch.Tensor], vocab: int) -> dict[str, torch.Tensor]:
    """A head's state dict (with its `vocab` buffer [V'], ascending target ids) -> the exported
    tensors: floats in bf16 under the same names, d2t int64 [V'], t2d bool [V]."""
    ids = state["vocab"].long()
    tensors = {
        name: value.to(torch.bfloat16).contiguous()
        for name, value in state.items()
        if name != "vocab" and value.is_floating_point()
    }
    tensors["d2t"] = ids - torch.arange(len(ids))
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    tensors["t2d"] = t2d
    return tensors


def export_config(
    config: Eagle3Config, draft_vocab: int, vocab: int, max_positions: int, fmt: str, target: str = ""
) -> dict:
    """The draft model's config.json for `fmt`: the head's layers as a Llama."""
    c = config
    values = {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": c.hidden,
        "intermediate_size": c.intermediate,
        "num_attention_heads": c.heads,
        "num_key_value_heads": c.kv_heads,
        "head_dim": c.head_dim,
        "num_hidden_layers": c.layers,
        "rms_norm_eps": c.eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": max_positions,
        "vocab_size": vocab,
        "draft_vocab_size": draft_vocab,
        "target_hidden_size": c.hidden,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "norm_before_residual": False,
        "torch_dtype": "bfloat16",
        "quickdraft_target": target,
    }
    if fmt == "vllm":
        values["eagle_aux_hidden_state_layer_ids"] = list(c.features)
    else:
        values["eagle_config"] = {
            "use_aux_hidden_state": True,
            "eagle_aux_hidden_state_layer_ids": [f - 1 for f in c.features],
        }
    return values


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise QuickdraftError(f"unknown export format {fmt!r}; choose one of: {', '.join(FORMATS)}")


def eagle3_layer(folder: Path) -> dict:
    """The head config in a quickdraft head folder, refused unless it is an EAGLE-3 head."""
    if not (folder / HEADS_FILE).is_file() or not (folder / CONFIG_FILE).is_file():
        raise QuickdraftError(f"no head in {folder} (expected {HEADS_FILE} and {CONFIG_FILE})")
    config = read_config(folder)
    if config.get("kind") != "eagle":
        raise QuickdraftError(f"{folder} holds a {config.get('kind')!r} head; only EAGLE-3 heads export")
    if "features" not in config.get("layer", {}):
        raise QuickdraftError(
            f"{folder} holds an EAGLE-1 head; only EAGLE-3 heads export (vLLM and SGLang "
            "read EAGLE-3's layout): train one with `quickdraft train eagle --eagle 3`"
        )
    return config


def export_head(folder: Path, output: Path, fmt: str, target: ModelShape) -> Path:
    """Write output/config.json and output/model.safetensors for `fmt` from the EAGLE-3 head in
    `folder`, trained for `target` (its sizes only: no weights are read) -> output."""
    check_format(fmt)
    config = eagle3_layer(folder)
    if output.resolve() == folder.resolve():
        raise QuickdraftError(f"export into another folder than the head's own ({folder})")
    layer = Eagle3Config.from_dict(config["layer"])
    if fmt == "sglang" and layer.layers > 1:
        raise QuickdraftError(
            f"the head in {folder} has {layer.layers} layers; SGLang runs one-layer EAGLE-3 heads only "
            "(export it with --format vllm)"
        )
    if (config["vocab"], config["hidden"]) != (target.vocab, target.hidden):
        raise QuickdraftError(
            f"the head in {folder} was trained for {config.get('target')!r} (vocabulary {config['vocab']}, hidden "
            f"size {config['hidden']}); {target.name!r} has {target.vocab} and {target.hidden}"
        )
    if max(layer.features) >= target.layers:
        raise QuickdraftError(
            f"the head in {folder} reads layer {max(layer.features)}; {target.name!r} has {target.layers} layers"
        )
    tensors = export_tensors(load_file(str(folder / HEADS_FILE)), target.vocab)
    output.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(output / WEIGHTS_FILE), metadata={"format": "pt"})
    values = export_config(layer, len(tensors["d2t"]), target.vocab, target.context, fmt, config.get("target", ""))
    (output / CONFIG_FILE).write_text(json.dumps(values, indent=1))
    return output


def is_export(folder: Path) -> bool:
    """Whether `folder` holds an exported EAGLE-3 draft model (its config names ARCHITECTURE)."""
    path = folder / CONFIG_FILE
    if not (folder / WEIGHTS_FILE).is_file() or not path.is_file():
        return False
    return ARCHITECTURE in (json.loads(path.read_text()).get("architectures") or [])


def export_summary(folder: Path) -> dict:
    """An exported folder's config in a quickdraft head config's terms: kind, target, vocab, hidden."""
    values = json.loads((folder / CONFIG_FILE).read_text())
    return {
        "kind": "eagle",
        "target": values.get("quickdraft_target", ""),
        "vocab": values["vocab_size"],
        "hidden": values.get("target_hidden_size", values["hidden_size"]),
    }


def read_export(output: Path, embed: torch.Tensor) -> Eagle3Head:
    """The head an exported folder holds (either format), over the target's embedding [V, H]."""
    values = json.loads((output / CONFIG_FILE).read_text())
    if "eagle_aux_hidden_state_layer_ids" in values:  # vLLM: the input of layer i
        features = values["eagle_aux_hidden_state_layer_ids"]
    else:  # SGLang: the input of layer i + 1
        features = [i + 1 for i in values["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
    rope = values.get("rope_theta") or (values.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    heads = values["num_attention_heads"]
    config = Eagle3Config(
        values["hidden_size"],
        values["intermediate_size"],
        heads,
        values.get("num_key_value_heads", heads),
        values.get("head_dim") or values["hidden_size"] // heads,
        float(rope),
        float(values["rms_norm_eps"]),
        tuple(features),
        values.get("num_hidden_layers", 1),
    )
    tensors = load_file(str(output / WEIGHTS_FILE))
    d2t = tensors.pop("d2t").long()
    tensors.pop("t2d", None)
    vocab = torch.arange(len(d2t)) + d2t  # [V'] target ids
    head = Eagle3Head(config, embed, vocab)
    head.load_state_dict({**tensors, "vocab": vocab})
    return head.eval()
