"""One sequence over a backend, driven the way the tests read best: forward, truncate, keep."""

from __future__ import annotations

import torch

from quickdraft.backends.backend import Backend, SeqPass
from quickdraft.backends.hf import HFBackend
from quickdraft.backends.native import NativeBackend
from quickdraft.backends.static import StaticBackend
from quickdraft.models.native_weights import NativeWeights


class Seq:
    """A backend and one cache of it. forward() returns the logits and keeps the hidden states."""

    def __init__(self, backend: Backend) -> None:
        self.backend, self.cache = backend, backend.new_cache()
        self.hidden: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return self.cache.length

    @property
    def max_length(self) -> int:
        return self.backend.max_length

    def reset(self) -> None:
        self.cache = self.backend.new_cache()

    def forward(
        self,
        tokens: list[int],
        all_logits: bool = True,
        positions: list[int] | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        out = self.backend.forward(
            [SeqPass(self.cache, tokens, positions, mask, "all" if all_logits else "last", hidden=True)]
        )[0]
        self.hidden = out.hidden
        return out.logits

    def truncate(self, length: int) -> None:
        self.cache.truncate(length)

    def keep(self, indices: list[int]) -> None:
        self.cache.keep(indices)


def native(
    model, precision: str = "fp32", layers: list[int] | None = None, weights: NativeWeights | None = None, **options
) -> Seq:
    """A sequence on the native backend over `model` (or over shared `weights`)."""
    weights = weights if weights is not None else NativeWeights.from_model(model, precision, **options)
    return Seq(NativeBackend(weights, "test", layers=layers))


def static(model, precision: str = "fp32", rows: int = 8, layers: list[int] | None = None, **options) -> Seq:
    """A sequence on the static backend (fixed shapes; the CPU dry run of its CUDA graphs) over `model`."""
    weights = NativeWeights.from_model(model, precision, dense_kernel="linear")
    return Seq(StaticBackend(weights, "test", layers=layers, rows=rows, **options))


def hf(model, **options) -> Seq:
    """A sequence on the transformers backend over `model`."""
    return Seq(HFBackend(model, "test", **options))
