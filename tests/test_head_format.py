"""The on-disk head format (quickdraft/heads/format.py, heads/config.py): the shipped heads load as
they are, and writing a loaded head back gives the same config.json, byte for byte, and the same
tensors."""

import pytest
import torch
from safetensors.torch import load_file

from quickdraft.heads.config import Eagle3Config, EagleConfig, LayerShape
from quickdraft.heads.eagle3 import Eagle3Head
from quickdraft.heads.format import CONFIG_FILE, HEADS_FILE, load_eagle, load_medusa, read_config, write_head
from quickdraft.heads.medusa_heads import MedusaHeads
from quickdraft.heads.store import SHIPPED

SHIPPED_HEADS = sorted(SHIPPED.glob(f"*/*/{HEADS_FILE}"))


def target_tables(config: dict) -> torch.Tensor:
    """A stand-in for the target's embedding and LM head [V, H] (one row, expanded: no copy)."""
    return torch.zeros(1, config["hidden"]).expand(config["vocab"], -1)


@pytest.mark.parametrize("path", SHIPPED_HEADS, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_shipped_heads_load_and_write_back_unchanged(path, tmp_path):
    folder = path.parent
    config = read_config(folder)
    table = target_tables(config)
    if config["kind"] == "medusa":
        head = load_medusa(folder, table)
        assert isinstance(head, MedusaHeads) and head.heads == config["heads"]
    else:
        head = load_eagle(folder, table, table)
        layer = Eagle3Config.from_dict(config["layer"])
        assert isinstance(head, Eagle3Head) and head.config == layer
        config = config | {"layer": layer.to_dict()}  # the layer as the dataclass writes it
    write_head(tmp_path, head, config)
    assert (tmp_path / CONFIG_FILE).read_bytes() == (folder / CONFIG_FILE).read_bytes()
    ours, shipped = load_file(str(tmp_path / HEADS_FILE)), load_file(str(folder / HEADS_FILE))
    assert ours.keys() == shipped.keys()
    assert all(torch.equal(ours[name], shipped[name]) for name in shipped)


def test_both_configs_share_the_layer_fields_in_the_written_order():
    shape = dict(hidden=32, intermediate=64, heads=4, kv_heads=2, head_dim=8, rope_theta=1e4, eps=1e-6)
    eagle, eagle3 = EagleConfig(**shape), Eagle3Config(**shape, features=(0, 1, 2))
    assert isinstance(eagle, LayerShape) and isinstance(eagle3, LayerShape)
    assert eagle.to_dict() == shape and list(eagle.to_dict()) == list(shape)  # config.json keeps this order
    assert eagle3.to_dict() == shape | {"features": [0, 1, 2]}  # a list, as JSON reads it back
    deeper = Eagle3Config(**shape, features=(0, 1, 2), layers=2)  # one layer: no key, as heads always read
    assert deeper.to_dict() == shape | {"features": [0, 1, 2], "layers": 2}
    assert Eagle3Config.from_dict(deeper.to_dict()) == deeper
    assert EagleConfig.from_dict(eagle.to_dict()) == eagle and Eagle3Config.from_dict(eagle3.to_dict()) == eagle3
