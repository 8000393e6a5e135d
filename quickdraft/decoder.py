"""The public API: load a target (and a drafter), then generate text or token ids."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields

import torch
from transformers import PreTrainedTokenizerBase

from quickdraft.calibrate import calibrate_self_spec
from quickdraft.draft_length import make_draft_length
from quickdraft.engine import Generation, StopCheck
from quickdraft.errors import QuickdraftError
from quickdraft.methods import DrafterOptions, default_method, get_method
from quickdraft.models.select import check_precision, check_runner_kind, make_runner
from quickdraft.models.loading import LoadedModel, ModelSource, check_same_vocabulary, load_model
from quickdraft.sampling import SamplingParams
from quickdraft.stats import Stats, StepRecord

Prompt = str | list[int]


@dataclass
class GenerationOutput:
    """The result of Decoder.generate."""

    text: str  # the new text (ends before a stop string; special tokens skipped)
    token_ids: list[int]  # the new token ids (EOS included when it ended the output)
    prompt_token_ids: list[int]
    stats: Stats
    steps: list[StepRecord] = field(default_factory=list)

    @property
    def finish_reason(self) -> str:
        return self.stats.finish_reason

    def to_dict(self) -> dict:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "prompt_token_ids": self.prompt_token_ids,
            "finish_reason": self.finish_reason,
            "stats": self.stats.to_dict(),
        }


class Decoder:
    """A target model, a drafting method and K; generate() decodes one prompt at a time."""

    def __init__(
        self,
        target: LoadedModel,
        draft: LoadedModel | None = None,
        method: str | None = None,
        k: int | None = None,
        *,
        draft_length: str | None = None,
        k_max: int = 16,
        runner: str = "auto",
        precision: str = "fp32",
        **drafter_options,
    ) -> None:
        """runner: "auto" (native for Llama-family models, else transformers), "native" or "hf".
        drafter_options: the fields of DrafterOptions (max_ngram, min_ngram, confidence, layers, ...)."""
        self.target = target
        self.draft = draft
        self.method = method or default_method(draft is not None)
        spec = get_method(self.method)
        self.k = spec.default_k if k is None else k
        if spec.speculative and self.k < 1:
            raise QuickdraftError(f"k (draft tokens per step) must be >= 1, got {self.k}")
        if not spec.speculative:
            self.k = 0
        if spec.needs_draft_model and draft is None:
            raise QuickdraftError(f'method "{self.method}" needs a draft model (pass draft=... or --draft)')
        self._draft_length_choice = draft_length  # None: each method's own default
        draft_length = draft_length or spec.default_draft_length
        make_draft_length(draft_length, max(self.k, 1), k_max)  # fail early on a bad name
        check_runner_kind(runner)
        check_precision(precision, runner)
        self.draft_length, self.k_max, self.runner, self.precision = draft_length, k_max, runner, precision
        self.options = make_drafter_options(drafter_options)

        def runner_for(loaded: LoadedModel, layers: list[int] | None = None):
            return make_runner(loaded, runner, layers, precision)

        self._target_runner = make_runner(target, runner, None, precision, keep_hidden=spec.needs_hidden)
        self._drafter = spec.build(target, draft, self.options, runner_for)
        self.eos_ids = _eos_ids(target)
        self.calibration: dict[int, float] | None = None  # self-spec depth -> tok/s, when calibrated

    @property
    def context_length(self) -> int:
        """The most tokens (prompt + new) one sequence may hold."""
        return self._target_runner.max_length

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase | None:
        return self.target.tokenizer

    def with_method(self, method: str, k: int | None = None, **options) -> Decoder:
        """Another decoder over the same loaded models (no reload), e.g. a baseline.

        options: draft_length, k_max and DrafterOptions fields (default: this decoder's).
        """
        settings = (dict(draft_length=self._draft_length_choice, k_max=self.k_max, runner=self.runner,
                         precision=self.precision)
                    | asdict(self.options) | options)
        return Decoder(self.target, self.draft, method, k, **settings)

    def encode(self, prompt: Prompt, chat: bool | None = None) -> list[int]:
        """Prompt text or ids -> ids. Text gets the chat template when the model has one (chat=None)."""
        if isinstance(prompt, str):
            if not prompt:
                raise QuickdraftError("the prompt is empty")
            tokenizer = self._require_tokenizer()
            use_chat = bool(getattr(tokenizer, "chat_template", None)) if chat is None else chat
            if use_chat:
                if not getattr(tokenizer, "chat_template", None):
                    raise QuickdraftError(f"model {self.target.name!r} has no chat template")
                return self.encode_chat([{"role": "user", "content": prompt}])
            return list(tokenizer(prompt)["input_ids"])
        ids = [int(token) for token in prompt]
        if not ids:
            raise QuickdraftError("the prompt is empty")
        vocab = self._target_runner.vocab_size
        bad = [token for token in ids if not 0 <= token < vocab]
        if bad:
            raise QuickdraftError(f"prompt token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")
        return ids

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Chat messages [{"role", "content"}, ...] -> ids through the model's chat template."""
        tokenizer = self._require_tokenizer()
        if not getattr(tokenizer, "chat_template", None):
            raise QuickdraftError(f"model {self.target.name!r} has no chat template")
        if not messages:
            raise QuickdraftError("messages must not be empty")
        try:
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as error:  # jinja raises its own types for messages the template rejects
            raise QuickdraftError(f"the chat template rejected the messages: {error}") from error
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    def start(
        self,
        prompt: Prompt,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int = 0,
        stop: list[str] | str | None = None,
        chat: bool | None = None,
    ) -> Generation:
        """Prefill a prompt and return the Generation; step it yourself to stream."""
        sampling = SamplingParams(temperature, top_k, top_p)
        if max_new_tokens < 1:
            raise QuickdraftError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        prompt_ids = self.encode(prompt, chat)
        limit = self.context_length
        if len(prompt_ids) + max_new_tokens > limit:
            raise QuickdraftError(
                f"prompt ({len(prompt_ids)} tokens) plus max_new_tokens ({max_new_tokens}) exceeds "
                f"the context length of {self.target.name!r} ({limit} tokens)"
            )
        generator = torch.Generator().manual_seed(seed)
        return Generation(
            self._target_runner,
            self._drafter,
            prompt_ids,
            draft_length=make_draft_length(self.draft_length if self.k else "fixed", self.k, self.k_max),
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            generator=generator,
            eos_ids=self.eos_ids,
            stop_check=self._stop_check(stop),
        )

    def generate(self, prompt: Prompt, max_new_tokens: int = 128, **options) -> GenerationOutput:
        """Decode `prompt` (text or token ids). Options: temperature, top_k, top_p, seed, stop, chat."""
        generation = self.start(prompt, max_new_tokens, **options)
        for _ in generation:
            pass
        return self.finish(generation, options.get("stop"))

    def stream(self, prompt: Prompt, max_new_tokens: int = 128, **options) -> Iterator[StepRecord]:
        """Yield each step's record as it is decoded."""
        yield from self.start(prompt, max_new_tokens, **options)

    def finish(self, generation: Generation, stop: list[str] | str | None = None) -> GenerationOutput:
        """Package a finished Generation: decode the text and cut it before a stop string."""
        new_ids = generation.new_tokens
        text = self.decode(new_ids)
        for stop_string in _as_list(stop):
            if stop_string in text:
                text = text[: text.index(stop_string)]
        return GenerationOutput(text, new_ids, generation.tokens[: generation.prompt_length],
                                generation.stats, generation.steps)

    def decode(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def _stop_check(self, stop: list[str] | str | None) -> StopCheck | None:
        stops = _as_list(stop)
        if not stops:
            return None
        if any(not s for s in stops):
            raise QuickdraftError("stop strings must not be empty")
        self._require_tokenizer()
        longest = max(len(s) for s in stops)

        def check(new_ids: list[int]) -> bool:
            # A stop string ends in the newest token, so decoding a short tail suffices.
            tail = self.decode(new_ids[-(longest + 8) :])
            return any(s in tail for s in stops)

        return check

    def _require_tokenizer(self) -> PreTrainedTokenizerBase:
        if self.tokenizer is None:
            raise QuickdraftError(
                f"model {self.target.name!r} has no tokenizer: pass token ids, or tokenizer=..."
            )
        return self.tokenizer


def make_drafter_options(settings: dict) -> DrafterOptions:
    """Validate the user's drafter settings."""
    known = {f.name for f in fields(DrafterOptions)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise QuickdraftError(f"unknown option {unknown[0]!r}; drafter options are: {', '.join(sorted(known))}")
    confidence = settings.get("confidence")
    if confidence is not None and not 0.0 < confidence < 1.0:
        raise QuickdraftError(f"confidence must be in (0, 1), got {confidence}")
    if isinstance(settings.get("layers"), list):
        settings = settings | {"layers": tuple(settings["layers"])}
    return DrafterOptions(**settings)


def _as_list(stop: list[str] | str | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


def _eos_ids(target: LoadedModel) -> frozenset[int]:
    """Every id that ends generation: from the config, the generation config and the tokenizer."""
    ids: set[int] = set()
    sources = [target.model.config, getattr(target.model, "generation_config", None)]
    for source in sources:
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    if target.tokenizer is not None and target.tokenizer.eos_token_id is not None:
        ids.add(int(target.tokenizer.eos_token_id))
    return frozenset(ids)


def load(
    target: ModelSource = None,
    draft: ModelSource = None,
    method: str | None = None,
    k: int | None = None,
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    draft_tokenizer: PreTrainedTokenizerBase | None = None,
    cache_dir: str | os.PathLike | None = None,
    dtype: torch.dtype = torch.float32,
    draft_length: str | None = None,
    k_max: int = 16,
    runner: str = "auto",
    precision: str = "fp32",
    **drafter_options,
) -> Decoder:
    """Load a target (None: the embedded default) and an optional draft model into a Decoder.

    target/draft: a Hugging Face hub id, a local folder, a .gguf file, or a loaded model.
    method: a name in METHODS (default: "draft" with a draft, else "prompt-lookup").
    k: draft tokens per step (default per method); with draft_length "adaptive" or "cost"
    the starting K, varied per step up to k_max. draft_length: "fixed", "adaptive" or "cost"
    (default per method: "cost" for prompt lookup, else "fixed").
    runner: "auto" (the native runner for Llama, Mistral and Qwen2 models, else transformers),
    "native" or "hf". precision (native runner): "fp32"; "bf16" (weights and activations in
    bfloat16, norms and logits in fp32); "int8" (per-channel int8 weights) or "int4" (groups of
    32 with scale and zero; a GGUF file's own Q4_0/Q4_1 blocks as they are), both with bf16
    activations.
    drafter_options: max_ngram and min_ngram (prompt lookup), confidence (draft models stop
    drafting when their top probability falls below it), layers (self-spec: the first L
    layers, a list of layers to keep, or "auto" to calibrate).
    """
    if method is not None and get_method(method).needs_draft_model and draft is None:
        # Fail on a bad method before loading anything.
        raise QuickdraftError(f'method "{method}" needs a draft model (pass draft=... or --draft)')
    if k is not None and k < 1 and method != "none":
        raise QuickdraftError(f"k (draft tokens per step) must be >= 1, got {k}")
    target_model = load_model(target, tokenizer, cache_dir, dtype)
    draft_model = None
    if draft is not None:
        draft_model = load_model(draft, draft_tokenizer, cache_dir, dtype)
        check_same_vocabulary(target_model, draft_model)
    if drafter_options.get("layers") == "auto":
        return calibrate_self_spec(Decoder(target_model, draft_model, "none", runner=runner, precision=precision),
                                   method or "self-spec", k, draft_length=draft_length, k_max=k_max,
                                   **drafter_options)
    return Decoder(target_model, draft_model, method, k, draft_length=draft_length, k_max=k_max,
                   runner=runner, precision=precision, **drafter_options)
