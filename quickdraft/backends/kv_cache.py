"""One KV cache for every model quickdraft runs itself: targets, draft models, the EAGLE head.

Preallocated and grown by doubling (up to the context length), indexed by a length pointer:
rolling back a rejected draft moves the pointer, keeping an accepted tree path gathers its
entries to the front. Nothing grows by concatenation step after step.
"""

from __future__ import annotations

import torch


class KVCache:
    """Keys [layers, kv_heads, capacity, D] and values [layers, kv_heads, capacity, D (+1)] of one sequence.

    ones_column: each value row carries a trailing 1 and unwritten entries are zeros (the native
    backend's row-invariant attention reads whole chunks of keys and sums its softmax through that
    column). granularity: capacity grows in whole multiples of it (attention's key chunk), up to
    the context rounded up to a whole multiple, so the last chunk is whole too."""

    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        max_length: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        ones_column: bool = False,
        granularity: int = 1,
    ) -> None:
        self.layers, self.kv_heads, self.head_dim, self.max_length = layers, kv_heads, head_dim, max_length
        self.dtype, self.device = dtype, torch.device(device)
        self.ones_column, self.granularity = ones_column, granularity
        self.length = 0  # entries that hold real tokens
        self.keys = torch.empty(layers, kv_heads, 0, head_dim, dtype=dtype, device=self.device)
        self.values = torch.empty(layers, kv_heads, 0, head_dim + ones_column, dtype=dtype, device=self.device)

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    def reserve(self, needed: int) -> None:
        """Make room for `needed` entries (whole granules, at least double, at most the context)."""
        if needed <= self.capacity:
            return
        if needed > self.max_length:
            raise ValueError(f"cache would exceed the context length {self.max_length}")
        granules = -(-needed // self.granularity) * self.granularity
        capacity = min(-(-self.max_length // self.granularity) * self.granularity, max(granules, 2 * self.capacity))
        shape = (self.layers, self.kv_heads, capacity, self.head_dim)
        make = torch.zeros if self.ones_column else torch.empty  # chunks read unwritten entries: keep them 0
        keys = make(shape, dtype=self.dtype, device=self.device)
        values = make(shape[:-1] + (self.head_dim + self.ones_column,), dtype=self.dtype, device=self.device)
        if self.ones_column:
            values[..., self.head_dim] = 1
        keys[:, :, : self.length] = self.keys[:, :, : self.length]
        values[:, :, : self.length] = self.values[:, :, : self.length]
        self.keys, self.values = keys, values

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store keys and values [KV, n, D] of n new tokens after the cache's end (advance() commits them)."""
        n = keys.shape[1]
        self.keys[layer, :, self.length : self.length + n] = keys
        self.values[layer, :, self.length : self.length + n, : self.head_dim] = values

    def advance(self, n: int) -> None:
        self.length += n

    def truncate(self, length: int) -> None:
        """Keep the first `length` entries: a pointer move."""
        self.length = min(self.length, max(0, length))

    @torch.inference_mode()  # the tensors may be inference tensors
    def keep(self, indices: list[int]) -> None:
        """Keep only the entries at these ascending indices (an accepted tree path), moved to the front."""
        if indices == list(range(len(indices))):
            self.truncate(len(indices))
            return
        index = torch.tensor(indices, dtype=torch.long, device=self.device)
        kept = len(indices)
        self.keys[:, :, :kept] = self.keys[:, :, index]  # gather first, then write: no aliasing
        self.values[:, :, :kept] = self.values[:, :, index]
        self.length = kept
