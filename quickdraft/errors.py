"""One exception type for every error a user can cause: it carries a one-line message."""

from __future__ import annotations


class QuickdraftError(Exception):
    """A user-facing error: bad input, a missing model, a mismatched tokenizer.

    The CLI prints its message on one line instead of a traceback. `option` names the setting
    at fault when there is one (the server reports it as the error's param).
    """

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option
