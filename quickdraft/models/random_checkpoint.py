"""Hugging Face checkpoint folders with random weights at a config's shapes (config.json, sharded
safetensors and their index, as `save_pretrained` writes them): what tests and benchmarks load
where no model of that size is on hand. Tensors are made one at a time and written a shard at a
time, so a model of any size needs memory for one shard only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm
from transformers import PretrainedConfig

from quickdraft.models.weights import meta_model

SHARD_BYTES = 1 << 30  # at most this much per safetensors file


def random_checkpoint(
    config: PretrainedConfig,
    out: str | Path,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    progress: bool = False,
) -> Path:
    """A folder at `out` with `config` and random weights in `dtype`: matrices ~ N(0, 1/fan_in)
    (embeddings and the LM head scaled so next-token distributions are peaked), norms at one."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    shapes = {name: tuple(t.shape) for name, t in meta_model(config).state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        shapes.pop("lm_head.weight", None)
    generator = torch.Generator().manual_seed(seed)
    shards: list[list[str]] = []  # the tensor names of each file written
    shard: dict[str, torch.Tensor] = {}

    def flush() -> None:
        save_file(shard, str(out / f"shard-{len(shards)}.safetensors"), metadata={"format": "pt"})
        shards.append(list(shard))
        shard.clear()

    for name, shape in tqdm(
        shapes.items(), desc=f"writing {out.name}", unit="tensor", disable=not progress, file=sys.stderr
    ):
        if len(shape) == 1:
            tensor = torch.ones(shape, dtype=dtype)
        else:
            scale = 3.0 if name in ("model.embed_tokens.weight", "lm_head.weight") else 1.0
            tensor = (torch.randn(shape, generator=generator) * (scale / shape[-1] ** 0.5)).to(dtype)
        if shard and sum(t.nbytes for t in shard.values()) + tensor.nbytes > SHARD_BYTES:
            flush()
        shard[name] = tensor
    flush()
    weight_map, total = {}, 0
    for index, names in enumerate(shards):  # transformers' names: model-00001-of-00003.safetensors
        file = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        (out / f"shard-{index}.safetensors").rename(out / file)
        total += (out / file).stat().st_size
        weight_map.update({name: file for name in names})
    index_file = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index_file, indent=2))
    return out
