"""Self-distillation: replace each training response with the target's own greedy continuation.

Heads draft what the target will say, so they learn best from the target's outputs rather
than from the dataset's (often a bigger model's) wording. Prompts run in batches through
transformers' generate (left-padded), which is many times faster per token than one at a time.

Answers are kept per prompt in an append-only file, written after each batch: an interrupted run
resumes where it stopped, and asking for more prompts later answers only the new ones.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import PreTrainedModel

from quickdraft.heads.features import Sequence


@torch.inference_mode()
def regenerate(model: PreTrainedModel, sequences: list[Sequence], pad_id: int, eos_ids: list[int],
               max_new_tokens: int, batch_size: int = 32, progress: bool = True,
               on_batch: Callable[[list[Sequence]], None] | None = None) -> list[Sequence]:
    """Each sequence's prompt followed by the target's greedy response (ending at EOS or the cap).
    on_batch: called with each batch's results as soon as they are made (to save them)."""
    # Similar lengths share a batch, so little compute goes to padding.
    order = sorted(range(len(sequences)), key=lambda i: sequences[i][1])
    result: list[Sequence | None] = [None] * len(sequences)
    bar = tqdm(total=len(sequences), desc="self-distill", unit="example", disable=not progress)
    for first in range(0, len(order), batch_size):
        chosen = order[first : first + batch_size]
        prompts = [sequences[i][0][: sequences[i][1]] for i in chosen]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])  # [B, width], left-padded
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])  # [B, width]
        out = model.generate(input_ids=ids.to(model.device), attention_mask=attention.to(model.device),
                             max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=eos_ids, pad_token_id=pad_id).cpu()
        for row, i in enumerate(chosen):
            response = out[row, width:].tolist()
            ends = [n for n, token in enumerate(response) if token in eos_ids]
            response = response[: ends[0] + 1] if ends else response  # keep the EOS: heads learn to stop
            result[i] = (prompts[row] + response, len(prompts[row]))
        if on_batch is not None:
            on_batch([result[i] for i in chosen])
        bar.update(len(chosen))
    bar.close()
    return [r for r in result if r is not None]


def answers_file(cache: Path, model_name: str, max_new_tokens: int) -> Path:
    """Where one target's answers of up to `max_new_tokens` tokens are kept."""
    key = hashlib.sha256(model_name.encode()).hexdigest()[:12]  # another target never reads these
    return cache / f"answers-{key}-{max_new_tokens}.jsonl"


def read_answers(path: Path) -> dict[tuple[int, ...], list[int]]:
    """prompt ids -> response ids from an answers file (each line [prompt ids, response ids]); a
    last line cut short by a crash is skipped, and answered again."""
    answers: dict[tuple[int, ...], list[int]] = {}
    if not path.is_file():
        return answers
    for line in path.read_text().splitlines():
        try:
            prompt, response = json.loads(line)
        except ValueError:
            continue
        answers[tuple(prompt)] = response
    return answers


def append_answers(path: Path, sequences: list[Sequence]) -> None:
    """Add answered sequences (prompt + response, where the response starts) to an answers file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as out:
        if out.tell() and (out.seek(out.tell() - 1), out.read(1))[1] != "\n":
            out.write("\n")  # a line a crash cut short stays on its own, and is skipped
        out.write("".join(json.dumps([ids[:start], ids[start:]]) + "\n" for ids, start in sequences))
