"""Backends: what runs a model for the engine. One protocol (backend.py), one KV cache (kv_cache.py),
the native backend (native.py), the transformers backend (hf.py), and the choice between them
(select.py), with kernels and passes timed per machine (kernel_timing.py)."""

from quickdraft.backends.backend import Backend, Cache, PassOutput, SeqPass
from quickdraft.backends.kv_cache import KVCache

__all__ = ["Backend", "Cache", "KVCache", "PassOutput", "SeqPass"]
