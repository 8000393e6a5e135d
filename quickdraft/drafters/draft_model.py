"""Draft-model drafting: a small LM of the same vocabulary guesses K tokens autoregressively."""

from __future__ import annotations

import torch

from quickdraft.drafters.base import Draft, TokenDrafter
from quickdraft.models.runner import Runner
from quickdraft.sampling import SamplingParams, logits_to_probs, sample


class DraftModelDrafter(TokenDrafter):
    """Runs a draft model with its own KV cache and keeps its full distribution q per position.

    The cache holds every accepted token except the last; tokens it has not seen yet (the
    last accepted one, and after a fully accepted step the last draft and the bonus token)
    are fed at the start of the next proposal, so nothing is recomputed after a rollback.
    """

    def __init__(self, runner: Runner, confidence: float | None = None) -> None:
        self.runner = runner
        self.confidence = confidence  # stop drafting once the draft's top probability falls below this

    def begin(self, prompt_ids: list[int]) -> None:
        self.runner.reset()
        if len(prompt_ids) > 1:
            self.runner.forward(prompt_ids[:-1], all_logits=False)

    def propose(
        self, tokens: list[int], k: int, sampling: SamplingParams, generator: torch.Generator
    ) -> Draft:
        pending = tokens[self.runner.length :]  # accepted tokens the draft cache lacks (>= 1)
        room = self.runner.max_length - self.runner.length - len(pending) + 1
        k = min(k, room)
        draft_tokens: list[int] = []
        draft_probs: list[torch.Tensor] = []
        for _ in range(k):
            logits = self.runner.forward(pending, all_logits=False)[-1]  # [V]
            if sampling.greedy:
                token = int(torch.argmax(logits).item())
                top = torch.softmax(logits, dim=-1)[token] if self.confidence is not None else None
            else:
                probs = logits_to_probs(logits, sampling)  # [V], processed exactly like p
                token = sample(probs, generator)
                draft_probs.append(probs)
                top = probs.max()
            draft_tokens.append(token)
            pending = [token]
            if self.confidence is not None and float(top) < self.confidence:
                break  # the draft is unsure: later guesses would rarely survive verification
        probs = torch.stack(draft_probs) if draft_probs else None  # [K, V] or None
        return Draft(draft_tokens, probs)

    def rollback(self, tokens: list[int]) -> None:
        # Entries past len(tokens) - 1 belong to rejected drafts (or to the newest token).
        self.runner.truncate(min(self.runner.length, len(tokens) - 1))
