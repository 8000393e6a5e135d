"""The public API: load a target (and a drafter), then generate text or token ids."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from quickdraft.backends.kernel_timing import DECODE_ROWS, VERIFY_ROWS
from quickdraft.backends.kinds import AUTO
from quickdraft.backends.select import (
    auto_verdict,
    choose_backend,
    draft_backend,
    make_backend,
    observe_passes,
    resolve_device,
    shapes_folder,
)
from quickdraft.calibrate import calibrate_self_spec
from quickdraft.draft_length import DEFAULT_PRIOR_SLOPE, PassCosts, make_draft_length, prior_slope
from quickdraft.engine import Generation, prefill
from quickdraft.errors import QuickdraftError
from quickdraft.methods import MethodConfig, Parts, configure, reads_inner_layers
from quickdraft.models.loading import LoadedModel, ModelSource, load_model, same_vocabulary
from quickdraft.noise import PositionNoise
from quickdraft.options import MODEL_OPTIONS, current
from quickdraft.sampling import SamplingParams, TokenLogprob
from quickdraft.settings import SAMPLING, checked_sampling
from quickdraft.stats import Stats, StepRecord
from quickdraft.text import TextStream

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

    @property
    def logprobs(self) -> list[TokenLogprob] | None:
        """Each new token's log-probability under the target (when generate was given logprobs=)."""
        if not self.steps or self.steps[0].logprobs is None:
            return None
        return [entry for step in self.steps for entry in step.logprobs or []]

    def to_dict(self) -> dict:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "prompt_token_ids": self.prompt_token_ids,
            "finish_reason": self.finish_reason,
            "stats": self.stats.to_dict(),
        }


class Decoder:
    """A target model and a drafting method with its settings. Cheap to make: the backends and
    heads it uses are built once per loaded model and shared by every decoder over it, and each
    generation owns only its caches, so many generations (of any decoders) can step together."""

    def __init__(
        self,
        target: LoadedModel,
        draft: LoadedModel | None = None,
        method: str | None = None,
        k: int | None = None,
        *,
        cache_dir: str | os.PathLike | None = None,
        measure_shapes: bool = True,
        **options: Any,
    ) -> None:
        """method: a name in METHODS or a METHOD:key=value spec (default: "draft" with a draft model,
        else "prompt-lookup"). options: any of quickdraft.options.OPTIONS (precision, backend,
        device, max_ngram, tree_nodes, ...), checked once here. measure_shapes: time this machine's
        fastest pass shapes at load (once, cached) and use them."""
        options = current(options)  # an option's old name still works, with a warning
        self.target, self.draft = target, draft
        self.config: MethodConfig = configure(method, draft is not None, k=k, **options)
        config = self.config
        self.device = resolve_device(config.device)
        # The backend that runs the target: "llama.cpp", "static", "native" or "hf" (auto resolved here).
        choice = choose_backend(
            target.config,
            target.gguf,
            target.name,
            config.backend,
            config.precision,
            self.device,
            reads_inner_layers(target, config),
            target.stored_precision,
            (lambda: auto_verdict(target, self.device, cache_dir)) if measure_shapes else None,
        )
        self.backend_kind, self.precision, self.backend_reason = choice.kind, choice.precision, choice.reason
        self._cache_dir, self._measure = cache_dir, measure_shapes

        def backend_for(loaded: LoadedModel, layers: list[int] | None = None):
            kind, precision = (
                (self.backend_kind, self.precision)
                if loaded is target
                else draft_backend(self.backend_kind, self.precision, loaded, self.device)
            )
            # Where kernels are chosen by pass size (native bf16 on a CPU): a draft model's for the
            # one-token passes it drafts with (its bits never reach the output); the target's for
            # verify passes, whatever the method, so plain decoding has speculation's bits.
            rows = VERIFY_ROWS if loaded is target else DECODE_ROWS
            return make_backend(
                loaded, kind, precision, str(self.device), layers, measure_shapes, cache_dir, config.context, rows
            )

        self.target_backend = backend_for(target)
        shapes = shapes_folder(cache_dir) if measure_shapes else None
        self.drafter = config.definition.build(Parts(target, draft, self.target_backend, backend_for, shapes), config)
        self.eos_ids = self.target_backend.eos_ids
        self.pass_costs = PassCosts()  # what this decoder's passes cost: shared by its generations' cost models
        self.calibration: dict[int, float] | None = None  # self-spec depth -> tok/s, when calibrated

    @functools.cached_property
    def prior_slope(self) -> float:
        """The cost model's prior slope: from the target backend's measured pass costs where it has
        them (read, and so timed, only when a speculative generation first needs them)."""
        return prior_slope(getattr(self.target_backend, "pass_ms", None))

    def warm_up(self) -> None:
        """Do now the one-time jobs that speculation otherwise does on its first pass: a backend's
        exactness check (llama.cpp's exact_rows, target and draft model) and timing the target's
        passes for the cost model. A server calls it before it takes requests, so no request waits."""
        for backend in (self.target_backend, getattr(self.drafter, "backend", None)):
            getattr(backend, "exact_rows", None)  # reading it runs the check, once per backend
        _ = self.prior_slope  # reads pass_ms, and so times the passes once

    @property
    def batches_exactly(self) -> bool:
        """Whether a sequence's output stays its own when other sequences share its passes (every
        backend but a llama.cpp built without the ordered-cells patch, see Backend.ordered_cells)."""
        backends = (self.target_backend, getattr(self.drafter, "backend", None))
        return all(getattr(backend, "ordered_cells", True) for backend in backends if backend is not None)

    @property
    def method(self) -> str:
        return self.config.method

    @property
    def k(self) -> int:
        return self.config.k

    @property
    def draft_length(self) -> str:
        return self.config.draft_length

    @property
    def context_length(self) -> int:
        """The most tokens (prompt + new) one sequence may hold."""
        return self.target_backend.max_length

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase | None:
        return self.target.tokenizer

    def with_method(self, method: str | None = None, k: int | None = None, **options: Any) -> Decoder:
        """Another decoder over the same loaded models, backends and heads (nothing reloads), e.g. a
        baseline. It keeps this decoder's backend, precision and device, and (for the same method)
        its other settings, unless `options` change them."""
        options = current(options)
        same = method is None or method == self.method
        kept = {name: value for name, value in self.config.given if same or name in MODEL_OPTIONS}
        kept["precision"] = self.precision
        if options.get("backend", self.backend_kind) not in (self.backend_kind, AUTO):
            kept.pop("precision")  # another backend: its own default precision
        if k is not None:
            kept.pop("k", None)
        return Decoder(
            self.target,
            self.draft,
            method or self.method,
            k,
            cache_dir=self._cache_dir,
            measure_shapes=self._measure,
            **(kept | options),
        )

    def encode(self, prompt: Prompt, chat: bool | None = None) -> list[int]:
        """Prompt text or ids -> ids. Text gets the chat template when the model has one (chat=None)."""
        if isinstance(prompt, str):
            if not prompt:
                raise QuickdraftError("the prompt is empty")
            tokenizer = self._require_tokenizer()
            use_chat = bool(getattr(tokenizer, "chat_template", None)) if chat is None else chat
            if use_chat:
                return self.encode_chat([{"role": "user", "content": prompt}])
            return list(tokenizer(prompt)["input_ids"])
        ids = [int(token) for token in prompt]
        if not ids:
            raise QuickdraftError("the prompt is empty")
        vocab = self.target_backend.vocab_size
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

    def prepare(
        self,
        prompt: Prompt,
        max_new_tokens: int = SAMPLING["max_new_tokens"].default,
        temperature: float = SAMPLING["temperature"].default,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int = SAMPLING["seed"].default,
        stop: list[str] | str | None = None,
        chat: bool | None = None,
        text: bool = False,
        logprobs: int | None = None,
        tenant: str | None = None,
    ) -> Generation:
        """A checked Generation, not prefilled yet (engine.prefill does several at once).
        text: keep a TextStream (generation.text) even without stop strings, to stream text;
        logprobs: record each new token's log-probability with this many alternatives (0..20);
        tenant: whose earlier outputs a drafter that learns across sequences may draft from
        (suffix decoding; the server passes the API key's): never another tenant's."""
        sampling = SamplingParams(temperature, top_k, top_p)  # checks its three by their declarations
        checked_sampling(logprobs=logprobs, max_new_tokens=max_new_tokens, seed=seed, stop=stop, chat=chat)
        prompt_ids = self.encode(prompt, chat)
        limit = self.context_length
        if len(prompt_ids) + max_new_tokens > limit:
            raise QuickdraftError(
                f"prompt ({len(prompt_ids)} tokens) plus max_new_tokens ({max_new_tokens}) exceeds "
                f"the context length of {self.target.name!r} ({limit} tokens)"
            )
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        stream = TextStream(self.decode, stops) if stops or text else None  # refuses empty stop strings
        if stops:
            self._require_tokenizer()
        k = self.k
        policy = self.draft_length if k else "fixed"
        slope = self.prior_slope if policy == "cost" else DEFAULT_PRIOR_SLOPE  # only the cost model reads it
        return Generation(
            self.target_backend,
            self.drafter.for_tenant(tenant),
            prompt_ids,
            draft_length=make_draft_length(policy, k, self.config.k_max, self.pass_costs, slope),
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            generator=torch.Generator().manual_seed(seed),
            eos_ids=self.eos_ids,
            text=stream,
            logprobs=logprobs,
            noise=PositionNoise(seed, self.target_backend.vocab_size) if self.config.sampler == "gumbel" else None,
        )

    def start(
        self, prompt: Prompt, max_new_tokens: int = SAMPLING["max_new_tokens"].default, **options: Any
    ) -> Generation:
        """Prefill a prompt and return the Generation; step it yourself to stream (options as generate's)."""
        generation = self.prepare(prompt, max_new_tokens, **options)
        prefill([generation])
        if generation.error is not None:
            raise generation.error
        return generation

    def generate(
        self, prompt: Prompt, max_new_tokens: int = SAMPLING["max_new_tokens"].default, **options: Any
    ) -> GenerationOutput:
        """Decode `prompt` (text or token ids). Options: temperature, top_k, top_p, seed, stop, chat."""
        generation = self.start(prompt, max_new_tokens, **options)
        while not generation.done:
            generation.step()
        return self.finish(generation)

    def stream(
        self, prompt: Prompt, max_new_tokens: int = SAMPLING["max_new_tokens"].default, **options: Any
    ) -> Iterator[StepRecord]:
        """Yield each step's record as it is decoded."""
        yield from self.start(prompt, max_new_tokens, **options)

    def finish(self, generation: Generation) -> GenerationOutput:
        """Package a finished Generation: its text ends before a stop string."""
        new_ids = generation.new_tokens
        if self.config.backend == AUTO and observe_passes(
            self.target,
            self.device,
            self._cache_dir,
            [step.verify_time for step in generation.steps if not step.draft_tokens],
        ):
            print(
                f"quickdraft: this run's one-token passes came clearly faster than when auto chose the "
                f"{self.backend_kind} backend for {self.target.name} here; that choice is dropped and the next load "
                f"times the backends again",
                file=sys.stderr,
            )
        text = generation.text.finish() if generation.text is not None else self.decode(new_ids)
        return GenerationOutput(
            text, new_ids, generation.tokens[: generation.prompt_length], generation.stats, generation.steps
        )

    def decode(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def _require_tokenizer(self) -> PreTrainedTokenizerBase:
        if self.tokenizer is None:
            raise QuickdraftError(f"model {self.target.name!r} has no tokenizer: pass token ids, or tokenizer=...")
        return self.tokenizer


def load(
    target: ModelSource = None,
    draft: ModelSource = None,
    method: str | None = None,
    k: int | None = None,
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    draft_tokenizer: PreTrainedTokenizerBase | None = None,
    cache_dir: str | os.PathLike | None = None,
    measure_shapes: bool = True,
    **options: Any,
) -> Decoder:
    """Load a target (None: the embedded default) and an optional draft model into a Decoder.

    target/draft: a Hugging Face hub id, a local folder, a .gguf file, or a loaded model.
    method: a name in METHODS, or a METHOD:key=value spec (default: "draft" with a draft, else
    "prompt-lookup"). k: draft tokens per step (default per method). options: any setting
    declared in quickdraft.options.OPTIONS, e.g. precision ("fp32", "bf16", "int8", "int4"),
    backend ("auto", "native", "hf"), device ("auto", "cpu", "cuda"), draft_length ("fixed",
    "adaptive", "cost"), max_ngram, confidence, layers (self-spec; "auto" calibrates), tree_nodes.
    Every setting is checked before anything loads.
    """
    options = current(options)  # an option's old name still works, with a warning
    configure(method, draft is not None, k=k, **options)  # a bad setting fails before loading
    target_model = load_model(target, tokenizer, cache_dir)
    draft_model = None
    if draft is not None:
        draft_model = load_model(draft, draft_tokenizer, cache_dir)
        same_vocabulary(target_model, draft_model)  # refuses a pair whose tokens cannot be matched
    if options.get("layers") == "auto":
        settings = {name: value for name, value in options.items() if name in MODEL_OPTIONS}
        base = Decoder(
            target_model, draft_model, "none", cache_dir=cache_dir, measure_shapes=measure_shapes, **settings
        )
        return calibrate_self_spec(base, method or "self-spec", k, **options)
    return Decoder(target_model, draft_model, method, k, cache_dir=cache_dir, measure_shapes=measure_shapes, **options)
