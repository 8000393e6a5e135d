"""Training conversations for draft heads, from the JSON/JSONL formats in ../shared/data or plain text.

Evaluation sets (Spec-Bench, MT-bench, GSM8K test) are refused by name: heads must never be
trained on what they are measured on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from quickdraft.errors import QuickdraftError

EVALUATION_FILES = ("question.jsonl", "test.jsonl")  # spec_bench/, mt_bench/, gsm8k/test.jsonl


@dataclass(frozen=True)
class Example:
    prompt: str  # the user's turn ("" for plain text)
    response: str  # what the heads learn to draft


def read_examples(path: str | Path) -> list[Example]:
    """Alpaca-style JSON (instruction, input, response/output), GSM8K-style JSONL (question,
    answer), JSONL with prompt/response, prompt/answer (the first of a list) or text, or a plain
    .txt file (one example per blank-line separated paragraph)."""
    path = Path(path)
    if path.name in EVALUATION_FILES or "spec_bench" in path.parts or "mt_bench" in path.parts:
        raise QuickdraftError(f"{path} is an evaluation set; train draft heads on training data only")
    if not path.is_file():
        raise QuickdraftError(f"training data not found: {path}")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".txt":
        return [Example("", part.strip()) for part in text.split("\n\n") if part.strip()]
    if path.suffix == ".json":
        records = json.loads(text)
    else:
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
    examples = [_example(record) for record in records]
    return [e for e in examples if e is not None]


def _example(record: dict) -> Example | None:
    if "instruction" in record:
        prompt = record["instruction"] + (f"\n\n{record['input']}" if record.get("input") else "")
        return Example(prompt, record.get("response") or record.get("output") or "")
    if "question" in record and "answer" in record:
        return Example(record["question"], record["answer"])
    if "prompt" in record:  # prompt/response, or a prompt set's prompt and reference answer(s)
        answer = record.get("response") or record.get("answer") or ""
        return Example(record["prompt"], answer if isinstance(answer, str) else str(answer[0]))
    if "text" in record:
        return Example("", record["text"])
    return None
