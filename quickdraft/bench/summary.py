"""The figures a report shows, computed from a BenchResult: pure functions, no timing here."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from quickdraft.analysis import expected_tokens_per_pass
from quickdraft.bench.contenders import BASELINE, RunRecord
from quickdraft.bench.harness import BenchResult, PromptRuns

OVERALL = "overall"


@dataclass
class Summary:
    """One contender over a set of prompts."""

    name: str
    prompts: int
    tokens: int  # new tokens over every prompt and repeat
    tokens_per_second: float  # median over prompts of each prompt's median tok/s
    speedup: float  # tokens_per_second / the baseline's: a ratio of medians
    mean_accepted_length: float | None  # tokens per target pass (None: not reported)
    acceptance_rate: float | None  # accepted / drafted draft tokens
    mean_k: float | None  # drafted tokens per target pass
    acceptance_by_position: list[float]  # accepted / drafted at draft position 1, 2, ...
    mismatches: list[int]  # prompt numbers whose tokens differ from its reference's (where checked)
    checked: bool = True  # tokens compared with the reference's: greedy, or both sampled from the seed alone
    reference: str = BASELINE  # plain decoding at the contender's precision (peers: the baseline)
    predicted_speedup: float | None = None  # closed form from this run's alpha, K and times (chains)
    measured_decode_speedup: float | None = None  # the same quantity measured (prefill excluded)


def prompt_speed(records: list[RunRecord]) -> float:
    """A prompt's tokens/s: the median over its repeats."""
    return statistics.median(len(r.tokens) / r.seconds for r in records)


def summarise(result: BenchResult, name: str, prompts: list[PromptRuns], numbers: list[int]) -> Summary:
    """`name` over `prompts` (their 1-based `numbers` in the whole run, for naming mismatches)."""
    records = [r for p in prompts for r in p.runs[name]]
    speed = statistics.median(prompt_speed(p.runs[name]) for p in prompts)
    base_speed = statistics.median(prompt_speed(p.runs[BASELINE]) for p in prompts)
    passes = sum(r.passes for r in records)
    drafted = sum(r.drafted for r in records)
    accepted = sum(r.accepted for r in records)
    tokens = sum(len(r.tokens) for r in records)
    contender = next(c for c in result.contenders if c.name == name)
    reference = contender.reference
    checked = result.greedy or (contender.seeded and next(c for c in result.contenders if c.name == reference).seeded)
    mismatches = (
        [n for n, p in zip(numbers, prompts) if p.runs[name][0].tokens != p.runs[reference][0].tokens]
        if checked
        else []
    )
    summary = Summary(
        name=name,
        prompts=len(prompts),
        tokens=tokens,
        tokens_per_second=speed,
        speedup=speed / base_speed,
        mean_accepted_length=tokens / passes if passes else None,
        acceptance_rate=accepted / drafted if drafted else None,
        mean_k=drafted / passes if passes and drafted else None,
        acceptance_by_position=acceptance_by_position(records),
        mismatches=mismatches,
        checked=checked,
        reference=reference,
    )
    if contender.chain and drafted and all(r.decode_seconds for r in records):
        base = [r for p in prompts for r in p.runs[BASELINE]]
        summary.predicted_speedup, summary.measured_decode_speedup = predicted_vs_measured(records, base)
    return summary


def acceptance_by_position(records: list[RunRecord]) -> list[float]:
    """Fraction of drafts accepted at each draft position (drafted there and accepted)."""
    depth = max((len(r.drafted_by_position) for r in records), default=0)
    rates = []
    for i in range(depth):
        drafted = sum(r.drafted_by_position[i] for r in records if i < len(r.drafted_by_position))
        accepted = sum(r.accepted_by_position[i] for r in records if i < len(r.accepted_by_position))
        rates.append(accepted / drafted if drafted else 0.0)
    return rates


def predicted_vs_measured(records: list[RunRecord], base: list[RunRecord]) -> tuple[float, float]:
    """Decode speedup predicted by E = (1 - a^(K+1)) / (1 - a) from the measured alpha, mean K and
    step time, against the measured one; both per generated token, prefill excluded."""
    passes = sum(r.passes for r in records)
    drafted = sum(r.drafted for r in records)
    tokens = sum(len(r.tokens) for r in records)
    alpha = min(sum(r.accepted for r in records) / drafted, 0.999)  # the closed form needs a < 1
    step_time = sum(r.decode_seconds for r in records) / passes
    plain_time = sum(r.decode_seconds for r in base) / sum(len(r.tokens) for r in base)
    expected = expected_tokens_per_pass(alpha, max(1, round(drafted / passes)))
    return plain_time / (step_time / expected), plain_time / (step_time * passes / tokens)


def summarise_all(result: BenchResult) -> dict[str, dict[str, Summary]]:
    """{category or "overall": {contender: Summary}}, categories in the order they ran."""
    numbered = list(enumerate(result.prompts, start=1))
    groups = {OVERALL: numbered}
    for number, prompt in numbered:
        groups.setdefault(prompt.category, []).append((number, prompt))
    return {
        group: {
            c.name: summarise(result, c.name, [p for _, p in members], [n for n, _ in members])
            for c in result.contenders
        }
        for group, members in groups.items()
    }
