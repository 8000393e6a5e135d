"""`quickdraft train medusa|eagle`: training data -> (self-distilled) sequences -> cached features
-> a trained head saved with its config."""

from __future__ import annotations

from pathlib import Path

from quickdraft.backends.kinds import LLAMA_CPP, NATIVE, TRAITS
from quickdraft.backends.llama_cpp import llama_cpp_installed
from quickdraft.backends.select import choose_backend
from quickdraft.decoder import Decoder
from quickdraft.errors import QuickdraftError
from quickdraft.heads.config import Eagle3Config
from quickdraft.models.loading import LoadedModel, load_model
from quickdraft.models.native_weights import supports
from quickdraft.models.weights import EMBED, LM_HEAD
from quickdraft.training.data import read_examples
from quickdraft.training.distill import answers_file, append_answers, prompt_key, read_answers, regenerate
from quickdraft.training.features import Sequence, encode_example, extract_features, load_features
from quickdraft.training.loop import TrainSettings
from quickdraft.training.train_eagle import train_eagle
from quickdraft.training.train_eagle3 import train_eagle3
from quickdraft.training.train_medusa import train_medusa

NORM = "model.norm.weight"  # the final norm (EAGLE-3 heads norm their output with the target's)

KINDS = ("medusa", "eagle")


# Sequences the llama.cpp backend distils at once: its sequences share one pool of cells, and every
# row's attention reads past the whole pool's cells, so wider batches got slower (2 cores, default
# target: 143 tokens/s at 16, 120 at 24, 102 at 32; benchmarks/llama_cpp_training.py times 16
# against native fp32 at 64).
LLAMA_CPP_DISTILL_BATCH = 16


def feature_decoder(
    loaded: LoadedModel, device: str = "cpu", precision: str | None = None, cells: int | None = None
) -> Decoder:
    """Plain decoding of the target on a backend that returns inner layers' states: what distils
    its answers and extracts its features. A GGUF file on a CPU, with no precision asked for, runs
    on llama.cpp where it returns them (its plain decoding is several times native fp32's);
    cells: that backend's pool of cache cells (None: its default). Else native where it runs the
    architecture, else hf. precision: the checkpoint's own where native computes at it (a GGUF
    file's: fp32; fp16 runs at bf16), so an 8B bf16 checkpoint needs no fp32 copy; None chooses so."""
    on_llama_cpp = precision is None and device == "cpu" and loaded.gguf is not None and llama_cpp_installed()
    if on_llama_cpp and TRAITS[LLAMA_CPP].inner_layers(loaded.config):
        return Decoder(loaded, None, "none", backend=LLAMA_CPP, device=device, context=cells)
    if precision is None:
        stored = loaded.stored_precision
        precision = stored if stored in TRAITS[NATIVE].precisions else "bf16"
        if not supports(loaded.config, precision):  # an architecture native runs at fp32 only (Gemma 3), or not at all
            precision = "fp32" if supports(loaded.config, "fp32") else stored
    choice = choose_backend(
        loaded.config,
        loaded.gguf,
        loaded.name,
        precision=precision,
        device=device,
        inner_layers=True,
        stored=loaded.stored_precision,
    )
    return Decoder(loaded, None, "none", backend=choice.kind, precision=choice.precision, device=device)


def features_folder(name: str, decoder: Decoder) -> str:
    """Where features made by this decoder's backend are cached: llama.cpp's beside native's, never
    mixed (the same weights, other arithmetic)."""
    return f"{name}-{LLAMA_CPP}" if decoder.backend_kind == LLAMA_CPP else name


def training_sequences(
    loaded: LoadedModel,
    data: list[Path],
    max_examples: int | list[int] | None,
    max_tokens: int,
    distill_tokens: int | None,
    cache: Path,
    distill_examples: int | list[int] | None = None,
    progress: bool = True,
    distill_batch: int = 64,
    decoder: Decoder | None = None,
    answers: Path | None = None,
) -> list[Sequence]:
    """Every file's first `max_examples` examples (one count, or one per file), encoded as the
    decoder encodes chats. With
    distill_tokens, the first `distill_examples` of each file (one count, or one per file; default:
    all) get the target's own
    responses instead of the dataset's (kept in `answers`, a folder; default: `cache`), decoded by
    `decoder` (default: feature_decoder); the rest keep the dataset's text."""
    limits = max_examples if isinstance(max_examples, list) else [max_examples] * len(data)
    if len(limits) != len(data):
        raise QuickdraftError(f"--max-examples: give one count, or one per data file ({len(data)})")
    files = [read_examples(path)[:limit] for path, limit in zip(data, limits)]
    if not any(files):
        raise QuickdraftError("no training examples in the data files")
    if loaded.tokenizer is None:
        raise QuickdraftError(f"target {loaded.name!r} has no tokenizer to encode the training text")
    encoded = [[encode_example(loaded.tokenizer, example, max_tokens) for example in file] for file in files]
    if distill_tokens is None:
        return [sequence for file in encoded for sequence in file]
    # Each file is distilled and cached on its own: adding a file later reuses the others' answers.
    counts = distill_examples if isinstance(distill_examples, list) else [distill_examples] * len(encoded)
    if len(counts) != len(encoded):
        raise QuickdraftError(f"--distill-examples: give one count, or one per data file ({len(encoded)})")
    decoder = decoder or feature_decoder(loaded)
    chosen = [
        distilled(decoder, file[:n], distill_tokens, answers or cache, progress, distill_batch)
        for file, n in zip(encoded, counts)
    ]
    rest = [sequence for file, n in zip(encoded, counts) for sequence in file[len(file[:n]) :]]
    return [sequence for file in chosen for sequence in file] + rest


def distilled(
    decoder: Decoder, sequences: list[Sequence], distill_tokens: int, folder: Path, progress: bool, batch: int = 64
) -> list[Sequence]:
    """The sequences' prompts with the target's greedy responses (plain decoding by `decoder`).
    Answers are kept per prompt in `folder` (one file per target and length) as each batch
    finishes: only prompts not answered before are run."""
    saved = answers_file(folder, decoder.target.name, distill_tokens)
    answers = read_answers(saved)
    prompts = [ids[:start] for ids, start in sequences if start > 0]
    keys = [prompt_key(p) for p in prompts]  # a digest of each prompt's ids, made once
    missing = list({k: (p, len(p)) for k, p in zip(keys, prompts) if k not in answers}.values())
    if missing:
        made = regenerate(
            decoder,
            missing,
            distill_tokens,
            batch_size=batch,
            progress=progress,
            on_batch=lambda done: append_answers(saved, done),
        )
        answers.update((prompt_key(ids[:start]), ids[start:]) for ids, start in made)
    return [(p + answers[k], len(p)) for k, p in zip(keys, prompts)]


def train(
    kind: str,
    target: str | None,
    data: list[Path],
    output: Path,
    *,
    heads: int = 3,
    max_examples: int | list[int] | None = None,
    max_tokens: int = 512,
    distill_tokens: int | None = None,
    distill_examples: int | list[int] | None = None,
    cache: Path | None = None,
    answers: Path | None = None,
    settings: TrainSettings = TrainSettings(),
    eagle: int = 3,
    progress: bool = True,
    distill_batch: int | None = None,
    feature_batch: int | None = None,
    target_precision: str | None = None,
    init: Path | None = None,
    head_layers: int = 1,
) -> dict:
    """Train a `kind` head for `target` (None: the embedded default) on `data` files; returns its
    config. eagle: 3 (fused features, training-time test) or 1 (last hidden state) for EAGLE heads.
    distill_batch: prompts answered at once (default: 64 on a CPU, 256 on a GPU, where a small
    target's decode step costs about the same for many rows as for few). feature_batch: tokens
    of one feature-extraction pass, several examples' rows side by side (default: one example a
    pass on a CPU; 16,384 on a GPU, where one example a pass is launch-bound).
    target_precision: what the target computes at for distillation and features (None: the
    checkpoint's own where the native backend has it; see feature_decoder). init: an EAGLE-3
    head folder to fine-tune instead of starting from the target's layers (of as many layers as
    head_layers or fewer: the ones it lacks are added). head_layers: an EAGLE-3 head's decoder
    layers. answers: the folder that keeps the target's distilled answers (default: `cache`),
    read before any prompt is run."""
    if kind not in KINDS:
        raise QuickdraftError(f"unknown head kind {kind!r}; choose one of: {', '.join(KINDS)}")
    if eagle not in (1, 3):
        raise QuickdraftError(f"--eagle must be 1 or 3, got {eagle}")
    if settings.unroll < 1:
        raise QuickdraftError(f"--unroll must be >= 1, got {settings.unroll}")
    if settings.prompt_rows < 0:
        raise QuickdraftError(f"--prompt-rows must be >= 0, got {settings.prompt_rows}")
    if settings.prompt_rows > 0 and (kind, eagle) != ("eagle", 3):
        raise QuickdraftError("--prompt-rows trains EAGLE-3 heads only (train eagle --eagle 3)")
    if head_layers < 1:
        raise QuickdraftError(f"--head-layers must be >= 1, got {head_layers}")
    if head_layers > 1 and (kind, eagle) != ("eagle", 3):
        raise QuickdraftError("--head-layers stacks EAGLE-3 heads only (train eagle --eagle 3)")
    if heads < 1:
        raise QuickdraftError(f"--heads must be >= 1, got {heads}")
    if init is not None and (kind, eagle) != ("eagle", 3):
        raise QuickdraftError("--init fine-tunes EAGLE-3 heads only (train eagle --eagle 3)")
    if distill_batch is not None and distill_batch < 1:
        raise QuickdraftError(f"--distill-batch must be >= 1, got {distill_batch}")
    if feature_batch is None:
        feature_batch = 1 if settings.device == "cpu" else 16384
    if feature_batch < 1:
        raise QuickdraftError(f"--feature-batch must be >= 1, got {feature_batch}")
    for path in data:
        read_examples(path)  # refuse evaluation sets and missing files before loading the model
    cache = cache if cache is not None else output / "cache"
    loaded = load_model(target)
    # Distillation and features run on the target's backend, where the head trains; no transformers model.
    batch = distill_batch or LLAMA_CPP_DISTILL_BATCH
    cells = batch * min(
        max_tokens + (distill_tokens or 0), int(getattr(loaded.config, "max_position_embeddings", 8192))
    )
    decoder = feature_decoder(loaded, settings.device, target_precision, cells)
    if distill_batch is None:
        distill_batch = (
            LLAMA_CPP_DISTILL_BATCH if decoder.backend_kind == LLAMA_CPP else 64 if settings.device == "cpu" else 256
        )
    sequences = training_sequences(
        loaded,
        data,
        max_examples,
        max_tokens,
        distill_tokens,
        cache,
        distill_examples,
        progress,
        distill_batch,
        decoder,
        answers,
    )
    lm_head = loaded.tensor(LM_HEAD).float()  # the head's own copies, read from the source
    embeddings = loaded.tensor(EMBED).float()
    backend = decoder.target_backend
    if kind == "eagle" and eagle == 3:
        config = Eagle3Config.from_target(loaded.config, head_layers)
        shards = load_features(
            extract_features(
                backend,
                sequences,
                cache / features_folder("features-eagle3", decoder),
                progress,
                config.features,
                batch_tokens=feature_batch,
                prompt_choices=settings.prompt_rows > 0,
            )
        )
        norm = loaded.tensor(NORM).float()
        return train_eagle3(shards, lm_head, norm, embeddings, config, output, settings, loaded.name, progress, init)
    shards = load_features(
        extract_features(
            backend, sequences, cache / features_folder("features", decoder), progress, batch_tokens=feature_batch
        )
    )
    if kind == "medusa":
        return train_medusa(shards, lm_head, heads, output, settings, loaded.name, progress)
    return train_eagle(shards, lm_head, embeddings, loaded.config, output, settings, loaded.name, progress)
