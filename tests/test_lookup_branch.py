"""The prompt-lookup branch of head trees: its chain and its confidence."""

import math

import pytest

from quickdraft.drafters.lookup_branch import LookupBranch
from quickdraft.drafters.tree_record import TreeRecord
from quickdraft.errors import QuickdraftError


def test_the_branch_is_the_lookup_chain_scored_by_the_records_rates():
    record = TreeRecord()
    chain, scores = LookupBranch().propose(record, [4, 5, 6, 7, 8, 1, 5, 6], room=3)
    assert chain == [7, 8, 1]  # what followed 5, 6 earlier
    assert [round(math.exp(s), 4) for s in scores] == [0.5, 0.25, 0.125]  # an even start, per token
    record.first.accepted, record.first.tried, record.next.accepted, record.next.tried = 1, 4, 9, 10
    _, scores = LookupBranch().propose(record, [4, 5, 6, 7, 8, 1, 5, 6], room=3)
    assert [round(math.exp(s), 4) for s in scores] == [0.25, 0.225, 0.2025]  # a copy, once right, goes on
    assert LookupBranch(most=2).propose(record, [4, 5, 6, 7, 8, 1, 5, 6], room=3)[0] == [7, 8]
    assert LookupBranch().propose(record, [1, 2, 3], room=3) == ([], [])
    assert LookupBranch().propose(record, [4, 5, 6, 5, 6], room=0) == ([], [])


def test_bad_ngram_bounds_are_refused():
    with pytest.raises(QuickdraftError, match="min_ngram"):
        LookupBranch(max_ngram=2, min_ngram=3)
