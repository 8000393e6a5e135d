"""What the harness times: quickdraft decoders by method and settings, behind one small interface.

Adding a drafting method to the bench is its entry in quickdraft.methods.METHODS; "all" picks
it up from there.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Protocol

from quickdraft.decoder import Decoder
from quickdraft.errors import QuickdraftError
from quickdraft.heads.store import has_head
from quickdraft.methods import METHODS, get_method
from quickdraft.options import parse_spec as options_spec

BASELINE = "none"


@dataclass
class RunRecord:
    """One timed generation of one prompt. Speculative counts are zero for contenders without them."""

    tokens: list[int]  # new tokens, EOS included, counted the same way for everyone
    seconds: float  # wall time of the whole call, prefill included
    passes: int = 0  # target passes (0 when the contender does not report them)
    drafted: int = 0
    accepted: int = 0
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    decode_seconds: float = 0.0  # drafting + verification time, prefill excluded (0 when unknown)
    draft_seconds: float = 0.0  # drafting alone (0 when unknown)


class Contender(Protocol):
    """Something that decodes token ids: a quickdraft method or a peer library."""

    name: str
    chain: bool  # drafts chains, so acceptance is the closed-form model's alpha
    speculative: bool
    reference: str  # the contender whose greedy tokens this one's must equal
    seeded: bool  # sampled tokens follow the seed alone (sampler gumbel): equal to the reference's when it is too

    def run(self, prompt_ids: list[int], max_new_tokens: int, temperature: float, seed: int) -> RunRecord: ...


class MethodContender:
    """A quickdraft Decoder (one method with its settings). learns: each run may draft from the
    outputs of the runs before it (suffix decoding's pool: the bench's in-order stream); else
    every run is a tenant of its own and learns from none."""

    def __init__(self, name: str, decoder: Decoder, reference: str = BASELINE) -> None:
        self.name, self.decoder, self.reference = name, decoder, reference
        definition = get_method(decoder.method)
        self.chain, self.speculative = not definition.drafts_trees, definition.speculative
        self.seeded = decoder.config.sampler == "gumbel"
        self.learns = False
        self.runs = 0

    def next_tenant(self) -> str | None:
        """The tenant of the next run: the stream's (None) when it learns, else one of its own."""
        self.runs += 1
        return None if self.learns else f"bench run {self.runs}"

    def run(self, prompt_ids: list[int], max_new_tokens: int, temperature: float, seed: int) -> RunRecord:
        out = self.decoder.generate(
            prompt_ids, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, tenant=self.next_tenant()
        )
        s = out.stats
        return RunRecord(
            out.token_ids,
            s.wall_time,
            s.target_passes,
            s.drafted_tokens,
            s.accepted_tokens,
            list(s.drafted_by_position),
            list(s.accepted_by_position),
            s.draft_time + s.verify_time,
            s.draft_time,
        )


def parse_spec(spec: str) -> list[tuple[str, str, dict]]:
    """'METHOD[:key=value,...]' -> [(name, method, settings)]; a value 'a/b/c' expands to one each.

    Keys: any option of quickdraft.options.OPTIONS (layers takes L or layers joined by '+',
    e.g. layers=0+1+2)."""
    expanded = options_spec(spec, expand=True)
    get_method(expanded[0][1])
    return expanded


def method_contenders(base: Decoder, specs: list[str]) -> list[MethodContender]:
    """The baseline (method none) first, then each spec's decoders over the same loaded models.

    "all" stands for every method with its defaults (draft only when a draft model is loaded,
    eagle and medusa only when heads are shipped for the target).
    A method at another precision or backend than the baseline's is checked against plain
    decoding at that precision and backend (none:precision=...,backend=...), added if not asked for."""
    expanded: list[tuple[str, str, dict]] = []
    from_all: set[str] = set()  # methods "all" chose: one the backend cannot run is left out, not fatal
    for spec in specs:
        if spec == "all":
            chosen = [
                (name, name, {})
                for name, method in METHODS.items()
                if method.speculative
                and (base.draft is not None or not method.needs_draft_model)
                and (not method.needs_hidden or has_head(name, base.target))
            ]
            expanded += chosen
            from_all |= {name for name, _, _ in chosen}
        else:
            expanded += parse_spec(spec)
    contenders = [MethodContender(BASELINE, base.with_method(BASELINE))]
    plain = {(base.precision, base.backend_kind): BASELINE}  # (precision, backend) -> its plain decoding

    def add(name: str, method: str, settings: dict) -> MethodContender:
        settings = dict(settings)
        decoder = base.with_method(method, settings.pop("k", None), **settings)
        key = (decoder.precision, decoder.backend_kind)
        if method == BASELINE:
            plain.setdefault(key, name)
        elif key not in plain:
            add(*parse_spec(f"{BASELINE}:precision={key[0]},backend={key[1]}")[0])
        contender = MethodContender(name, decoder, plain[key])
        contenders.append(contender)
        return contender

    for name, method, settings in expanded:
        if name == BASELINE:
            raise QuickdraftError(
                "method none is the baseline and always runs; leave it out of the list "
                "(none:precision=... adds plain decoding at another precision)"
            )
        if name in (c.name for c in contenders):
            continue
        try:
            add(name, method, settings)
        except QuickdraftError as error:
            if name not in from_all:
                raise
            print(f"quickdraft bench: left out {name} (of all): {error}", file=sys.stderr)
    return contenders
