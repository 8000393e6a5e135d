"""Load a target or draft model from a hub id, a local folder, a GGUF file, or a loaded model.

A loaded model is its config, its tokenizer and a weight source (models/weights.py): backends read
the weights from the file tensor by tensor, and llama.cpp opens a GGUF file itself. The
transformers model is built only when something asks for it (the hf backend, in the checkpoint's
own dtype; the transformers peers), once per dtype. A GGUF file's tokenizer is built once from its
metadata and cached (seconds for Gemma 3's 262,144 tokens). Every failure becomes a one-line QuickdraftError.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from quickdraft.errors import QuickdraftError
from quickdraft.models import gguf_convert
from quickdraft.models.embedded import DEFAULT_NAME, default_gguf_path
from quickdraft.models.precision import get_precision
from quickdraft.models.weights import (
    GgufWeights,
    ModuleWeights,
    SafetensorsWeights,
    WeightSource,
    build_model,
    check_shapes,
    meta_model,
    stored_precision,
    tensor_or_tied,
)

ModelSource = str | os.PathLike | PreTrainedModel | None


@dataclass
class LoadedModel:
    """A causal LM ready to run: its config, its tokenizer when one could be found, and where its
    weights are read from."""

    config: PretrainedConfig
    tokenizer: PreTrainedTokenizerBase | None
    name: str
    weights: WeightSource
    gguf: Path | None = None  # the GGUF file it came from, if any (llama.cpp runs it as it is)
    build: Callable[[torch.dtype], PreTrainedModel] | None = field(
        default=None, repr=False
    )  # makes a transformers model
    generation: GenerationConfig | None = field(default=None, repr=False)
    # What is derived from the model once per process and shared by every decoder over it:
    # backends by (kind, precision, device, layers), native weights by (precision, device),
    # trained heads by (kind, folder, full vocabulary, device), transformers models by dtype.
    backends: dict = field(default_factory=dict, repr=False)
    native: dict = field(default_factory=dict, repr=False)
    heads: dict = field(default_factory=dict, repr=False)
    built: dict[torch.dtype, PreTrainedModel] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, name: str) -> LoadedModel:
        """A transformers model already in memory (its parameters are the weight source)."""
        model.eval()
        weights = ModuleWeights(model)
        return cls(
            model.config,
            tokenizer,
            name,
            weights,
            generation=getattr(model, "generation_config", None),
            build=lambda dtype: build_model(model.config, weights, dtype),
            built={model.dtype: model},
        )

    @property
    def stored_precision(self) -> str:
        """The precision the checkpoint stores its weights in (fp32 for a GGUF file): what the hf
        backend computes at unless another is asked for."""
        return stored_precision(self.weights)

    def transformers_model(self, dtype: torch.dtype | None = None) -> PreTrainedModel:
        """The transformers model in `dtype` (None: the checkpoint's own), built from the source on
        first use and kept: only the hf backend and the transformers peers ask for one."""
        dtype = dtype or get_precision(self.stored_precision).dtype
        if dtype not in self.built:
            if self.build is None:
                raise QuickdraftError(f"{self.name!r} has no transformers model to build")
            self.built[dtype] = self.build(dtype).eval()
        return self.built[dtype]

    @property
    def model(self) -> PreTrainedModel:
        """The transformers model in fp32 (the transformers peers of `quickdraft bench` run it so)."""
        return self.transformers_model(torch.float32)

    def tensor(self, name: str) -> torch.Tensor:
        """One weight by its transformers name, from the source (a tied LM head is the embedding)."""
        return tensor_or_tied(self.weights, self.config, name)

    @property
    def layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def vocab_size(self) -> int:
        """Logits per position (the LM head's rows)."""
        return int(self.config.vocab_size)

    @property
    def eos_ids(self) -> frozenset[int]:
        """Every id that ends generation: from the config, the generation config and the tokenizer."""
        ids: set[int] = set()
        for source in (self.config, self.generation):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if isinstance(value, int):
                ids.add(value)
            elif value:
                ids.update(int(v) for v in value)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return frozenset(ids)


def default_cache_dir() -> Path:
    """Where cached tokenizers and measured pass shapes live: $XDG_CACHE_HOME/quickdraft or ~/.cache/quickdraft."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "quickdraft"


def load_model(
    source: ModelSource, tokenizer: PreTrainedTokenizerBase | None = None, cache_dir: str | os.PathLike | None = None
) -> LoadedModel:
    """Load `source` (None means the embedded default target) as a LoadedModel: its config,
    tokenizer and weight source; a transformers model is built only when asked for
    (LoadedModel.transformers_model)."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if source is None:
        loaded = _load_gguf(default_gguf_path(), cache)
        loaded.name = DEFAULT_NAME
        return loaded
    if isinstance(source, PreTrainedModel):
        return LoadedModel.of(source, tokenizer or _tokenizer_for(source), _model_name(source))
    if not isinstance(source, (str, os.PathLike)):
        raise QuickdraftError(f"a model must be a hub id, a path or a transformers model, not {type(source).__name__}")
    loaded = _load_path_or_id(str(source), cache)
    if tokenizer is not None:
        loaded.tokenizer = tokenizer
    return loaded


def _load_path_or_id(source: str, cache: Path) -> LoadedModel:
    path = Path(source).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise QuickdraftError(f"{source} is a file but not a .gguf model file")
        return _load_gguf(path, cache)
    if path.is_dir():
        if (path / "config.json").is_file():
            return _load_folder(path, path.name)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return _load_gguf(ggufs[0], cache)
        what = "several .gguf files (pass one)" if ggufs else "no config.json and no .gguf file"
        raise QuickdraftError(f"model folder {source} has {what}")
    if _looks_like_path(source):
        raise QuickdraftError(f"model not found: no such file or folder {source}")
    return _load_hub(source)


def _looks_like_path(source: str) -> bool:
    """Hub ids are 'name' or 'owner/name'; anything else is meant as a path."""
    return source.startswith((".", "/", "~")) or source.endswith(".gguf") or source.count("/") > 1 or "\\" in source


def _load_hub(model_id: str) -> LoadedModel:
    """A hub id: its files fetched (or found in the hub cache) into a folder, then loaded as one."""
    from huggingface_hub import snapshot_download

    files = ["*.json", "*.model", "*.txt", "*.jinja"]  # config, tokenizer and chat template files
    try:
        folder = Path(snapshot_download(model_id, allow_patterns=[*files, "*.safetensors"]))
        if not any(folder.glob("*.safetensors")):  # an older checkpoint: PyTorch weight files only
            folder = Path(snapshot_download(model_id, allow_patterns=[*files, "*.bin"]))
    except Exception as error:  # the hub client raises many types: offline, unknown id, gated
        raise QuickdraftError(f"could not load model {model_id!r}: {_first_line(error)}") from error
    return _load_folder(folder, model_id)


def _load_folder(folder: Path, name: str) -> LoadedModel:
    """A transformers folder: safetensors are read in place; other weight files (.bin) are loaded
    by transformers."""
    try:
        config = AutoConfig.from_pretrained(folder)
    except (OSError, ValueError, KeyError) as error:
        raise QuickdraftError(f"could not load model {str(folder)!r}: {_first_line(error)}") from error
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError, KeyError, TypeError):
        tokenizer = None
    try:
        generation = GenerationConfig.from_pretrained(folder)
    except OSError:
        generation = None

    def build(dtype: torch.dtype) -> PreTrainedModel:
        try:
            return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
        except (OSError, ValueError, KeyError) as error:
            raise QuickdraftError(f"could not load model {str(folder)!r}: {_first_line(error)}") from error

    if not any(folder.glob("*.safetensors")):  # .bin files: transformers reads them (in their own dtype)
        loaded = LoadedModel.of(build("auto"), tokenizer, name)
        loaded.generation = generation or loaded.generation
        return loaded
    weights = SafetensorsWeights(folder)
    check_shapes(config, weights, f"model folder {folder}")
    return LoadedModel(config, tokenizer, name, weights, build=build, generation=generation)


def _load_gguf(path: Path, cache: Path) -> LoadedModel:
    """A GGUF file: its config and tokenizer from its metadata (the tokenizer cached), its weights
    read from the file when a backend asks; nothing de-quantized up front, nothing written but the
    tokenizer."""
    folder, name = str(path.parent), path.name
    try:
        config, fast = gguf_convert.gguf_config(path)
        model = meta_model(config)  # names and shapes, no storage: made once for both
        weights = GgufWeights(path, config, model)
        check_shapes(config, weights, f"GGUF file {path}", model)
        tokenizer = _cached_tokenizer(path, config, fast, cache)
    except QuickdraftError:
        raise
    except Exception as error:  # gguf's reader raises many types on a bad file
        raise QuickdraftError(f"could not read GGUF file {path}: {_first_line(error)}") from error

    def build(dtype: torch.dtype) -> PreTrainedModel:
        try:
            if fast:
                return build_model(config, weights, dtype)
            return AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, config=config, dtype=dtype)
        except Exception as error:
            raise QuickdraftError(f"could not read GGUF file {path}: {_first_line(error)}") from error

    return LoadedModel(
        config,
        tokenizer,
        path.stem,
        weights,
        gguf=path,
        build=build,
        generation=GenerationConfig.from_model_config(config),
    )


def _cached_tokenizer(path: Path, config: PretrainedConfig, fast: bool, cache: Path) -> PreTrainedTokenizerBase:
    """The GGUF file's tokenizer, built from its metadata on first use and kept as a folder."""
    folder = cache / "tokenizers" / f"{path.stem}-{file_key(path)}"
    if (folder / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(folder)
    if fast:
        tokenizer = gguf_convert.read_tokenizer(path, config)
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    try:
        tokenizer.save_pretrained(staging)
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)  # atomic: a half-written cache is never seen
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return tokenizer


def file_key(path: Path) -> str:
    """Identifies a file's contents cheaply: its resolved path, size, mtime, and the reader."""
    stat = path.stat()
    text = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|transformers {transformers.__version__}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


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
    return (
        target.tokenizer is not None
        and draft.tokenizer is not None
        and target.tokenizer.get_vocab() != draft.tokenizer.get_vocab()
    )


def same_vocabulary(target: LoadedModel, draft: LoadedModel) -> bool:
    """Whether the draft's token ids mean what the target's mean (else it drafts through the
    vocabularies' intersection, drafters/cross_vocab.py); refuses a pair that cannot be matched."""
    target_size, draft_size = target.vocab_size, draft.vocab_size
    if other_tokenizer(target, draft):
        return False
    if target.tokenizer is not None and draft.tokenizer is not None:
        if draft_size > target_size:
            raise QuickdraftError(f"draft {draft.name!r} has {draft_size} logits, more than the target's {target_size}")
        return True
    if draft_size != target_size:
        raise QuickdraftError(
            f"draft {draft.name!r} has a vocabulary of {draft_size} tokens, target "
            f"{target.name!r} has {target_size}, and without both tokenizers their tokens cannot be matched"
        )
    return True
