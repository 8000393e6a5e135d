"""Generated token ids in, text out: one place for incremental detokenizing, stop strings and streaming."""

from __future__ import annotations

from collections.abc import Callable

from quickdraft.errors import QuickdraftError

REPLACEMENT = "\ufffd"  # what decode gives for the bytes of a character that is not complete yet


class TextStream:
    """New token ids in, text out: incremental detokenizing, stop strings, safe deltas.

    Feed every generated token (EOS included) to push(); it returns True once a stop string is
    complete, and the engine stops the sequence there. delta() gives the text that can no longer
    change and was not given yet (for streaming); finish() gives the final text, after which delta()
    gives the rest. `decode` is e.g. ``lambda ids: tokenizer.decode(ids, skip_special_tokens=True)``.

    Detokenizing works as in vLLM and transformers' TextIteratorStreamer: only a short window of
    tokens, ids[prefix:], is decoded per token and compared with the decoded ids[prefix:read], so the
    cost per token does not grow with the output. While the window's text ends in U+FFFD (a character
    whose bytes are split across tokens) the offsets stay, but the text before it is taken at once,
    so a stop string is seen as soon as its last character is complete.

    The final text is decode(all ids) cut before the first stop string. For tokenizers whose decoding
    is prefix-stable (byte-level BPE, byte-fallback SentencePiece on valid UTF-8) the deltas add up to
    exactly that. Where it is not, the streamed text can differ from it at a few places (e.g.
    clean_up_tokenization_spaces across a window boundary, a byte-fallback run that turns invalid);
    sent text cannot be unsent, so after finish() delta() gives the final text past the length
    already sent: the streamed text then has the final text's length, those few characters aside.
    """

    max_pending = 16  # tokens to wait for a character to complete before taking U+FFFD: bounds the cost

    def __init__(self, decode: Callable[[list[int]], str], stops: list[str] | str | None = None) -> None:
        stops = [stops] if isinstance(stops, str) else list(stops or [])
        if any(not stop for stop in stops):
            raise QuickdraftError("stop strings must not be empty")
        self._decode, self._stops = decode, stops
        self._keep = max((len(stop) for stop in stops), default=1) - 1  # a stop can start this far back
        self._ids: list[int] = []
        self._prefix = self._read = 0  # window start; end of the tokens whose text was taken whole
        self._prefix_text = ""  # decode(ids[prefix:read]), kept rather than decoded per token
        self._ahead = 0  # characters taken from past `read` while the window ended in U+FFFD
        self._parts: list[str] = []  # the text taken so far, in pieces (joining per token would be O(n^2))
        self._length = 0  # characters taken so far
        self._tail = ""  # the last `_keep` characters taken: where a stop string may have begun
        self._stop_at: int | None = None  # where the first stop string begins in the text
        self._unsent: list[str] = []  # taken text not yet returned by delta()
        self._sent = 0  # characters returned by delta()
        self._final: str | None = None  # set by finish()
        self._rest = ""  # what delta() returns after finish()

    def push(self, token_id: int) -> bool:
        """Add one generated token; True when a stop string is now complete (then and afterwards:
        tokens pushed after a stop are ignored)."""
        if self._final is not None:
            raise RuntimeError("push() after finish()")
        if self._stop_at is not None:
            return True
        self._ids.append(token_id)
        window = self._decode(self._ids[self._prefix :])
        stable = window.rstrip(REPLACEMENT)
        grown = len(self._ids) - self._read > self.max_pending  # garbage bytes or a run of special tokens
        clean = len(stable) == len(window) or grown
        piece = (window if clean else stable)[len(self._prefix_text) + self._ahead :]
        if grown or (clean and len(window) > len(self._prefix_text)):
            self._prefix, self._read = self._read, len(self._ids)
            self._prefix_text = self._decode(self._ids[self._prefix : self._read])
            self._ahead = 0
        else:
            self._ahead += len(piece)
        return self._take(piece)

    def delta(self) -> str:
        """Text that can no longer change and has not been returned yet (for streaming).

        Held back: a character whose bytes are not all there, and the end of the text while it is
        the beginning of a stop string. Never returns any part of a stop string."""
        if self._final is not None:
            rest, self._rest = self._rest, ""
            return rest
        pending = "".join(self._unsent)
        end = self._stop_at if self._stop_at is not None else self._length - self._claimable()
        piece = pending[: max(0, end - self._sent)]
        self._unsent = [pending[len(piece) :]]
        self._sent += len(piece)
        return piece

    @property
    def text(self) -> str:
        """All text so far (less a character still incomplete), cut before the first stop string when
        one appeared; after finish() the final text. O(n): not for every token."""
        if self._final is not None:
            return self._final
        text = "".join(self._parts)
        return text if self._stop_at is None else text[: self._stop_at]

    @property
    def stopped(self) -> bool:
        """Whether a stop string appeared."""
        return self._stop_at is not None

    def finish(self) -> str:
        """The final text: decode(all ids) cut before the first stop string; delta() then returns the rest."""
        if self._final is None:
            text = self._decode(self._ids) if self._ids else ""
            found = [index for stop in self._stops if (index := text.find(stop)) >= 0]
            self._final = text[: min(found)] if found else text
            self._rest = self._final[self._sent :]  # see the class docstring when decoding is not prefix-stable
        return self._final

    def _take(self, piece: str) -> bool:
        """Append text that will not change; True when it completes a stop string."""
        if not piece:
            return False
        # Only a stop string ending in the new piece can be new: search it plus the characters before.
        window = self._tail + piece
        found = [index for stop in self._stops if (index := window.find(stop)) >= 0]
        start = self._length - len(self._tail)
        self._parts.append(piece)
        self._unsent.append(piece)
        self._length += len(piece)
        self._tail = window[max(0, len(window) - self._keep) :] if self._keep else ""
        if found:
            self._stop_at = start + min(found)
        return bool(found)

    def _claimable(self) -> int:
        """How many of the last characters are the beginning of a stop string (0 when none)."""
        for size in range(min(self._keep, len(self._tail)), 0, -1):  # longest first
            end = self._tail[len(self._tail) - size :]
            if any(len(stop) > size and stop.startswith(end) for stop in self._stops):
                return size
        return 0
