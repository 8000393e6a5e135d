"""The loop: propose -> verify -> accept -> roll back -> emit. One loop for every method and
every caller: a library call is a batch of one, the server's scheduler a batch of many.

A Generation holds one sequence: its tokens, its cache handle in the target backend, its
drafter's state and its stats. `step(generations)` advances any set of them together:

  1. draft: each drafter drafts for all of its sequences in one call (draft models: one
     batched draft pass per draft token);
  2. one target pass per backend scores every sequence's newest token, drafts and aux tokens;
  3. complete: each sequence verifies its own draft, emits, rolls back its cache, and tells
     its drafter the outcome once.

The target's cache always holds every token but the last one; each step feeds that last token
plus the K drafts, so the logits at K + 1 positions score every draft and give the token after them.

A fault in one sequence's own work (its draft, its pass, its verification) ends that sequence
alone: it finishes with reason "error" and keeps the exception in Generation.error; a batched
call that fails is retried one sequence at a time, so the others go on. A lone generation
(Generation.step, Decoder.generate) raises the exception instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from quickdraft.backends.backend import Backend, PassOutput, SeqPass
from quickdraft.draft_length import DraftLength
from quickdraft.drafters.drafter import Draft, Drafter, DraftRequest, StepOutcome
from quickdraft.noise import PositionNoise
from quickdraft.sampling import SamplingParams, token_logprobs
from quickdraft.stats import Stats, StepRecord
from quickdraft.text import TextStream
from quickdraft.tree import chain_parents, depths, pass_layout
from quickdraft.verify import Verdict, verify_tree


@dataclass
class PassLayout:
    """A drafted step waiting for its target pass: what to feed and how to read the logits."""

    k: int  # draft tokens asked for
    root: int  # position (and cache slot) of the newest token, fed first
    draft: Draft
    inputs: list[int]  # [newest token, draft tokens..., aux tokens...]
    positions: list[int] | None  # explicit positions for trees and aux tokens (None: consecutive)
    mask: torch.Tensor | None  # [n, cached + n] for trees and aux tokens (None: causal)
    parents: list[int]  # the draft as a tree (a chain is the tree with one child per node)
    draft_time: float
    verify_time: float = 0.0  # the target pass that scored it
    kept: list[int] | None = None  # each verified node's index in the drafter's own draft (None: the same)


class Generation:
    """One sequence being decoded. Step it (alone or with others) until done; read tokens and stats.

    text: the stream that detokenizes the new tokens and ends the sequence at a stop string
    (None: no stop strings and nobody reading text as it comes). noise: sampled tokens are
    argmax(log p + g) with this noise, drawn from (seed, position) alone, so the text is the same
    whatever is drafted (None: greedy, or rejection sampling with `generator`)."""

    def __init__(
        self,
        target: Backend,
        drafter: Drafter,
        prompt_ids: list[int],
        *,
        draft_length: DraftLength,
        max_new_tokens: int,
        sampling: SamplingParams,
        generator: torch.Generator,
        eos_ids: frozenset[int] = frozenset(),
        text: TextStream | None = None,
        logprobs: int | None = None,
        noise: PositionNoise | None = None,
    ) -> None:
        self.target = target
        self.drafter = drafter
        self.draft_length = draft_length
        self.max_new_tokens = max_new_tokens
        self.sampling = sampling
        self.generator = generator
        self.noise = None if sampling.greedy else noise
        self.eos_ids = eos_ids
        self.text = text
        self.logprobs = logprobs  # alternatives to report with each token's log-probability (None: none)
        self.tokens = list(prompt_ids)  # prompt + accepted tokens
        self.prompt_length = len(prompt_ids)
        self.cache = target.new_cache(len(prompt_ids) + max_new_tokens)
        self.draft_state = None  # the drafter's, from prefill()
        self.prefilled = False
        self.steps: list[StepRecord] = []
        self.stats = Stats(prompt_tokens=len(prompt_ids))
        self.finish_reason: str | None = None  # eos, stop, length, or error (see .error)
        self.error: Exception | None = None
        self._started = time.perf_counter()

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def new_tokens(self) -> list[int]:
        return self.tokens[self.prompt_length :]

    def step(self) -> StepRecord:
        """One target pass for this sequence alone; a fault in it is raised here."""
        if not self.prefilled:
            prefill([self])
        record = step([self])[0] if self.error is None else None
        if self.error is not None:
            raise self.error
        return record

    def fail(self, error: Exception) -> None:
        """End this sequence because its own work raised `error`; the others in its step go on."""
        self.error = error
        self.finish_reason = self.stats.finish_reason = "error"

    def __iter__(self) -> Iterator[StepRecord]:
        while not self.done:
            yield self.step()

    def draft_request(self) -> tuple[int, int, DraftRequest]:
        """(K asked for, cache room, the drafter's request) for the next step."""
        assert not self.done, "generation already finished"
        remaining = self.max_new_tokens - len(self.new_tokens)
        room = self.target.max_length - len(self.tokens)  # cache slots left after the last token
        # Drafts past the end of the output can never be used; the target pass yields one more.
        reach = max(0, min(remaining - 1, room))
        k = min(self.draft_length.next_k(), reach)
        request = DraftRequest(self.draft_state, self.tokens, k, self.sampling, self.generator, reach, self.noise)
        return k, room, request

    def lay_out(self, k: int, room: int, draft: Draft, draft_time: float) -> PassLayout:
        """The target pass that verifies `draft`: inputs, positions and mask."""
        draft = draft.fitted(room)
        root = len(self.tokens) - 1  # the newest token: its position and its cache slot
        kept = None
        window = getattr(self.target, "tree_window", None)  # optional: see Backend.tree_window
        if window and not draft.is_chain:  # a tree's nodes stay below the next multiple of the window
            draft, kept = draft.within_depth(window - 1 - root % window)
        inputs = [self.tokens[-1], *draft.tokens, *draft.aux_tokens]
        parents = draft.parents if draft.parents is not None else chain_parents(len(draft.tokens))
        if draft.is_chain:  # the backend's causal default
            return PassLayout(k, root, draft, inputs, None, None, parents, draft_time)
        mask, offsets = pass_layout(parents, draft.aux_offsets, draft.aux_mask)  # [n, n], [n]
        device = self.target.device
        cached = torch.ones(len(inputs), self.cache.length, dtype=torch.bool, device=device)  # the prefix
        return PassLayout(
            k,
            root,
            draft,
            inputs,
            [root + o for o in offsets],
            torch.cat([cached, mask.to(device)], dim=1),
            parents,
            draft_time,
            kept=kept,
        )

    def complete(self, layout: PassLayout, output: PassOutput) -> StepRecord:
        """Verify the draft with the target's logits [n, V] for layout.inputs; accept, roll back, emit."""
        start = time.perf_counter()
        draft, root = layout.draft, layout.root
        m = len(draft.tokens)
        gumbel = None
        if self.noise is not None:  # [D+1, V] the noise of every position a row predicts
            gumbel = self.noise.rows(list(range(root + 1, root + 2 + max(depths(layout.parents), default=0))))
        verdict: Verdict = verify_tree(
            draft.tokens, layout.parents, output.logits[: m + 1], self.sampling, self.generator, draft.probs, gumbel
        )
        emitted = self._emit([*(draft.tokens[i] for i in verdict.path), verdict.next_token])
        if self.noise is not None:
            self.noise.forget_before(len(self.tokens))
        # Row 0 (the root) predicted the first proposed token, the row of each accepted node the next.
        rows = [0, *(1 + i for i in verdict.path)][: len(emitted)]
        logprobs = None if self.logprobs is None else token_logprobs(output.logits[rows], emitted, self.logprobs)
        if not self.done:
            # Roll back: the target keeps the prefix, the root and the accepted path; the drafter
            # hears the outcome once and drops whatever it holds past the accepted tokens.
            self.cache.keep([*range(root + 1), *(root + 1 + i for i in verdict.path)])
            rows = [0, *(1 + i for i in verdict.path)]  # where the target predicted each emitted token
            hidden = output.hidden[rows] if output.hidden is not None else None
            aux = output.logits[m + 1 :] if draft.aux_tokens else None
            path = verdict.path if layout.kept is None else [layout.kept[i] for i in verdict.path]  # drafter's indices
            self.drafter.update(self.draft_state, StepOutcome(self.tokens, path, hidden, aux))
        else:
            self.cache.truncate(0)  # finished: free its entries now (a pooled backend hands them to the next)
            self.drafter.finish(self.draft_state, self.tokens)
        record = StepRecord(
            k=layout.k,
            draft_tokens=list(draft.tokens),
            accepted=len(verdict.path),
            next_token=verdict.next_token,
            bonus=verdict.bonus,
            emitted=emitted,
            draft_time=layout.draft_time,
            verify_time=layout.verify_time + time.perf_counter() - start,
            tree_depth=None if draft.parents is None else max(depths(draft.parents), default=0),
            logprobs=logprobs,
        )
        self.steps.append(record)
        self.stats.add_step(record)
        self.draft_length.update(record)
        self.stats.wall_time = time.perf_counter() - self._started
        if self.done:
            self.stats.finish_reason = self.finish_reason
        return record

    def _emit(self, proposed: list[int]) -> list[int]:
        """Append tokens one by one, stopping exactly at max_new_tokens, EOS or a stop string."""
        emitted = []
        for token in proposed:
            self.tokens.append(token)
            emitted.append(token)
            if token in self.eos_ids:
                self.finish_reason = "eos"
            elif self.text is not None and self.text.push(token):
                self.finish_reason = "stop"
            elif len(self.new_tokens) >= self.max_new_tokens:
                self.finish_reason = "length"
            if self.done:
                break
        return emitted


def prefill(generations: list[Generation]) -> None:
    """Everything but each prompt's last token goes into the target's caches, in one pass per
    backend (the first step feeds the last token); then each drafter begins its sequences."""
    start = time.perf_counter()
    for target, group in _grouped(generations, lambda g: g.target):
        want = [g for g in group if g.prompt_length > 1]
        hidden = _isolated(
            want,
            lambda gs: [
                out.hidden
                for out in target.forward(
                    [
                        SeqPass(
                            g.cache,
                            g.tokens[:-1],
                            logits="none",
                            hidden=g.drafter.needs_hidden,
                            taps=g.drafter.taps,
                            prompt=True,
                        )
                        for g in gs
                    ]
                )
            ],
            rewind=lambda g: g.cache.truncate(0),
        )
        for g in group:
            g.prefilled = True
            if not g.done:  # hidden: [prompt - 1, H] or None
                _each([g], lambda g: setattr(g, "draft_state", g.drafter.begin(g.tokens, hidden.get(id(g)))))
    elapsed = time.perf_counter() - start
    for g in generations:
        g.stats.prefill_time = elapsed


def step(generations: list[Generation]) -> list[StepRecord | None]:
    """One step of every generation: draft all, one target pass per backend, complete each.
    Returns each one's record; None for one that failed in this step (see Generation.error)."""
    assert not any(g.done for g in generations), "generation already finished"
    layouts: dict[int, PassLayout] = {}
    for drafter, group in _grouped(generations, lambda g: g.drafter):
        start = time.perf_counter()
        asked = _each(group, lambda g: g.draft_request())
        drafts = _isolated([g for g in group if not g.done], lambda gs: drafter.propose([asked[id(g)][2] for g in gs]))
        elapsed = time.perf_counter() - start
        for g in group:
            if id(g) in drafts:
                k, room, _ = asked[id(g)]
                layouts.update(_each([g], lambda g: g.lay_out(k, room, drafts[id(g)], elapsed)))
    outputs: dict[int, PassOutput] = {}
    for target, group in _grouped([g for g in generations if not g.done], lambda g: g.target):
        start = time.perf_counter()
        outputs.update(
            _isolated(
                group,
                lambda gs: target.forward(
                    [
                        SeqPass(
                            g.cache,
                            layouts[id(g)].inputs,
                            layouts[id(g)].positions,
                            layouts[id(g)].mask,
                            hidden=g.drafter.needs_hidden,
                            taps=g.drafter.taps,
                        )
                        for g in gs
                    ]
                ),
                rewind=lambda g: g.cache.truncate(len(g.tokens) - 1),
            )
        )  # the cache holds all but the newest token
        elapsed = time.perf_counter() - start
        for g in group:
            layouts[id(g)].verify_time = elapsed
    records: dict[int, object] = {}
    for g in generations:
        if id(g) in outputs:
            records.update(_each([g], lambda g: g.complete(layouts[id(g)], outputs[id(g)])))
    return [records.get(id(g)) for g in generations]


def _each(group: list[Generation], work: Callable[[Generation], object]) -> dict[int, object]:
    """work(g) for each generation; one that raises fails alone. -> {id(g): result} of the rest."""
    results = {}
    for g in group:
        try:
            results[id(g)] = work(g)
        except Exception as error:  # noqa: BLE001 - the fault belongs to this sequence alone
            g.fail(error)
    return results


def _isolated(
    group: list[Generation],
    run: Callable[[list[Generation]], list],
    rewind: Callable[[Generation], None] = lambda g: None,
) -> dict[int, object]:
    """run(group) -> one result per generation, batched; if that raises, each generation is rewound
    and run alone, so a fault fails only the sequences it belongs to. -> {id(g): result}."""
    if not group:
        return {}
    try:
        return {id(g): result for g, result in zip(group, run(group), strict=True)}
    except Exception as error:  # noqa: BLE001
        if len(group) == 1:
            group[0].fail(error)
            return {}
    results = {}
    for g in group:
        results.update(_each([g], lambda g: (rewind(g), run([g])[0])[1]))
    return results


def _grouped(generations: list[Generation], key) -> list[tuple[object, list[Generation]]]:
    """Generations sharing the same object under `key` (a drafter, a backend), in first-seen order."""
    groups: dict[int, tuple[object, list[Generation]]] = {}
    for g in generations:
        groups.setdefault(id(key(g)), (key(g), []))[1].append(g)
    return list(groups.values())
