"""The shape of an EAGLE head's decoder layer: config.json's "layer" (heads/format.py). Both
EAGLE-1 and EAGLE-3 heads take it from the target (the head's layer is one more of its layers);
EAGLE-3 adds the target layers whose inputs it fuses, and how many layers it stacks."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from quickdraft.errors import QuickdraftError


def text_config(config):
    """The text model's config (a multimodal model's language part; a text model's own)."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def rope_theta(text) -> float:
    """The target's rotary base: transformers 5 keeps it in rope_parameters (per layer type where
    layers differ, e.g. Gemma 3; the head is a full-attention layer), older configs beside it."""
    parameters = getattr(text, "rope_parameters", None) or {}
    parameters = parameters.get("full_attention", parameters)
    return float(parameters.get("rope_theta") or getattr(text, "rope_theta", None) or 10000.0)


def feature_layers(layers: int) -> tuple[int, int, int]:
    """The target layers whose inputs EAGLE-3 fuses: low, middle, high (vLLM's and SGLang's
    default, so an exported head reads the same features there)."""
    return (2, layers // 2, layers - 3) if layers > 4 else (0, layers // 2, layers - 1)


@dataclass(frozen=True)
class LayerShape:
    """The fields both head kinds share, in config.json's order (later fields follow them)."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float
    eps: float

    @classmethod
    def from_target(cls, config, **extra) -> LayerShape:
        """The target's own layer shape, plus a subclass's `extra` fields."""
        text = text_config(config)
        heads = text.num_attention_heads
        return cls(
            text.hidden_size,
            text.intermediate_size,
            heads,
            getattr(text, "num_key_value_heads", heads),
            getattr(text, "head_dim", None) or text.hidden_size // heads,
            rope_theta(text),
            float(getattr(text, "rms_norm_eps", 1e-6)),
            **extra,
        )

    def to_dict(self) -> dict:
        """config.json's "layer": tuples as lists, which is what JSON reads back."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, values: dict) -> LayerShape:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


@dataclass(frozen=True)
class EagleConfig(LayerShape):
    """EAGLE-1: the layer reads the target's last hidden state, so its shape is all there is."""


@dataclass(frozen=True)
class Eagle3Config(LayerShape):
    features: tuple[int, ...]  # target layers whose inputs are fused (3 of them)
    layers: int = 1  # decoder layers of the head, each of the target's layer shape

    def __post_init__(self) -> None:
        if self.layers < 1:
            raise QuickdraftError(f"an EAGLE-3 head has at least one layer, not {self.layers}")

    def to_dict(self) -> dict:
        """As LayerShape's; `layers` only where above 1, so a one-layer head's config.json reads as
        every earlier release wrote it (and earlier releases read it)."""
        values = super().to_dict()
        if self.layers == 1:
            del values["layers"]
        return values

    @classmethod
    def from_target(cls, config, layers: int = 1) -> Eagle3Config:
        """The target's own layer shape (as EAGLE-1's); features from its depth."""
        return super().from_target(
            config, features=feature_layers(text_config(config).num_hidden_layers), layers=layers
        )
