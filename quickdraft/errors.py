"""One exception type for every error a user can cause: it carries a one-line message."""


class QuickdraftError(Exception):
    """A user-facing error: bad input, a missing model, a mismatched tokenizer.

    The CLI prints its message on one line instead of a traceback.
    """
