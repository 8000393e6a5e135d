"""`quickdraft bench` end to end: load, pick prompts and contenders, run, write the report."""

from __future__ import annotations

from pathlib import Path

from quickdraft.bench.contenders import Contender, method_contenders
from quickdraft.bench.harness import BenchSettings, run_batched, run_bench
from quickdraft.bench.peers import llama_cpp_peers, transformers_peers
from quickdraft.bench.prompts import default_prompt_file, load_prompts
from quickdraft.bench.report import write_report
from quickdraft.bench.summary import summarise_all
from quickdraft.decoder import Decoder
from quickdraft.errors import QuickdraftError
from quickdraft.settings import SAMPLING

FULL_PER_CATEGORY, QUICK_PER_CATEGORY = 10, 1
FULL_NEW_TOKENS, QUICK_NEW_TOKENS = SAMPLING["max_new_tokens"].default, 48
BATCH = 4  # prompts a method decodes at a time in its batched run (the outputs held to each prompt's alone)
PEERS = ("transformers", "llama.cpp")


def bench(
    decoder: Decoder,
    methods: list[str],
    output: Path,
    data: Path | None = None,
    categories: list[str] | None = None,
    per_category: int | None = None,
    max_new_tokens: int | None = None,
    temperature: float = SAMPLING["temperature"].default,
    repeats: int = 1,
    seed: int = SAMPLING["seed"].default,
    peers: tuple[str, ...] = PEERS,
    quick: bool = False,
    progress: bool = True,
    command: str | None = None,
    batch: int = BATCH,
    in_order: bool = False,
) -> dict[str, Path]:
    """Time `methods` (specs, or "all") against method none and the peers; write report, JSON, plots.

    decoder: a loaded Decoder whose target, draft, backend and precision every method shares.
    peers: which peer libraries run ("transformers", "llama.cpp"; llama.cpp when installed)
    quick: one prompt per category and 48 new tokens unless given (a few minutes on a laptop CPU).
    command: the command line, kept in the report's header. batch: each method also decodes the
    prompts this many at a time in shared passes, and the report counts the outputs that differ
    from the same prompt's alone (0 or 1: no batched run). in_order: the prompts, in their file's
    order, are one stream of requests: each method learns from the outputs before it (suffix
    decoding's pool), and the report shows tokens per pass and speedup by request."""
    if batch < 0:
        raise QuickdraftError(f"batch must be >= 0, got {batch}")
    per_category = per_category or (QUICK_PER_CATEGORY if quick else FULL_PER_CATEGORY)
    max_new_tokens = max_new_tokens or (QUICK_NEW_TOKENS if quick else FULL_NEW_TOKENS)
    settings = BenchSettings(max_new_tokens, temperature, repeats, seed)
    settings.check()
    source = data or default_prompt_file()
    prompts = load_prompts(source, categories, per_category)
    encoded = [(p.category, decoder.encode(p.text)) for p in prompts]
    contenders: list[Contender] = list(method_contenders(decoder, methods))
    unknown = set(peers) - set(PEERS)
    if unknown:
        raise QuickdraftError(f"unknown peer {sorted(unknown)[0]!r}; choose from: {', '.join(PEERS)}")
    if "transformers" in peers:
        contenders += transformers_peers(decoder.target, decoder.draft, decoder.eos_ids)
    if "llama.cpp" in peers:
        contenders += llama_cpp_peers(decoder.target.gguf, decoder.eos_ids)
    result = run_bench(encoded, contenders, settings, progress, in_order)
    if batch > 1:
        result.batched = run_batched(result, encoded, batch, progress)
    summaries = summarise_all(result)
    header = {
        "target": decoder.target.name,
        "precision": decoder.precision,
        "backend": decoder.backend_kind,
        "prompts": str(source) if source else "the built-in prompt set",
        "methods": methods,
        "peers": list(peers),
        "in_order": in_order,
    } | ({"command": command} if command else {})
    return write_report(output, result, summaries, header)
