"""A view of a causal LM that runs only some of its decoder layers: the self-speculative drafter.

The view shares every weight with the full model (no copy): embeddings, the chosen layers,
the final norm and the LM head. Each kept layer writes its own slot of a cache laid out for
the full model, so skipping layers needs no re-indexing.
"""

from __future__ import annotations

import copy

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from quickdraft.errors import QuickdraftError


def decoder_layers(model: PreTrainedModel) -> torch.nn.ModuleList:
    """The decoder layer stack of a standard HF causal LM (Llama, Mistral, Qwen2, Gemma, Phi-3...)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise QuickdraftError(
            f"self-speculation needs a model with a model.layers stack; {type(model).__name__} has none"
        )
    return layers


def resolve_layers(total: int, layers: int | list[int]) -> list[int]:
    """Of a model with `total` layers: an int L means the first L layers; a list names the layers
    to keep (0 must be kept)."""
    chosen = list(range(layers)) if isinstance(layers, int) else sorted(set(int(i) for i in layers))
    if not chosen or chosen[-1] >= total or chosen[0] < 0:
        raise QuickdraftError(f"self-speculation layers must be within 0..{total - 1}, got {layers}")
    if chosen[0] != 0:
        raise QuickdraftError("self-speculation must keep layer 0 (the cache length is read from it)")
    if len(chosen) == total:
        raise QuickdraftError(f"self-speculation must skip at least one of the {total} layers")
    return chosen


def layer_subset_model(model: PreTrainedModel, layers: list[int]) -> PreTrainedModel:
    """A model that runs `layers` of `model` (sharing their weights), then its norm and LM head."""
    all_layers = decoder_layers(model)
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = len(layers)
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = [config.layer_types[i] for i in layers]
    with torch.device("meta"):  # build the shell without allocating weights
        view = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
    for name, child in model.model.named_children():
        if name != "layers":
            setattr(view.model, name, child)
    view.model.layers = torch.nn.ModuleList(all_layers[i] for i in layers)
    view.lm_head = model.get_output_embeddings()
    on_meta = [n for n, t in [*view.named_parameters(), *view.named_buffers()] if t.is_meta]
    if on_meta:
        raise QuickdraftError(f"could not build the self-speculative view: {on_meta[0]} has no weights")
    return view.eval()
