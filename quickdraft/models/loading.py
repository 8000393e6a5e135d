"""Load a target or draft model from a hub id, a local folder, a GGUF file, or a loaded model.

GGUF files are de-quantized once (models/gguf_convert.py: transformers' conversion with the
metadata read once), then cached as safetensors so the next start takes about a second.
Every failure becomes a one-line QuickdraftError.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_model
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from quickdraft.errors import QuickdraftError
from quickdraft.models import gguf_convert
from quickdraft.models.embedded import DEFAULT_NAME, default_gguf_path

ModelSource = str | os.PathLike | PreTrainedModel | None


@dataclass
class LoadedModel:
    """A causal LM ready to run, with its tokenizer when one could be found."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase | None
    name: str
    gguf: Path | None = None  # the GGUF file it came from, if any (llama.cpp can run the same file)
    converted: Path | None = None  # the cache folder of its converted weights, if any
    # What is derived from the model once per process and shared by every decoder over it:
    # backends by (kind, precision, device, layers), native weights by (precision, device),
    # trained heads by (kind, folder, full vocabulary, device).
    backends: dict = field(default_factory=dict, repr=False)
    native: dict = field(default_factory=dict, repr=False)
    heads: dict = field(default_factory=dict, repr=False)

    @property
    def eos_ids(self) -> frozenset[int]:
        """Every id that ends generation: from the config, the generation config and the tokenizer."""
        ids: set[int] = set()
        for source in (self.model.config, getattr(self.model, "generation_config", None)):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if isinstance(value, int):
                ids.add(value)
            elif value:
                ids.update(int(v) for v in value)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return frozenset(ids)


def default_cache_dir() -> Path:
    """Where converted weights live: $XDG_CACHE_HOME/quickdraft or ~/.cache/quickdraft."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "quickdraft"


def load_model(
    source: ModelSource,
    tokenizer: PreTrainedTokenizerBase | None = None,
    cache_dir: str | os.PathLike | None = None,
    dtype: torch.dtype = torch.float32,
) -> LoadedModel:
    """Load `source` (None means the embedded default target) as a LoadedModel."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if source is None:
        loaded = _load_gguf(default_gguf_path(), cache, dtype)
        loaded.name = DEFAULT_NAME
        return loaded
    if isinstance(source, PreTrainedModel):
        return LoadedModel(source.eval(), tokenizer or _tokenizer_for(source), _model_name(source))
    if not isinstance(source, (str, os.PathLike)):
        raise QuickdraftError(
            f"a model must be a hub id, a path or a transformers model, not {type(source).__name__}"
        )
    loaded = _load_path_or_id(str(source), cache, dtype)
    if tokenizer is not None:
        loaded.tokenizer = tokenizer
    return loaded


def _load_path_or_id(source: str, cache: Path, dtype: torch.dtype) -> LoadedModel:
    path = Path(source).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise QuickdraftError(f"{source} is a file but not a .gguf model file")
        return _load_gguf(path, cache, dtype)
    if path.is_dir():
        if (path / "config.json").is_file():
            return _from_pretrained(str(path), dtype, path.name)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return _load_gguf(ggufs[0], cache, dtype)
        what = "several .gguf files (pass one)" if ggufs else "no config.json and no .gguf file"
        raise QuickdraftError(f"model folder {source} has {what}")
    if _looks_like_path(source):
        raise QuickdraftError(f"model not found: no such file or folder {source}")
    return _from_pretrained(source, dtype, source)


def _looks_like_path(source: str) -> bool:
    """Hub ids are 'name' or 'owner/name'; anything else is meant as a path."""
    return (
        source.startswith((".", "/", "~"))
        or source.endswith(".gguf")
        or source.count("/") > 1
        or "\\" in source
    )


def _from_pretrained(name_or_path: str, dtype: torch.dtype, name: str) -> LoadedModel:
    try:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype)
    except (OSError, ValueError, KeyError) as error:
        raise QuickdraftError(f"could not load model {name_or_path!r}: {_first_line(error)}") from error
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError, KeyError, TypeError):
        tokenizer = None
    return LoadedModel(model.eval(), tokenizer, name)


def _load_gguf(path: Path, cache: Path, dtype: torch.dtype) -> LoadedModel:
    """De-quantize a GGUF file into a cached safetensors folder, then load that folder."""
    converted = cache / "converted" / f"{path.stem}-{file_key(path)}"
    if not (converted / "model.safetensors").is_file():
        _convert_gguf(path, converted)
    loaded = _from_pretrained(str(converted), dtype, path.stem)
    loaded.gguf, loaded.converted = path, converted
    return loaded


def file_key(path: Path) -> str:
    """Identifies a file's contents cheaply: its resolved path, size, mtime, and the converter."""
    stat = path.stat()
    text = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|transformers {transformers.__version__}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _convert_gguf(path: Path, target: Path) -> None:
    print(f"quickdraft: converting {path.name} to safetensors (first use only), cache: {target}", file=sys.stderr)
    folder, name = str(path.parent), path.name
    try:
        if gguf_convert.fast_path(path):  # the file's metadata read once (seconds, not a minute for Gemma 3)
            config = gguf_convert.read_config(path)
            tokenizer = gguf_convert.read_tokenizer(path, config)
            model = gguf_convert.read_model(path, config)
        else:
            config = AutoConfig.from_pretrained(folder, gguf_file=name)
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, config=config, dtype=torch.float32)
    except Exception as error:  # gguf's reader raises many types on a bad file
        raise QuickdraftError(f"could not read GGUF file {path}: {_first_line(error)}") from error
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        save_model(model, str(staging / "model.safetensors"))  # handles tied embeddings
        config.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)  # atomic: a half-written cache is never seen
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _tokenizer_for(model: PreTrainedModel) -> PreTrainedTokenizerBase | None:
    name = getattr(model, "name_or_path", "") or ""
    if not name:
        return None
    try:
        return AutoTokenizer.from_pretrained(name)
    except Exception:  # no tokenizer files next to the model: token-id prompts still work
        return None


def _model_name(model: PreTrainedModel) -> str:
    return Path(getattr(model, "name_or_path", "") or type(model).__name__).name


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def other_tokenizer(target: LoadedModel, draft: LoadedModel) -> bool:
    """Whether both models have tokenizers and their vocabularies differ (drafts then go through
    the vocabularies' intersection, drafters/cross_vocab.py)."""
    return (target.tokenizer is not None and draft.tokenizer is not None
            and target.tokenizer.get_vocab() != draft.tokenizer.get_vocab())


def same_vocabulary(target: LoadedModel, draft: LoadedModel) -> bool:
    """Whether the draft's token ids mean what the target's mean (else it drafts through the
    vocabularies' intersection, drafters/cross_vocab.py); refuses a pair that cannot be matched."""
    target_size = target.model.get_output_embeddings().weight.shape[0]
    draft_size = draft.model.get_output_embeddings().weight.shape[0]
    if other_tokenizer(target, draft):
        return False
    if target.tokenizer is not None and draft.tokenizer is not None:
        if draft_size > target_size:
            raise QuickdraftError(
                f"draft {draft.name!r} has {draft_size} logits, more than the target's {target_size}"
            )
        return True
    if draft_size != target_size:
        raise QuickdraftError(
            f"draft {draft.name!r} has a vocabulary of {draft_size} tokens, target "
            f"{target.name!r} has {target_size}, and without both tokenizers their tokens cannot be matched"
        )
    return True
