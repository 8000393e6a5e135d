"""A quickdraft head on disk: a folder with heads.safetensors (the head's own tensors in bf16 and
its draft vocabulary `vocab`, never the target's tables) and config.json ("kind": "medusa" with
"heads", or "eagle" with "layer", heads/config.py; "target", "vocab" and "hidden" name the target
it fits; training adds how it was made). What `quickdraft train` writes and drafting loads."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from quickdraft.heads.config import Eagle3Config, EagleConfig
from quickdraft.heads.eagle3 import Eagle3Head
from quickdraft.heads.eagle_head import EagleHead
from quickdraft.heads.medusa_heads import MedusaHeads

HEADS_FILE, CONFIG_FILE = "heads.safetensors", "config.json"


def read_config(folder: Path) -> dict:
    return json.loads((folder / CONFIG_FILE).read_text())


def write_head(folder: Path, model: nn.Module, config: dict) -> None:
    """folder/heads.safetensors (the model's saved state, floats in bf16) and folder/config.json."""
    state = {
        k: (v.to(torch.bfloat16) if v.is_floating_point() else v).cpu().contiguous()
        for k, v in model.state_dict().items()
    }
    save_file(state, str(folder / HEADS_FILE))
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=1))


def load_medusa(folder: Path, lm_head: torch.Tensor) -> MedusaHeads:
    """Medusa heads from `folder`, over the target's LM head weight."""
    state = load_file(str(folder / HEADS_FILE))
    model = MedusaHeads(lm_head, read_config(folder)["heads"], state["vocab"])
    model.load_state_dict(state)  # bf16 values into the fp32 parameters
    return model.eval()


def load_eagle(folder: Path, lm_head: torch.Tensor, embed: torch.Tensor) -> EagleHead | Eagle3Head:
    """The EAGLE head in `folder` (EAGLE-3 when its layer names the fused feature layers, else
    EAGLE-1), over the target's embedding (and, EAGLE-1, LM head) weights."""
    state = load_file(str(folder / HEADS_FILE))
    layer = read_config(folder)["layer"]
    if "features" in layer:
        model = Eagle3Head(Eagle3Config.from_dict(layer), embed, state["vocab"])
    else:
        model = EagleHead(EagleConfig.from_dict(layer), embed, lm_head, state["vocab"])
    model.load_state_dict(state)
    return model.eval()
