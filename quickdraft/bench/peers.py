"""Peers timed in the same run: transformers' model.generate (plain, prompt lookup, assistant
model, early exit) and llama.cpp through llama-cpp-python when it is installed."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import torch

from quickdraft.bench.contenders import BASELINE, RunRecord
from quickdraft.models.loading import LoadedModel, other_tokenizer

PROMPT_LOOKUP_TOKENS = 10  # what transformers' docs and llama-cpp-python's examples use


class TransformersGenerate:
    """model.generate with extra generation options; sampling with no top-k/top-p unless asked."""

    chain, speculative = True, True
    reference = BASELINE  # its greedy tokens are compared with quickdraft's plain decoding
    seeded = False  # its sampled text follows its own random numbers

    def __init__(self, name: str, target: LoadedModel, eos_ids: frozenset[int], **options) -> None:
        self.name, self.model, self.options = name, target.model, options
        self.eos = sorted(eos_ids)
        self.speculative = bool(options)

    def run(self, prompt_ids: list[int], max_new_tokens: int, temperature: float, seed: int) -> RunRecord:
        input_ids = torch.tensor([prompt_ids])  # [1, prompt]
        sampling = (
            dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
            if temperature > 0
            else dict(do_sample=False, temperature=None, top_k=None, top_p=None)
        )
        torch.manual_seed(seed)  # generate samples from torch's default generator
        start = time.perf_counter()
        with torch.inference_mode():
            output = self.model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=max_new_tokens,
                eos_token_id=self.eos or None,
                pad_token_id=self.eos[0] if self.eos else 0,
                **sampling,
                **self.options,
            )
        seconds = time.perf_counter() - start
        return RunRecord(output[0, len(prompt_ids) :].tolist(), seconds)


def transformers_peers(
    target: LoadedModel, draft: LoadedModel | None, eos_ids: frozenset[int], early_exit_layers: int | None = None
) -> list[TransformersGenerate]:
    """Plain generate, its prompt lookup, its assisted generation (with a draft) and early exit."""
    layers = early_exit_layers or max(1, target.layers // 4)
    peers = [
        TransformersGenerate("transformers generate", target, eos_ids),
        TransformersGenerate(
            f"transformers prompt_lookup_num_tokens={PROMPT_LOOKUP_TOKENS}",
            target,
            eos_ids,
            prompt_lookup_num_tokens=PROMPT_LOOKUP_TOKENS,
        ),
        TransformersGenerate(
            f"transformers assistant_early_exit={layers}", target, eos_ids, assistant_early_exit=layers
        ),
    ]
    if draft is not None and not other_tokenizer(target, draft):
        peers.append(TransformersGenerate("transformers assistant_model", target, eos_ids, assistant_model=draft.model))
    elif (
        draft is not None
    ):  # another tokenizer: transformers' universal assisted generation re-tokenizes the draft's text
        peers.append(
            TransformersGenerate(
                "transformers assistant_model (universal assisted generation)",
                target,
                eos_ids,
                assistant_model=draft.model,
                tokenizer=target.tokenizer,
                assistant_tokenizer=draft.tokenizer,
            )
        )
    return peers


def llama_cpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


class LlamaCpp:
    """llama.cpp on the same GGUF file, plain or with its prompt-lookup decoding."""

    chain = True
    reference = BASELINE
    seeded = False

    def __init__(self, gguf: Path, eos_ids: frozenset[int], prompt_lookup: bool, context: int = 4096) -> None:
        from llama_cpp import Llama  # optional dependency: only when installed
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.speculative, self.eos_ids = prompt_lookup, eos_ids
        self.name = f"llama.cpp prompt lookup num_pred_tokens={PROMPT_LOOKUP_TOKENS}" if prompt_lookup else "llama.cpp"
        draft = LlamaPromptLookupDecoding(num_pred_tokens=PROMPT_LOOKUP_TOKENS) if prompt_lookup else None
        # logits_all with a draft model: llama-cpp-python 0.3.36 sizes its logits buffer from this
        # argument, and overflows it on prompts over 512 tokens when it is left False.
        self.llm = Llama(
            model_path=str(gguf),
            n_ctx=context,
            n_threads=torch.get_num_threads(),
            draft_model=draft,
            logits_all=prompt_lookup,
            verbose=False,
        )

    def run(self, prompt_ids: list[int], max_new_tokens: int, temperature: float, seed: int) -> RunRecord:
        self.llm.reset()  # no prefix reuse between runs: every contender prefills
        self.llm.set_seed(seed)
        tokens: list[int] = []
        start = time.perf_counter()
        for token in self.llm.generate(
            prompt_ids, temp=temperature, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True
        ):
            tokens.append(int(token))
            if token in self.eos_ids or len(tokens) == max_new_tokens:
                break
        return RunRecord(tokens, time.perf_counter() - start)


def llama_cpp_peers(gguf: Path | None, eos_ids: frozenset[int]) -> list[LlamaCpp]:
    """Plain and prompt-lookup llama.cpp on `gguf`, when llama-cpp-python is installed and a GGUF is known."""
    if gguf is None or not llama_cpp_available():
        return []
    return [LlamaCpp(gguf, eos_ids, prompt_lookup=False), LlamaCpp(gguf, eos_ids, prompt_lookup=True)]
