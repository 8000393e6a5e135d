"""Benchmark prompts: a Spec-Bench-style JSONL file, or a small built-in set."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from quickdraft.errors import QuickdraftError

SPEC_BENCH_RELATIVE = Path("shared") / "data" / "spec_bench" / "question.jsonl"
# Spec-Bench reports six task groups; its first 80 questions are MT-bench's, tagged with these.
MT_BENCH_CATEGORIES = frozenset(
    {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
)
SPEC_BENCH_TASKS = frozenset({"translation", "summarization", "qa", "math_reasoning", "rag"})

# Written for this project (used when no prompt file is given or found): two prompts per task.
BUILTIN_PROMPTS: dict[str, list[str]] = {
    "conversation": [
        "Give me three tips for staying focused while working from home, with one sentence each.",
        "Write a short, friendly note inviting my neighbours to a garden party on Saturday afternoon.",
    ],
    "coding": [
        "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
        "Explain what this Python code prints and why: xs = [1, 2, 3]; ys = xs; ys.append(4); print(xs)",
    ],
    "summarization": [
        "Summarize in two sentences: The city council met on Tuesday to discuss the new bicycle lanes. "
        "Supporters said the lanes make cycling safer and cut traffic. Shop owners worried that losing "
        "parking spaces would hurt business. The council agreed to test the lanes on two streets for six "
        "months and to count both cyclists and customers before deciding.",
        "Summarize the main idea: Bees visit flowers to collect nectar and pollen. While doing so they carry "
        "pollen from one flower to another, which lets many plants make seeds and fruit. Without bees, "
        "crops such as apples, almonds and blueberries would give far smaller harvests.",
    ],
    "math_reasoning": [
        "A shop sells pencils at 3 for 1 dollar. How much do 18 pencils cost? Explain step by step.",
        "Tom is twice as old as Ana. In five years their ages will add up to 40. How old is Ana now? "
        "Show your reasoning.",
    ],
}


@dataclass(frozen=True)
class BenchPrompt:
    category: str
    text: str


def default_prompt_file(start: Path | None = None) -> Path | None:
    """../shared/data/spec_bench/question.jsonl seen from `start` (default: the working folder) or
    from this checkout; None when neither has it."""
    here = Path(__file__).resolve()
    for base in [(start or Path.cwd()).resolve().parent, here.parents[3]]:
        candidate = base / SPEC_BENCH_RELATIVE
        if candidate.is_file():
            return candidate
    return None


def read_prompt_file(path: Path) -> list[BenchPrompt]:
    """Every record's first turn ("turns"[0], else "prompt" or "text"), with its category.

    In a Spec-Bench file the MT-bench categories are grouped as "mt_bench", as Spec-Bench does."""
    try:
        lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
        records = [json.loads(line) for line in lines]
    except (OSError, json.JSONDecodeError) as error:
        raise QuickdraftError(f"could not read prompts from {path}: {error}") from error
    spec_bench = any(record.get("category") in SPEC_BENCH_TASKS for record in records)
    prompts = []
    for number, record in enumerate(records, start=1):
        text = (record.get("turns") or [None])[0] or record.get("prompt") or record.get("text")
        if not isinstance(text, str) or not text.strip():
            raise QuickdraftError(f"{path}, line {number}: no prompt (expected turns[0], prompt or text)")
        category = str(record.get("category", "default"))
        if spec_bench and category in MT_BENCH_CATEGORIES:
            category = "mt_bench"
        prompts.append(BenchPrompt(category, text))
    return prompts


def load_prompts(
    path: Path | None = None, categories: list[str] | None = None, per_category: int | None = None
) -> list[BenchPrompt]:
    """The first `per_category` prompts of each chosen category, categories in file order.

    path None: the built-in set."""
    if path is None:
        prompts = [BenchPrompt(category, text) for category, texts in BUILTIN_PROMPTS.items() for text in texts]
    else:
        prompts = read_prompt_file(path)
    available = list(dict.fromkeys(p.category for p in prompts))
    chosen = categories or available
    unknown = [c for c in chosen if c not in available]
    if unknown:
        raise QuickdraftError(f"unknown categories {unknown}; the prompts have: {', '.join(available)}")
    if per_category is not None and per_category < 1:
        raise QuickdraftError(f"prompts per category must be >= 1, got {per_category}")
    picked = []
    for category in chosen:
        picked += [p for p in prompts if p.category == category][:per_category]
    return picked
