"""Model runners: one small protocol, and a runner for any Hugging Face causal LM.

A runner owns one sequence's KV cache. The engine appends tokens with `forward` and rolls
back rejected drafts with `truncate`; the prompt is computed once per generation.
"""

from __future__ import annotations

from typing import Protocol

import torch
from transformers import DynamicCache, PreTrainedModel


class Runner(Protocol):
    """What the engine needs from a model: append tokens to a cache, read logits, roll back."""

    @property
    def vocab_size(self) -> int: ...  # size of the logit vector

    @property
    def max_length(self) -> int: ...  # context length: cache entries it can hold

    @property
    def length(self) -> int: ...  # tokens now in the KV cache

    def reset(self) -> None: ...

    def forward(self, tokens: list[int], all_logits: bool = True) -> torch.Tensor:
        """Append tokens to the cache; logits [n, V] for each (or [1, V] for the last only)."""
        ...

    def truncate(self, length: int) -> None:
        """Keep only the first `length` cache entries."""
        ...


class HFRunner:
    """Runs a transformers causal LM with a DynamicCache, one sequence at a time."""

    def __init__(self, model: PreTrainedModel, cache_config=None) -> None:
        self.model = model.eval()
        # A layer-subset view writes the slots of the full model's cache layout.
        self._cache_config = cache_config if cache_config is not None else model.config
        self._cache: DynamicCache | None = None
        self._length = 0
        config = model.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        self._max_length = int(getattr(text_config, "max_position_embeddings", 0) or 1 << 30)
        self._vocab_size = int(model.get_output_embeddings().weight.shape[0])

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def length(self) -> int:
        return self._length

    def reset(self) -> None:
        self._cache = DynamicCache(config=self._cache_config)
        self._length = 0

    @torch.inference_mode()
    def forward(self, tokens: list[int], all_logits: bool = True) -> torch.Tensor:
        if self._cache is None:
            self.reset()
        if self._length + len(tokens) > self._max_length:
            raise ValueError(f"cache would exceed the context length {self._max_length}")
        input_ids = torch.tensor([tokens], dtype=torch.long)  # [1, n]
        out = self.model(
            input_ids=input_ids,
            cache=self._cache,
            use_cache=True,
            logits_to_keep=0 if all_logits else 1,
        )
        self._length += len(tokens)
        return out.logits[0].float()  # [n, V] or [1, V]

    def truncate(self, length: int) -> None:
        if length < self._length:
            self._cache.crop(length - self._length)  # a negative count removes entries
            self._length = length
