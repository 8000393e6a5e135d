"""`quickdraft train medusa`: training data -> cached features -> heads saved with their config."""

from __future__ import annotations

from pathlib import Path

from quickdraft.errors import QuickdraftError
from quickdraft.heads.data import read_examples
from quickdraft.heads.features import extract_features, load_features
from quickdraft.heads.train import TrainSettings, train_medusa
from quickdraft.models.loading import load_model


def train(kind: str, target: str | None, data: list[Path], output: Path, heads: int = 3,
          max_examples: int | None = None, max_tokens: int = 256, settings: TrainSettings = TrainSettings(),
          progress: bool = True) -> dict:
    """Train `kind` heads for `target` (None: the embedded default) on `data` files."""
    if kind != "medusa":
        raise QuickdraftError(f"unknown head kind {kind!r}; choose: medusa")
    if heads < 1:
        raise QuickdraftError(f"--heads must be >= 1, got {heads}")
    examples = [example for path in data for example in read_examples(path)]
    if max_examples is not None:
        examples = examples[:max_examples]
    if not examples:
        raise QuickdraftError("no training examples in the data files")
    loaded = load_model(target)
    if loaded.tokenizer is None:
        raise QuickdraftError(f"target {loaded.name!r} has no tokenizer to encode the training text")
    features = extract_features(loaded.model, loaded.tokenizer, examples, output / "features", max_tokens, progress)
    lm_head = loaded.model.get_output_embeddings().weight.detach()
    return train_medusa(load_features(features), lm_head, heads, output, settings, loaded.name, progress)
