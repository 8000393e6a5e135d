"""A GGUF file's config, tokenizer and tensor table as transformers reads them, reading the file's
metadata once (models/weights.py reads the tensors).

transformers' own GGUF loading (the legacy path it keeps for Llama, Mistral, Qwen2, Gemma 3 and more)
parses every metadata value of the file with gguf-py's reader, three times over (config,
tokenizer, weights): 15 s each for Gemma 3's 262,144-token vocabulary. This reads the metadata
with transformers' fast reader, which leaves the tokenizer's arrays unparsed, and the tensors
from their byte offsets; models/weights.py applies transformers' own name map and tensor
processors (Llama's q/k row order, Gemma's norm offsets), so the result is the legacy path's,
value for value (tests/test_gguf_convert.py). Other architectures take transformers' path unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, MODEL_ARCH_NAMES, GGMLQuantizationType, dequantize, get_tensor_name_map
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase, TokenizersBackend
from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING

# transformers' fast reader; its tensor table is read with its own helpers (GgufHeader itself
# refuses ggml types its de-quantizer lacks, such as Q5_0, which gguf-py's handles).
from transformers.integrations.gguf.reader import _mapped, _read_metadata, _read_tensor_table, read_gguf_metadata
from transformers.modeling_gguf_pytorch_utils import GGUF_TO_TRANSFORMERS_MAPPING, TensorProcessor
from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING

# Architectures whose legacy conversion is the generic key mapping alone (no special cases in
# transformers' load_gguf_checkpoint) and whose one-read result is tested equal to it (Mistral
# files are "llama" files): these take the one-read path, every other one transformers' own.
FAST_ARCHITECTURES = ("llama", "gemma3")


def fast_path(path: str | Path) -> bool:
    """Whether `path`'s architecture takes the one-read path."""
    metadata, _ = read_gguf_metadata(str(path))
    return _fast(metadata)


def _fast(metadata: dict) -> bool:
    return metadata["general.architecture"] in FAST_ARCHITECTURES


def config_dict(metadata: dict, tensor_names: tuple[str, ...]) -> dict:
    """The config dict transformers' legacy GGUF path builds, from the file's metadata."""
    architecture = metadata["general.architecture"]
    # transformers renames llama files whose name list holds "mistral" (a list membership test).
    name = metadata.get("general.name")
    updated = "mistral" if "llama" in architecture and name == "mistral" else architecture
    parsed: dict[str, dict] = {key: {} for key in GGUF_TO_TRANSFORMERS_MAPPING}
    parsed["config"]["tie_word_embeddings"] = "output.weight" not in tensor_names
    defaults = GGUF_CONFIG_DEFAULTS_MAPPING.get(updated, GGUF_CONFIG_DEFAULTS_MAPPING.get(architecture) or {})
    for key, value in defaults.items():
        parsed["config"].setdefault(key, value)
    for key, value in metadata.items():
        prefix, _, config_key = key.replace(architecture, updated).partition(".")
        if isinstance(value, str) and architecture in value:
            value = value.replace(architecture, updated)
        for parameter, renames in GGUF_TO_TRANSFORMERS_MAPPING.items():
            renamed = renames.get(prefix, {}).get(config_key)
            if renamed is not None and renamed != -1:  # -1: a key transformers reads and drops
                parsed[parameter][renamed] = value
    config = parsed["config"]
    if config["model_type"] == "gemma3":
        config["model_type"] = "gemma3_text"  # the file holds the text backbone only
    if "vocab_size" not in config and "tokenizer.ggml.tokens" in metadata:
        config["vocab_size"] = metadata["tokenizer.ggml.tokens"]  # the fast reader gives an array's length
    return config


def gguf_config(path: str | Path) -> tuple[PretrainedConfig, bool]:
    """A GGUF file's config from its metadata (read once), and whether its architecture takes the
    one-read path (else transformers' own GGUF reader builds the config: a minute for Gemma 3)."""
    metadata, names = read_gguf_metadata(str(path))
    if _fast(metadata):
        return _config(metadata, names), True
    return AutoConfig.from_pretrained(str(Path(path).parent), gguf_file=Path(path).name), False


def read_config(path: str | Path) -> PretrainedConfig:
    return _config(*read_gguf_metadata(str(path)))


def _config(metadata: dict, names: tuple[str, ...]) -> PretrainedConfig:
    values = config_dict(metadata, names)
    return AutoConfig.for_model(values.pop("model_type"), **values)


@dataclass(frozen=True)
class GgufTensor:
    """One tensor of a file: its name, shape [out, in] (torch order), type, and where its bytes are.
    The bytes are read when asked for, not mapped: a mapping's pages count in the process's RSS
    while it is open, so a mapped file stays resident beside the backend's own copy."""

    name: str
    shape: tuple[int, ...]
    kind: GGMLQuantizationType
    path: Path
    start: int  # byte offset in the file
    size: int  # bytes

    def raw(self) -> np.ndarray:
        """The stored bytes [rows, bytes per row] uint8, read from the file."""
        out = np.empty(self.size, dtype=np.uint8)
        self._read(out, self.start)
        return out.reshape(prod(self.shape[:-1]), -1)

    def values(self) -> np.ndarray:
        """De-quantized by gguf-py, as transformers' legacy path does: the same values."""
        return dequantize(self.raw(), self.kind).reshape(self.shape)

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Rows start:stop of a matrix [out, in], de-quantized (a block never spans two rows)."""
        stop = min(stop, self.shape[0])
        row_bytes = self.size // self.shape[0]
        out = np.empty((stop - start) * row_bytes, dtype=np.uint8)
        self._read(out, self.start + start * row_bytes)
        return dequantize(out.reshape(stop - start, row_bytes), self.kind).reshape(stop - start, self.shape[1])

    def _read(self, out: np.ndarray, at: int) -> None:
        with open(self.path, "rb", buffering=0) as handle:
            handle.seek(at)
            read = handle.readinto(memoryview(out))
        if read != out.size:
            raise ValueError(f"the file ends inside tensor {self.name} (read {read} of {out.size} bytes): truncated?")


def read_table(path: str | Path) -> tuple[dict, list[GgufTensor]]:
    """A file's metadata (tokenizer arrays left as their lengths) and its tensors, unread."""
    blob = _mapped(str(path))
    metadata, count, position = _read_metadata(blob, str(path))
    table, position = _read_tensor_table(blob, count, position)
    alignment = metadata.get("general.alignment", 32)
    data_start = (position + alignment - 1) // alignment * alignment
    tensors = []
    for name, shape, ggml_type, offset in table:
        try:
            kind = GGMLQuantizationType(ggml_type)
            block, block_bytes = GGML_QUANT_SIZES[kind]
        except (ValueError, KeyError):
            raise ValueError(
                f"tensor {name} has ggml type {ggml_type}, which the gguf package here cannot read"
            ) from None
        start, size = data_start + offset, prod(shape) // block * block_bytes
        if start + size > blob.size:
            raise ValueError(
                f"the file ends inside tensor {name} (bytes {start}-{start + size} of {blob.size}): truncated?"
            )
        tensors.append(GgufTensor(name, tuple(shape), kind, Path(path), start, size))
    return metadata, tensors


def gguf_to_hf_names(
    model: PreTrainedModel, architecture: str, processor: TensorProcessor | None = None
) -> dict[str, str]:
    """GGUF tensor name -> `model`'s parameter name, by gguf-py's name table for the architecture:
    transformers' own map for the architectures here, built with one table rather than one per
    submodule (7 s of SmolLM2's 12)."""
    processor = processor or TensorProcessor()
    arch = next((key for key, name in MODEL_ARCH_NAMES.items() if name == architecture), None)
    if arch is None:
        return {}
    table = get_tensor_name_map(arch, model.config.num_hidden_layers)
    names: dict[str, str] = {}
    for hf_name in model.state_dict():
        stem, dot, suffix = processor.preprocess_name(hf_name).rpartition(".")
        gguf_stem = table.get_name(stem)
        if gguf_stem is not None:
            names[f"{gguf_stem}{dot}{suffix}"] = hf_name
    return names


def read_tokenizer(path: str | Path, config: PretrainedConfig) -> PreTrainedTokenizerBase:
    """The file's tokenizer, built by transformers from the file, in the class AutoTokenizer picks
    for a GGUF (the config's registered class, else TokenizersBackend; a GGUF has no Mistral
    format files), found from `config` rather than from a second parse of the metadata."""
    path = Path(path)
    tokenizer_class = TOKENIZER_MAPPING.get(type(config), TokenizersBackend)
    if tokenizer_class is None or tokenizer_class.__name__ == "MistralCommonBackend":
        tokenizer_class = TokenizersBackend
    return tokenizer_class.from_pretrained(str(path.parent), gguf_file=path.name)
