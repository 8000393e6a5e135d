"""Self-distillation: replace each training response with the target's own greedy continuation.

Heads draft what the target will say, so they learn best from the target's outputs rather
than from the dataset's (often a bigger model's) wording. Prompts run in batches through the
engine's plain decoding on the target's backend (each prompt its own ragged rows, no padding),
which is many times faster per token than one at a time.

Answers are kept per prompt in an append-only file, written after each batch: an interrupted run
resumes where it stopped, and asking for more prompts later answers only the new ones. Each line
names its prompt by a digest of the prompt's ids, so the file holds little more than the answers
(the project keeps the default target's in data/answers, read with `train --answers`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from quickdraft.decoder import Decoder
from quickdraft.engine import prefill, step
from quickdraft.training.features import Sequence


def regenerate(
    decoder: Decoder,
    sequences: list[Sequence],
    max_new_tokens: int,
    batch_size: int = 32,
    progress: bool = True,
    on_batch: Callable[[list[Sequence]], None] | None = None,
) -> list[Sequence]:
    """Each sequence's prompt followed by the target's greedy response (ending at EOS, which it
    keeps, or the cap), decoded by `decoder` (plain decoding on its backend), `batch_size` prompts
    stepping together. on_batch: called with each batch's results as soon as they are made (to save them)."""
    # Similar lengths share a batch: their passes have similar sizes.
    order = sorted(range(len(sequences)), key=lambda i: sequences[i][1])
    result: list[Sequence | None] = [None] * len(sequences)
    bar = tqdm(total=len(sequences), desc="self-distill", unit="example", disable=not progress)
    for first in range(0, len(order), batch_size):
        chosen = order[first : first + batch_size]
        prompts = [sequences[i][0][: sequences[i][1]] for i in chosen]
        generations = [decoder.prepare(prompt, max_new_tokens) for prompt in prompts]
        prefill(generations)
        while live := [g for g in generations if not g.done]:
            step(live)
        for i, prompt, generation in zip(chosen, prompts, generations):
            if generation.error is not None:
                raise generation.error
            result[i] = (prompt + generation.new_tokens, len(prompt))  # an EOS ends new_tokens: heads learn to stop
        if on_batch is not None:
            on_batch([result[i] for i in chosen])
        bar.update(len(chosen))
    bar.close()
    return [r for r in result if r is not None]


def answers_file(cache: Path, model_name: str, max_new_tokens: int) -> Path:
    """Where one target's answers of up to `max_new_tokens` tokens are kept."""
    key = hashlib.sha256(model_name.encode()).hexdigest()[:12]  # another target never reads these
    return cache / f"answers-{key}-{max_new_tokens}.jsonl"


def prompt_key(prompt: list[int]) -> str:
    """The name an answers file gives a prompt: a digest of its ids (64 bits: no two of a few
    million prompts share one, by the birthday bound)."""
    return hashlib.sha256(json.dumps(prompt).encode()).hexdigest()[:16]


def read_answers(path: Path) -> dict[str, list[int]]:
    """prompt_key -> response ids from an answers file (each line [prompt key, response ids], or
    [prompt ids, response ids] as files written before 2026-12-06 hold); a last line cut short by
    a crash is skipped, and answered again."""
    answers: dict[str, list[int]] = {}
    if not path.is_file():
        return answers
    for line in path.read_text().splitlines():
        try:
            prompt, response = json.loads(line)
        except ValueError:
            continue
        answers[prompt if isinstance(prompt, str) else prompt_key(prompt)] = response
    return answers


def append_answers(path: Path, sequences: list[Sequence]) -> None:
    """Add answered sequences (prompt + response, where the response starts) to an answers file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps([prompt_key(ids[:start]), ids[start:]], separators=(",", ":")) for ids, start in sequences]
    with path.open("a+") as out:
        if out.tell() and (out.seek(out.tell() - 1), out.read(1))[1] != "\n":
            out.write("\n")  # a line a crash cut short stays on its own, and is skipped
        out.write("".join(line + "\n" for line in lines))
