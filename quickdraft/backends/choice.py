"""auto's choice between the llama.cpp and the native backend for a GGUF target on a CPU.

llama.cpp is the known-faster default here (2.5x the native fp32 backend on a quiet 2-core
machine). A busy moment can turn a measurement upside down: llama.cpp's threads wait for each
other at every operation, so a process beside it slows llama.cpp more than PyTorch. So the choice
is made from one-token passes of both backends timed in pairs, side by side; native wins only by
a clear margin in most pairs; a measurement during which our threads did not get the cores is not
kept; and a kept choice is dropped when a later run observes its backend clearly faster than
recorded (the record was made while the machine was busier than now).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from quickdraft.backends.backend import Backend, SeqPass
from quickdraft.backends.kernel_timing import COST_CONTEXT
from quickdraft.measured import QUIET, CpuShare, forget_choice, read_choice, write_choice

ROUNDS = 9  # timed pairs (after one warm-up pair): a few seconds on a 135M model
MARGIN = 0.8  # native must take at most this share of llama.cpp's time in a pair to count as a win
WINS = 0.75  # ... in at least this share of the pairs, to be chosen over the default
STALE = 1.5  # a run observing its backend this many times faster than recorded drops the record
MIN_OBSERVED = 8  # one-token passes a run must have seen to judge a record


@dataclass(frozen=True)
class Timings:
    """One-token pass milliseconds of each backend, pair by pair, and how much of the cores we got."""

    llama_cpp_ms: list[float]
    native_ms: list[float]
    cpu_share: float  # process CPU seconds / (wall seconds x threads) over the timed pairs


@dataclass(frozen=True)
class BackendChoice:
    """auto's verdict: which backend, why, and whether it may be kept for later loads."""

    llama_cpp: bool
    reason: str
    keep: bool = True
    llama_cpp_ms: float | None = None  # medians of the pairs
    native_ms: float | None = None

    def chosen_ms(self) -> float | None:
        return self.llama_cpp_ms if self.llama_cpp else self.native_ms


def decide(timings: Timings, precision: str) -> BackendChoice:
    """llama.cpp unless native was at most MARGIN of its time in at least WINS of the pairs, timed
    on cores we had (else keep the default for this run and do not keep the verdict)."""
    pairs = list(zip(timings.llama_cpp_ms, timings.native_ms))
    ratios = [native / fast for fast, native in pairs]  # per pair: a moment's load hits both sides alike
    wins = sum(ratio < MARGIN for ratio in ratios) / len(ratios)
    fast, native = statistics.median(timings.llama_cpp_ms), statistics.median(timings.native_ms)
    measured = (
        f"one-token pass llama.cpp {fast:.1f} ms, native {precision} {native:.1f} ms "
        f"(medians of {len(pairs)} interleaved pairs; native at most {MARGIN:.0%} of llama.cpp's time "
        f"in {wins:.0%} of them)"
    )
    if timings.cpu_share < QUIET:
        return BackendChoice(
            True,
            f"llama.cpp, the default: the machine was busy while timing (our threads got "
            f"{timings.cpu_share:.0%} of their cores), so nothing was decided or kept; "
            f"{measured}",
            keep=False,
            llama_cpp_ms=fast,
            native_ms=native,
        )
    if statistics.median(ratios) < MARGIN and wins >= WINS:
        return BackendChoice(False, f"native: clearly faster here: {measured}", llama_cpp_ms=fast, native_ms=native)
    return BackendChoice(True, f"llama.cpp: {measured}", llama_cpp_ms=fast, native_ms=native)


def time_pairs(fast: Backend, native: Backend, threads: int, rounds: int = ROUNDS) -> Timings:
    """One-token passes after COST_CONTEXT cached tokens, the two backends taking turns (which goes
    first alternates), with the share of the cores this process got meanwhile."""
    context = [(7 + 13 * i) % min(fast.vocab_size, native.vocab_size) for i in range(COST_CONTEXT + 1)]
    caches = {}
    for backend in (fast, native):
        caches[id(backend)] = cache = backend.new_cache(COST_CONTEXT + 1)
        backend.forward([SeqPass(cache, context[:COST_CONTEXT], logits="none")])

    def one(backend: Backend) -> float:
        cache = caches[id(backend)]
        start = time.perf_counter()
        backend.forward([SeqPass(cache, context[COST_CONTEXT:])])
        elapsed = 1000 * (time.perf_counter() - start)
        cache.truncate(COST_CONTEXT)
        return elapsed

    one(fast), one(native)  # warm-up
    times: dict[int, list[float]] = {id(fast): [], id(native): []}
    share = CpuShare(threads)
    for i in range(rounds):
        for backend in (fast, native) if i % 2 == 0 else (native, fast):
            times[id(backend)].append(one(backend))
    return Timings(times[id(fast)], times[id(native)], share.share())


def cached_backend_choice(
    folder: Path | None, signature: dict, measure: Callable[[], Timings], precision: str
) -> BackendChoice:
    """The kept verdict for this machine and file, or a new one from measure() (kept if clear)."""
    kept = planned_verdict(folder, signature)
    if kept.keep:
        return kept
    choice = decide(measure(), precision)
    if choice.keep:
        write_choice(folder, signature, asdict(choice))
    return choice


def observe(folder: Path | None, signature: dict, choice: BackendChoice, one_token_seconds: list[float]) -> bool:
    """After a run: drop the kept verdict when the run's one-token passes on the chosen backend were
    STALE times faster than recorded (it was measured while the machine was busier). True if dropped.
    Slower than recorded proves nothing (this run may be the busy one, or batched)."""
    recorded = choice.chosen_ms()
    if not choice.keep or recorded is None or len(one_token_seconds) < MIN_OBSERVED:
        return False
    observed = 1000 * statistics.median(one_token_seconds)
    if observed * STALE >= recorded:
        return False
    return forget_choice(folder, signature)


def planned_verdict(folder: Path | None, signature: dict) -> BackendChoice:
    """What `quickdraft plan` takes for auto's verdict, without timing anything: the kept one, else
    the default that the first load's timing keeps unless native is clearly faster."""
    record = read_choice(folder, signature)
    if isinstance(record, dict) and "llama_cpp" in record:
        return BackendChoice(**{**record, "reason": f"{record['reason']} (kept from an earlier load)"})
    return BackendChoice(
        True,
        "llama.cpp: not timed on this machine yet; the first load times one-token passes of "
        "llama.cpp and the native backend side by side (seconds) and keeps llama.cpp unless "
        "native is clearly faster",
        keep=False,
    )
