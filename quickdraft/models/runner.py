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

    # The last forward's hidden states after the final norm [n, H], one row per token fed
    # (for drafters that read them: Medusa, EAGLE); None before any, or when not kept.
    hidden: torch.Tensor | None

    def reset(self) -> None: ...

    def forward(
        self,
        tokens: list[int],
        all_logits: bool = True,
        positions: list[int] | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Append tokens to the cache; logits [n, V] for each (or [1, V] for the last only).

        positions: each token's position (default: consecutive after the cache).
        mask: [n, length + n] bool, True where a token may attend (default: causal).
        """
        ...

    def truncate(self, length: int) -> None:
        """Keep only the first `length` cache entries."""
        ...

    def keep(self, indices: list[int]) -> None:
        """Keep only the cache entries at these ascending indices (an accepted tree path)."""
        ...


class HFRunner:
    """Runs a transformers causal LM with a DynamicCache, one sequence at a time."""

    def __init__(self, model: PreTrainedModel, cache_config=None, keep_hidden: bool = False) -> None:
        """keep_hidden: also return the last hidden states (costs transformers keeping every layer's)."""
        self.model = model.eval()
        self.keep_hidden = keep_hidden
        self.hidden: torch.Tensor | None = None
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
    def forward(
        self,
        tokens: list[int],
        all_logits: bool = True,
        positions: list[int] | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if self._cache is None:
            self.reset()
        if self._length + len(tokens) > self._max_length:
            raise ValueError(f"cache would exceed the context length {self._max_length}")
        input_ids = torch.tensor([tokens], dtype=torch.long)  # [1, n]
        extra = {}
        if positions is not None:
            extra["position_ids"] = torch.tensor([positions], dtype=torch.long)  # [1, n]
        if mask is not None:
            # A 4D mask is used as given by transformers: [batch, heads, n, length + n], True = attend.
            extra["attention_mask"] = mask[None, None]
        out = self.model(
            input_ids=input_ids,
            cache=self._cache,
            use_cache=True,
            logits_to_keep=0 if all_logits else 1,
            output_hidden_states=self.keep_hidden,
            **extra,
        )
        if self.keep_hidden:
            self.hidden = out.hidden_states[-1][0].float()  # [n, H]: the last entry is after the final norm
        self._length += len(tokens)
        return out.logits[0].float()  # [n, V] or [1, V]

    def truncate(self, length: int) -> None:
        if length < self._length:
            self._cache.crop(length - self._length)  # a negative count removes entries
            self._length = length

    def keep(self, indices: list[int]) -> None:
        if indices == list(range(len(indices))):
            self.truncate(len(indices))  # a prefix: the cheap common case
            return
        index = torch.tensor(indices, dtype=torch.long)
        for layer in self._cache.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys = layer.keys.index_select(-2, index)  # [batch, heads, kept, head_dim]
                layer.values = layer.values.index_select(-2, index)
        self._length = len(indices)
