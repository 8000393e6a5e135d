"""Sampling and run settings, declared once as the method options are (options.py): name, kind, default,
bounds and help. The CLI builds its flags from them (flags.py), the library checks values with them
(Decoder.generate and friends, SamplingParams), the bench checks its settings with them, and the
server's request schema (serve/protocol.py) reads their bounds and help.
"""

from __future__ import annotations

from typing import Any

from quickdraft.option import Option

MAX_TOP_LOGPROBS = 20  # alternatives reported per token at most (OpenAI's bound)
SEED_RANGE = (-(2**63), 2**64 - 1)  # what a torch generator takes

# How one prompt is decoded: keywords of Decoder.generate, start, stream and prepare; flags of generate.
SAMPLING_SETTINGS: tuple[Option, ...] = (
    Option("max_new_tokens", "new tokens at most", default=128, low=1),
    Option("temperature", "0 is greedy", kind=float, default=0.0, low=0.0, open_ends=(False, False)),
    Option("top_k", "sample from the k most likely tokens only (default: all)", low=1),
    Option(
        "top_p",
        "sample from the most likely tokens whose probabilities add up to p (default: all)",
        kind=float,
        low=0.0,
        high=1.0,
        open_ends=(True, False),
    ),
    Option("seed", "seed of the sampler's random numbers", default=0, low=SEED_RANGE[0], high=SEED_RANGE[1]),
    Option("stop", "stop string (repeatable)", kind=str, repeat=True),
    Option("chat", "apply the chat template (default: when the model has one)", kind=bool),
    Option("logprobs", "each new token's log-probability, with this many alternatives", low=0, high=MAX_TOP_LOGPROBS),
)
SAMPLING = {option.name: option for option in SAMPLING_SETTINGS}

# The server follows OpenAI's API, whose clients expect sampling by default (temperature 1, no
# nucleus cut, a fresh seed per request); the CLI, the library and the bench decode greedily with
# seed 0, so their output is the target's own greedy output, the same on every run.
OPENAI_DEFAULTS: dict[str, Any] = {"temperature": 1.0, "top_p": 1.0, "seed": None}

# What runs: flags of generate, bench, serve, train, export-head and plan; arguments of quickdraft.load.
RUN_SETTINGS: tuple[Option, ...] = (
    Option("target", "hub id, folder or .gguf file (default: the embedded SmolLM2-135M-Instruct)", kind=str),
    Option("draft", "draft model: hub id, folder or .gguf file", kind=str),
    Option("method", "drafting method, or a METHOD:key=value,... spec", kind=str),
    Option("threads", "CPU threads for torch and the llama.cpp backend (default: torch's choice)", low=1),
)
RUN = {option.name: option for option in RUN_SETTINGS}


def checked_sampling(**values: Any) -> dict[str, Any]:
    """The values, each checked by its declaration (a QuickdraftError names the first one refused)."""
    return {name: SAMPLING[name].check(value) for name, value in values.items()}
