"""The backend protocol: what the engine needs from anything that runs a model.

A backend is shared and loaded once per process: weights, tokenizer, vocabulary, context
length, EOS ids, device and dtype. A sequence owns only a cache handle (`new_cache()`), so
any number of sequences, of any methods, run over one copy of the weights. One `forward`
call runs a pass for several sequences at once, each with its own new tokens, positions and
optional tree mask, and returns each one's logits (and hidden states when asked).

Adding a backend is one class with these members; `tests/test_backends.py` builds a toy one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from transformers import PreTrainedTokenizerBase

LogitRows = Literal["all", "last", "none"]


class Cache(Protocol):
    """One sequence's state inside a backend (its KV cache)."""

    @property
    def length(self) -> int: ...  # tokens now cached

    def truncate(self, length: int) -> None:
        """Keep only the first `length` entries."""
        ...

    def keep(self, indices: list[int]) -> None:
        """Keep only the entries at these ascending indices (an accepted tree path)."""
        ...


@dataclass
class SeqPass:
    """One sequence's share of a batched pass: its tokens go after its cache's entries.

    positions: each token's position (None: consecutive after the cache).
    mask: [n, cache.length + n] bool on the backend's device, True where a token may attend
    (None: causal). logits: which rows' logits come back ("none" for a prefill whose logits
    nobody reads). hidden: also return the last hidden states [n, H] (after the final norm), or
    with taps, the inputs of those layers side by side [n, len(taps) H] (EAGLE-3's features).
    prompt: the rows are a prompt's (prefill): a backend may compute prompt rows with a kernel of
    their own (native bf16 widens them to fp32 where that is faster), the same for every prompt,
    so they need not equal decoded rows bit for bit; every other row must."""

    cache: Cache
    tokens: list[int]
    positions: list[int] | None = None
    mask: torch.Tensor | None = None
    logits: LogitRows = "all"
    hidden: bool = False
    taps: tuple[int, ...] = ()
    prompt: bool = False


@dataclass
class PassOutput:
    logits: torch.Tensor | None  # [rows, V] fp32 on the backend's device (rows: n, 1 or none)
    hidden: torch.Tensor | None = None  # [n, H] or [n, len(taps) H] fp32, when asked


class PassCostsOnFirstRead:
    """A backend's pass_ms, timed the first time it is read rather than at load: speculative
    methods' cost models read it, plain decoding never does. backends/select.py gives the backend
    `time_passes(backend)` (shapes.measure_pass_costs with its signature); without one it is None."""

    def __get__(self, backend, owner=None) -> dict[int, float] | None:
        if backend is None:
            return self
        values = vars(backend)
        if "_pass_ms" not in values:
            timing = values.get("time_passes")
            values["_pass_ms"] = timing(backend) if timing is not None else None
        return values["_pass_ms"]

    def __set__(self, backend, costs: dict[int, float] | None) -> None:
        vars(backend)["_pass_ms"] = costs


class Backend(Protocol):
    name: str  # the model's name
    vocab_size: int  # size of a logit vector
    max_length: int  # context length: the most cache entries a sequence may hold
    hidden_size: int
    device: torch.device
    dtype: torch.dtype  # of activations
    tokenizer: PreTrainedTokenizerBase | None
    eos_ids: frozenset[int]
    # Optional: measured milliseconds of a pass of n tokens (shapes.measure_pass_costs); the cost
    # model starts from it. Absent or None: the cost model starts from a generic prior.
    pass_ms: dict[int, float] | None
    # Optional: W where a backend's tree rows are exact only below the next multiple of W past the
    # root (backends/static.py); the engine cuts deeper tree nodes. Absent or None: no limit.
    tree_window: int | None
    # Optional: False where a sequence's rows can depend on the other sequences sharing its pool or
    # pass (llama.cpp built without the ordered-cells patch): a server then decodes one sequence at
    # a time. Absent: True.
    ordered_cells: bool

    def new_cache(self, length: int | None = None) -> Cache:
        """A new sequence's cache. length: the most entries it should need (prompt + new tokens), a
        hint a backend may size its cache by (None: up to max_length); never a limit."""
        ...

    def forward(self, passes: list[SeqPass]) -> list[PassOutput]:
        """Append each pass's tokens to its cache and score them; one output per pass, in order.
        Each cache may appear once. Raises ValueError when a cache would exceed max_length."""
        ...


def check_passes(passes: list[SeqPass], max_length: int) -> None:
    """Refuse a batch that names a cache twice or overflows the context (before any state changes)."""
    if len({id(p.cache) for p in passes}) != len(passes):
        raise ValueError("each sequence may appear once in a batched pass")
    for p in passes:
        if p.cache.length + len(p.tokens) > max_length:
            raise ValueError(f"cache would exceed the context length {max_length}")


def causal_mask(cached: int, n: int, device: torch.device) -> torch.Tensor:
    """[n, cached + n] bool: token i sees the cache and the new tokens up to itself."""
    return torch.ones(n, cached + n, dtype=torch.bool, device=device).tril(diagonal=cached)


def logit_rows(rows: torch.Tensor, which: LogitRows) -> torch.Tensor:
    """The rows [n, ...] a pass returns logits for."""
    return rows if which == "all" else rows[-1:] if which == "last" else rows[:0]


def tapped_layers(passes: list[SeqPass], layers: list[int] | range) -> set[int]:
    """The layers whose inputs some pass asked for (hidden with taps); a layer this backend does
    not run is refused."""
    wanted = {i for p in passes if p.hidden for i in p.taps}
    missing = wanted - set(layers)
    if missing:
        raise ValueError(
            f"hidden states of layers {sorted(missing)} were asked for; this backend runs layers "
            f"{min(layers)}..{max(layers)}"
        )
    return wanted
