"""Prompt lookup (n-gram) drafting: copy what followed the last n tokens earlier in the text.

No model. Effective where the output repeats its input: summaries, code edits, RAG, Q&A over
a document. q is one-hot, so verification accepts a draft token with probability p(x).
"""

from __future__ import annotations

import torch

from quickdraft.drafters.drafter import Draft, DraftRequest, SequenceDrafter
from quickdraft.errors import QuickdraftError


class PromptLookupDrafter(SequenceDrafter):
    """Match the last n tokens (n from max_ngram down to min_ngram) and propose what followed.

    Of several earlier occurrences the most recent wins: it reflects the text being written now.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 2) -> None:
        check_ngrams(max_ngram, min_ngram)
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def draft(self, request: DraftRequest) -> Draft:
        if request.k < 1:
            return Draft()
        return Draft(lookup_continuation(request.tokens, request.k, self.max_ngram, self.min_ngram))


def check_ngrams(max_ngram: int, min_ngram: int) -> None:
    if not 1 <= min_ngram <= max_ngram:
        raise QuickdraftError(f"prompt lookup needs 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")


def lookup_continuation(tokens: list[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix."""
    sequence = torch.tensor(tokens, dtype=torch.long)  # [L]
    length = sequence.shape[0]
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        suffix = sequence[length - n :]  # [n]
        windows = sequence[: length - 1].unfold(0, n, 1)  # [L-n, n]; each has a token after it
        hits = (windows == suffix).all(dim=-1).nonzero()
        if hits.numel():
            start = int(hits[-1].item()) + n  # first token after the latest match
            return tokens[start : start + k]
    return []
