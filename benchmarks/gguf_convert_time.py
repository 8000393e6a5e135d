"""Seconds to turn a GGUF file into a transformers model, config and tokenizer: quickdraft's
one-read conversion (models/gguf_convert.py) against transformers' own, alternating, and whether
they agree (every tensor, the config, the tokenizer's ids).

    .venv/bin/python benchmarks/gguf_convert_time.py [FILE.gguf ...]   (default: the embedded target)
"""

from __future__ import annotations

import platform
import sys
import time
from datetime import date
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from quickdraft.models import default_gguf_path, gguf_convert
from quickdraft.models.weights import GgufWeights, build_model

TEXT = "Hello world! The quick brown fox, 12345 naïve   spaces\n\ttabs"


def ours(path: Path):
    config = gguf_convert.read_config(path)
    return config, build_model(config, GgufWeights(path, config)), gguf_convert.read_tokenizer(path, config)


def theirs(path: Path):
    folder, name = str(path.parent), path.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    return (
        config,
        AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, config=config, dtype=torch.float32),
        tokenizer,
    )


def main() -> None:
    files = [Path(p) for p in sys.argv[1:]] or [default_gguf_path()]
    print(f"{date.today()} · {platform.processor() or platform.machine()} · {torch.get_num_threads()} threads")
    for path in files:
        seconds = {}
        results = {}
        for label, convert in (("quickdraft", ours), ("transformers", theirs)):
            start = time.perf_counter()
            results[label] = convert(path)
            seconds[label] = time.perf_counter() - start
        (_, model, tok), (_, their_model, their_tok) = results["quickdraft"], results["transformers"]
        mine, other = model.state_dict(), their_model.state_dict()
        same = mine.keys() == other.keys() and all(torch.equal(mine[k], other[k]) for k in mine)
        same = same and tok(TEXT)["input_ids"] == their_tok(TEXT)["input_ids"]
        print(
            f"{path.name}: quickdraft {seconds['quickdraft']:.1f} s, transformers {seconds['transformers']:.1f} s "
            f"({seconds['transformers'] / seconds['quickdraft']:.1f}x), same tensors and ids: {same}"
        )


if __name__ == "__main__":
    main()
