"""Draft-model drafting: a small LM of the same vocabulary guesses K tokens autoregressively.

Self-speculation is the same drafter over a backend that runs only the target's first layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quickdraft.backends.backend import Backend, Cache, SeqPass
from quickdraft.drafters.drafter import Draft, DraftRequest, SequenceDrafter, StepOutcome
from quickdraft.sampling import gumbel_pick, logits_to_probs, sample


@dataclass
class DraftModelState:
    """One sequence's draft cache. It holds every accepted token except the last; tokens it has
    not seen yet (the last accepted one, and after a fully accepted step the last draft and the
    bonus token) are fed at the start of the next proposal, so nothing is recomputed after a
    rollback. active is False when the prompt does not fit the draft's context: no drafts then."""

    cache: Cache
    active: bool = True


class DraftModelDrafter(SequenceDrafter):
    """Runs a draft backend and keeps its full distribution q per position. Every sequence's
    next draft token comes from one batched pass of the draft model."""

    needs_hidden = False
    taps: tuple[int, ...] = ()

    def __init__(self, backend: Backend, confidence: float | None = None, target_vocab: int | None = None) -> None:
        self.backend = backend
        self.confidence = confidence  # stop drafting once the draft's top probability falls below this
        # Ids the target has and the draft lacks (a padded target vocabulary) reach the draft as a stand-in.
        self.stand_in = min(int(getattr(backend.tokenizer, "unk_token_id", None) or 0), backend.vocab_size - 1)

    def begin(self, prompt_ids: list[int], hidden: torch.Tensor | None) -> DraftModelState:
        state = DraftModelState(self.backend.new_cache())
        if len(prompt_ids) > self.backend.max_length:  # the draft's context is shorter than the prompt
            state.active = False
        elif len(prompt_ids) > 1:
            self.backend.forward([SeqPass(state.cache, self._known(prompt_ids[:-1]), logits="none", prompt=True)])
        return state

    def propose(self, requests: list[DraftRequest]) -> list[Draft]:
        drafts = [Draft() for _ in requests]
        live: dict[int, tuple[list[int], int]] = {}  # request -> (tokens to feed, draft tokens wanted)
        probs: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(requests))}
        for i, r in enumerate(requests):
            cache = r.state.cache
            cache.truncate(min(cache.length, len(r.tokens) - 1))  # safe to retry after a failed batch
            pending = r.tokens[cache.length :]  # accepted tokens the draft cache lacks (>= 1)
            room = self.backend.max_length - cache.length - len(pending) + 1
            # No drafts where the newest token is one the draft lacks: its guess would follow the stand-in.
            if r.state.active and r.k >= 1 and room >= 1 and r.tokens[-1] < self.backend.vocab_size:
                live[i] = (self._known(pending), min(r.k, room))
        while live:
            order = list(live)
            outputs = self.backend.forward([SeqPass(requests[i].state.cache, live[i][0], logits="last") for i in order])
            logits = torch.cat([out.logits for out in outputs])  # [B, V'] the next token's logits each
            greedy = [requests[i].sampling.greedy for i in order]
            argmax = logits.argmax(-1).tolist() if any(greedy) else []  # one host read for every greedy row
            for row, i in enumerate(order):
                r = requests[i]
                if r.sampling.greedy:
                    token = argmax[row]
                    top = torch.softmax(logits[row], dim=-1)[token] if self.confidence is not None else None
                else:
                    q = logits_to_probs(logits[row].cpu(), r.sampling)  # [V'], processed exactly like p
                    if r.noise is None:
                        token = sample(q, r.generator)
                    else:  # the target's noise at this position: the guess its own pick is likeliest to equal
                        token = gumbel_pick(q, r.noise.row(len(r.tokens) + len(drafts[i].tokens)))
                    probs[i].append(q)
                    top = q.max()
                drafts[i].tokens.append(token)
                wanted = live[i][1]
                if len(drafts[i].tokens) == wanted or (self.confidence is not None and float(top) < self.confidence):
                    del live[i]  # done, or the draft is unsure: later guesses would rarely survive verification
                else:
                    live[i] = ([token], wanted)
        for i, q in probs.items():
            if q:
                drafts[i].probs = torch.stack(q)  # [K, V']
        return drafts

    def update(self, state: DraftModelState, outcome: StepOutcome) -> None:
        # Entries past len(tokens) - 1 belong to rejected drafts (or to the newest token).
        state.cache.truncate(min(state.cache.length, len(outcome.tokens) - 1))

    def _known(self, tokens: list[int]) -> list[int]:
        vocab = self.backend.vocab_size
        return [t if t < vocab else self.stand_in for t in tokens]
