"""Model loading, and the native backend's weights and maths (backends/ runs them)."""

from quickdraft.models.embedded import DEFAULT_NAME, default_gguf_path
from quickdraft.models.loading import LoadedModel, load_model, same_vocabulary

__all__ = ["DEFAULT_NAME", "LoadedModel", "same_vocabulary", "default_gguf_path", "load_model"]
