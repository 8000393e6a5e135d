"""Incremental text for streaming: send only text that can no longer change."""

from __future__ import annotations

from collections.abc import Callable


class TextStream:
    """Turns the growing list of new token ids into text deltas.

    Held back: a trailing partial UTF-8 character (decoded as U+FFFD) and the last
    len(longest stop string) - 1 characters, which a stop string may still claim."""

    def __init__(self, decode: Callable[[list[int]], str], stops: list[str]) -> None:
        self.decode, self.stops = decode, stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.sent = ""

    def delta(self, token_ids: list[int]) -> str:
        text = self.decode(token_ids)
        for stop in self.stops:  # a complete stop string ends the text where it starts
            if stop in text:
                text = text[: text.index(stop)]
        safe = text[: len(text) - self.hold] if self.hold else text
        while safe.endswith("\ufffd"):
            safe = safe[:-1]
        if not safe.startswith(self.sent) or len(safe) <= len(self.sent):
            return ""
        piece, self.sent = safe[len(self.sent) :], safe
        return piece

    def final(self, text: str) -> str:
        """The rest of the finished text (already cut before any stop string)."""
        piece = text[len(self.sent) :] if text.startswith(self.sent) else ""
        self.sent = text
        return piece
