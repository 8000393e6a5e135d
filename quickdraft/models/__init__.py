"""Model loading and runners."""

from quickdraft.models.embedded import DEFAULT_NAME, default_gguf_path
from quickdraft.models.loading import LoadedModel, check_same_vocabulary, load_model
from quickdraft.models.runner import HFRunner, Runner

__all__ = [
    "DEFAULT_NAME",
    "HFRunner",
    "LoadedModel",
    "Runner",
    "check_same_vocabulary",
    "default_gguf_path",
    "load_model",
]
