import pytest

from quickdraft.drafters.prompt_lookup import PromptLookupDrafter, lookup_continuation
from quickdraft.errors import QuickdraftError


def test_longest_suffix_match_wins():
    #            0  1  2  3  4  5  6  7  8  9
    tokens = [1, 2, 3, 9, 8, 2, 3, 4, 5, 1, 2, 3]
    # suffix [1, 2, 3] matches at 0 -> followed by 9, 8, 2
    assert lookup_continuation(tokens, 3, max_ngram=3, min_ngram=1) == [9, 8, 2]


def test_most_recent_occurrence_is_used():
    tokens = [7, 1, 7, 2, 7, 3, 7]
    assert lookup_continuation(tokens, 2, max_ngram=1, min_ngram=1) == [3, 7]


def test_falls_back_to_shorter_ngrams_and_stops_at_min():
    tokens = [5, 6, 1, 4, 6]
    assert lookup_continuation(tokens, 2, max_ngram=3, min_ngram=1) == [1, 4]
    assert lookup_continuation(tokens, 2, max_ngram=3, min_ngram=2) == []


def test_continuation_is_cut_at_k_and_at_the_end():
    tokens = [1, 2, 3, 4, 1]
    assert lookup_continuation(tokens, 2, 2, 1) == [2, 3]
    assert lookup_continuation(tokens, 10, 2, 1) == [2, 3, 4, 1]


def test_no_match_and_short_input_propose_nothing():
    assert lookup_continuation([1, 2, 3], 4, 3, 1) == []
    assert lookup_continuation([1], 4, 3, 1) == []


def test_bad_ngram_bounds_are_refused():
    with pytest.raises(QuickdraftError):
        PromptLookupDrafter(max_ngram=1, min_ngram=2)
    with pytest.raises(QuickdraftError):
        PromptLookupDrafter(max_ngram=3, min_ngram=0)
