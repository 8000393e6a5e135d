"""An injected fault: a drafter that raises for chosen sequences (engine and scheduler tests)."""

from __future__ import annotations


class FaultyDrafter:
    """Wraps a drafter and raises, at one stage, for the sequences whose prompt starts with `marked`:
    an injected fault in one sequence's own work."""

    def __init__(self, inner, marked: int, stage: str) -> None:
        self.inner, self.marked, self.stage = inner, marked, stage
        self.needs_hidden, self.taps = inner.needs_hidden, inner.taps

    def _check(self, stage: str, tokens: list[int]) -> None:
        if stage == self.stage and tokens[0] == self.marked:
            raise RuntimeError(f"injected fault in {stage}")

    def begin(self, prompt_ids, hidden):
        self._check("begin", prompt_ids)
        return self.inner.begin(prompt_ids, hidden)

    def propose(self, requests):
        for request in requests:
            self._check("propose", request.tokens)
        return self.inner.propose(requests)

    def update(self, state, outcome):
        self._check("update", outcome.tokens)
        self.inner.update(state, outcome)

    def finish(self, state, tokens):
        self.inner.finish(state, tokens)

    def for_tenant(self, tenant):
        return self
