"""The measurement loop: every contender on every prompt, back to back, in one process."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tqdm import tqdm

from quickdraft.bench.contenders import BASELINE, Contender, MethodContender, RunRecord
from quickdraft.engine import prefill, step
from quickdraft.errors import QuickdraftError
from quickdraft.settings import SAMPLING, checked_sampling

WARMUP_TOKENS = 16


@dataclass(frozen=True)
class BenchSettings:
    max_new_tokens: int = SAMPLING["max_new_tokens"].default
    temperature: float = SAMPLING["temperature"].default
    repeats: int = 1
    seed: int = SAMPLING["seed"].default

    def check(self) -> None:
        checked_sampling(max_new_tokens=self.max_new_tokens, temperature=self.temperature, seed=self.seed)
        if self.repeats < 1:
            raise QuickdraftError(f"repeats must be >= 1, got {self.repeats}")


@dataclass
class PromptRuns:
    category: str
    prompt_tokens: int
    runs: dict[str, list[RunRecord]] = field(default_factory=dict)  # contender -> one record per repeat


@dataclass
class BatchedRun:
    """A quickdraft method's prompts decoded `batch` at a time (each batch's sequences sharing
    every pass, as the server runs them), held to the same prompts decoded alone."""

    batch: int
    tokens: int  # new tokens over all prompts
    seconds: float  # wall time of all batches
    differ: list[int]  # prompt numbers whose tokens differ from the same prompt's alone


@dataclass
class BenchResult:
    settings: BenchSettings
    contenders: list[Contender]
    prompts: list[PromptRuns]
    batched: dict[str, BatchedRun] = field(default_factory=dict)  # quickdraft contender -> its batched run
    in_order: bool = False  # the prompts ran as a stream, each method learning from the runs before

    @property
    def greedy(self) -> bool:
        return self.settings.temperature == 0


def run_bench(
    encoded: list[tuple[str, list[int]]],
    contenders: list[Contender],
    settings: BenchSettings,
    progress: bool = True,
    in_order: bool = False,
) -> BenchResult:
    """Run each (category, prompt ids) through every contender; the baseline must come first.

    Each prompt's contenders run back to back, the order rotated from prompt to prompt so no
    contender always runs first; one short warm-up run each before anything is timed. in_order:
    the prompts are a stream of requests, and each method's runs learn from the outputs of the
    runs before them (suffix decoding's pool; the warm-up teaches nothing); else no run learns
    from another."""
    settings.check()
    if not contenders or contenders[0].name != BASELINE:
        raise QuickdraftError(f"the first contender must be the baseline {BASELINE!r}")
    if not encoded:
        raise QuickdraftError("no prompts to run")
    if in_order and settings.repeats > 1:
        raise QuickdraftError("an in-order stream runs each prompt once: a repeat would draft from its own output")
    for contender in contenders:
        contender.run(encoded[0][1], WARMUP_TOKENS, settings.temperature, settings.seed)
    for contender in contenders:
        if isinstance(contender, MethodContender):
            contender.learns = in_order
    results = []
    total = len(encoded) * settings.repeats * len(contenders)
    with tqdm(total=total, desc="bench", unit="run", disable=not progress) as bar:
        for index, (category, ids) in enumerate(encoded):
            row = PromptRuns(category, len(ids), {c.name: [] for c in contenders})
            order = contenders[index % len(contenders) :] + contenders[: index % len(contenders)]
            for _ in range(settings.repeats):
                for contender in order:
                    bar.set_postfix_str(f"{category}: {contender.name}"[:40])
                    record = contender.run(ids, settings.max_new_tokens, settings.temperature, settings.seed)
                    row.runs[contender.name].append(record)
                    bar.update()
            results.append(row)
    return BenchResult(settings, contenders, results, in_order=in_order)


def run_batched(
    result: BenchResult, encoded: list[tuple[str, list[int]]], batch: int, progress: bool = True
) -> dict[str, BatchedRun]:
    """Each quickdraft contender's prompts again, `batch` at a time in shared passes (prefilled
    together, stepped together; the sampling settings and seed of the runs alone), each output
    compared with its first run alone: what a server's batching must not change."""
    s = result.settings
    methods = [c for c in result.contenders if isinstance(c, MethodContender)]
    runs: dict[str, BatchedRun] = {}
    for contender in tqdm(methods, desc=f"bench: {batch} at a time", unit="method", disable=not progress):
        decoder, tokens, seconds, differ = contender.decoder, 0, 0.0, []
        contender.learns = False  # each prompt as new: what the stream taught would make batches look fast
        for first in range(0, len(encoded), batch):
            chosen = range(first, min(first + batch, len(encoded)))
            start = time.perf_counter()
            generations = [
                decoder.prepare(
                    encoded[i][1], s.max_new_tokens, s.temperature, seed=s.seed, tenant=contender.next_tenant()
                )
                for i in chosen
            ]
            prefill(generations)
            while live := [g for g in generations if not g.done]:
                step(live)
            seconds += time.perf_counter() - start
            for i, generation in zip(chosen, generations):
                if generation.error is not None:
                    raise generation.error
                tokens += len(generation.new_tokens)
                if generation.new_tokens != result.prompts[i].runs[contender.name][0].tokens:
                    differ.append(i + 1)
        runs[contender.name] = BatchedRun(batch, tokens, seconds, differ)
    return runs
