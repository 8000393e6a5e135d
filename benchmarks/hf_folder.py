"""The embedded default target as a plain Hugging Face folder (transformers reads the GGUF once),
for peers that load only such folders (vLLM). Made on first need, under bench-out/, never shipped."""

from __future__ import annotations

from pathlib import Path


def hf_folder(folder: Path, dtype: str) -> Path:
    """The embedded target's weights in `dtype` ("bfloat16", "float32") as a folder, made once."""
    if (folder / "config.json").exists():
        return folder
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from quickdraft.models.embedded import default_gguf_path

    gguf = default_gguf_path()
    kwargs = {"gguf_file": gguf.name}
    torch_dtype = getattr(torch, dtype)
    read = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch_dtype, **kwargs)
    config = read.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the GGUF's, which would tell vLLM to read the folder as a GGUF
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)  # a plain copy: gguf's is not saved
    model.load_state_dict(read.state_dict())
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(gguf.parent, **kwargs).save_pretrained(folder)
    return folder
