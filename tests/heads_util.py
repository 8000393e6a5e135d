"""Untrained heads written as `quickdraft train` writes them, for targets no shipped head fits."""

from __future__ import annotations

from pathlib import Path

import torch

from quickdraft.heads.config import Eagle3Config, EagleConfig
from quickdraft.heads.eagle3 import Eagle3Head
from quickdraft.heads.eagle_head import EagleHead
from quickdraft.heads.format import write_head
from quickdraft.heads.medusa_heads import MedusaHeads
from quickdraft.models import LoadedModel


def _save(head: torch.nn.Module, folder: Path, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_head(folder, head, config)
    return folder


def _save_eagle(head: EagleHead | Eagle3Head, target: LoadedModel, folder: Path) -> Path:
    shape = head.config
    return _save(
        head,
        folder,
        {
            "kind": "eagle",
            "target": target.name,
            "layer": shape.to_dict(),
            "vocab": target.vocab_size,
            "hidden": shape.hidden,
        },
    )


def eagle1_head(target: LoadedModel, folder: Path) -> Path:
    """An untrained EAGLE-1 head (it reads the last hidden state, which every backend returns)."""
    torch.manual_seed(0)  # test-only: the head's random weights
    embed, lm_head = target.model.get_input_embeddings().weight, target.model.get_output_embeddings().weight
    config = EagleConfig.from_target(target.model.config)
    head = EagleHead(config, embed.detach(), lm_head.detach(), torch.arange(lm_head.shape[0]))
    return _save_eagle(head, target, folder)


def eagle3_head(target: LoadedModel, folder: Path) -> Path:
    """An untrained EAGLE-3 head (it reads the inputs of three inner layers; its LM head and norm
    start as the target's, over the whole vocabulary)."""
    torch.manual_seed(0)  # test-only: the head's random weights
    embed, lm_head = target.model.get_input_embeddings().weight, target.model.get_output_embeddings().weight
    config = Eagle3Config.from_target(target.model.config)
    norm = target.model.get_decoder().norm.weight
    head = Eagle3Head(config, embed.detach(), torch.arange(lm_head.shape[0]), lm_head.detach(), norm.detach())
    return _save_eagle(head, target, folder)


def medusa_heads(target: LoadedModel, folder: Path, heads: int = 3) -> Path:
    """Untrained Medusa heads (each starts as the target's own next-token head)."""
    torch.manual_seed(0)  # test-only: the heads' random weights
    lm_head = target.model.get_output_embeddings().weight.detach()
    head = MedusaHeads(lm_head, heads)
    return _save(
        head,
        folder,
        {
            "kind": "medusa",
            "target": target.name,
            "heads": heads,
            "vocab": lm_head.shape[0],
            "hidden": lm_head.shape[1],
        },
    )


def target_backend(model: torch.nn.Module):
    """The backend `quickdraft train` distils and extracts features on, over a transformers model in memory."""
    from quickdraft.training.train_command import feature_decoder

    return feature_decoder(LoadedModel.of(model, None, "t")).target_backend
