"""The transformers backend: any Hugging Face causal LM, one model call per sequence.

transformers' layers write their own cache type, so a sequence's cache handle here wraps a
DynamicCache (the one cache quickdraft does not implement itself). A batch of sequences is
run one after another: transformers has no ragged batch over separate caches.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from quickdraft.backends.backend import PassOutput, SeqPass, check_passes, logit_rows, tapped_layers
from quickdraft.models.precision import precision_of

PadSizes = dict[int, int]  # tokens in a pass -> tokens actually run (padding after them; measured faster)


class HFCache:
    """One sequence's DynamicCache and how many entries it holds."""

    def __init__(self, config) -> None:
        self.cache = DynamicCache(config=config)
        self.length = 0

    def truncate(self, length: int) -> None:
        held = self.cache.get_seq_length()  # more than self.length after a pass that failed midway
        if length < held:
            self.cache.crop(max(0, length) - held)  # a negative count removes entries
        self.length = min(self.length, max(0, length))

    def keep(self, indices: list[int]) -> None:
        if indices == list(range(len(indices))):
            self.truncate(len(indices))  # a prefix: the cheap common case
            return
        index = torch.tensor(indices, dtype=torch.long)
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                index = index.to(layer.keys.device)
                layer.keys = layer.keys.index_select(-2, index)  # [batch, heads, kept, head_dim]
                layer.values = layer.values.index_select(-2, index)
        self.length = len(indices)


class HFBackend:
    """A transformers causal LM. cache_config: the layout caches follow (a layer-subset view writes
    the full model's slots). pad_to: pad passes of some sizes to a size this machine runs faster."""

    def __init__(
        self,
        model: PreTrainedModel,
        name: str,
        tokenizer: PreTrainedTokenizerBase | None = None,
        eos_ids: frozenset[int] = frozenset(),
        cache_config=None,
        pad_to: PadSizes | None = None,
    ) -> None:
        self.model = model.eval()
        self.name, self.tokenizer, self.eos_ids = name, tokenizer, eos_ids
        self.pad_to: PadSizes = pad_to or {}
        self._cache_config = cache_config if cache_config is not None else model.config
        config = model.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.max_length = int(getattr(text_config, "max_position_embeddings", 0) or 1 << 30)
        self.layer_count = int(text_config.num_hidden_layers)  # any architecture: its config names the count
        head = model.get_output_embeddings().weight
        self.vocab_size, self.hidden_size = int(head.shape[0]), int(head.shape[1])
        self.device, self.dtype = head.device, head.dtype
        self.precision = precision_of(head.dtype)

    def new_cache(self, length: int | None = None) -> HFCache:
        return HFCache(self._cache_config)

    @torch.inference_mode()
    def forward(self, passes: list[SeqPass]) -> list[PassOutput]:
        check_passes(passes, self.max_length)
        tapped_layers(passes, range(self.layer_count))
        return [self._one(p) for p in passes]

    def _one(self, p: SeqPass) -> PassOutput:
        cache, n = p.cache, len(p.tokens)
        tokens, positions, mask = p.tokens, p.positions, p.mask
        padded = self.pad_to.get(n, n)
        if padded > n and cache.length + padded <= self.max_length:
            tokens, positions, mask = _pad(cache.length, tokens, positions, mask, padded, self.device)
        extra = {}
        if positions is not None:
            extra["position_ids"] = torch.tensor([positions], dtype=torch.long, device=self.device)  # [1, n]
        if mask is not None:
            # A 4D mask is used as given by transformers: [batch, heads, n, length + n], True = attend.
            extra["attention_mask"] = mask[None, None]
        out = self.model(
            input_ids=torch.tensor([tokens], dtype=torch.long, device=self.device),  # [1, n (+ pad)]
            cache=cache.cache,
            use_cache=True,
            logits_to_keep=0 if p.logits == "all" or len(tokens) > n else 1,
            output_hidden_states=p.hidden,
            **extra,
        )
        cache.length += len(tokens)
        cache.truncate(cache.length - (len(tokens) - n))  # drop the padding's entries
        logits = None if p.logits == "none" else logit_rows(out.logits[0, :n], p.logits).float()  # [rows, V]
        # The last entry of hidden_states is after the final norm; entry i < layers is layer i's input.
        taps = [out.hidden_states[i][0, :n] for i in p.taps]
        hidden = (torch.cat(taps, dim=-1) if taps else out.hidden_states[-1][0, :n]).float() if p.hidden else None
        return PassOutput(logits, hidden)


def _pad(
    cached: int,
    tokens: list[int],
    positions: list[int] | None,
    mask: torch.Tensor | None,
    size: int,
    device: torch.device,
) -> tuple[list[int], list[int], torch.Tensor]:
    """A pass of `size` tokens whose first n are the real ones; the padding comes after them and no
    real token sees it (so no real row changes), and its cache entries are dropped afterwards."""
    n, extra = len(tokens), size - len(tokens)
    positions = list(range(cached, cached + n)) if positions is None else list(positions)
    if mask is None:
        mask = torch.ones(n, cached + n, dtype=torch.bool, device=device).tril(diagonal=cached)
    full = torch.zeros(size, cached + size, dtype=torch.bool, device=device)
    full[:n, : cached + n] = mask
    full[n:, : cached + n] = True  # padding sees everything real, and itself
    full[n:, cached + n :] = torch.eye(extra, dtype=torch.bool, device=device)
    last = positions[-1]
    return [*tokens, *[tokens[-1]] * extra], [*positions, *range(last + 1, last + 1 + extra)], full
