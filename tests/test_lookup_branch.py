"""The prompt-lookup branch of head trees: its chain, its confidence, and what it learns."""

import math

import pytest

from quickdraft.drafters.lookup_branch import BranchRecord, LookupBranch
from quickdraft.errors import QuickdraftError


def test_the_branch_is_the_lookup_chain_scored_by_the_records_rate():
    record = BranchRecord()
    chain, scores = LookupBranch().propose(record, [4, 5, 6, 7, 8, 1, 5, 6], room=3)
    assert chain == [7, 8, 1]  # what followed 5, 6 earlier
    assert [round(math.exp(s), 4) for s in scores] == [0.5, 0.25, 0.125]  # an even start, per token
    assert LookupBranch().propose(record, [1, 2, 3], room=3) == ([], [])
    assert LookupBranch().propose(record, [4, 5, 6, 5, 6], room=0) == ([], [])


def test_the_record_counts_verified_tokens_whose_parent_was_accepted():
    branch, record = LookupBranch(), BranchRecord()
    branch.propose(record, [4, 5, 6, 7, 8, 1, 5, 6], room=3)  # chain 7, 8, 1
    # The verified tree: 7 -> 8 from the chain (1 was cut), 9 from the head under the root.
    LookupBranch.drafted(record, [7, 9, 8], [-1, -1, 0])
    assert record.verified == 2
    LookupBranch.learn(record, (0,))  # 7 accepted, then 8 rejected
    assert (record.tried, record.accepted) == (2 + 2, 1 + 1)
    branch.propose(record, [4, 5, 6, 7, 8, 1, 5, 6], room=3)
    LookupBranch.drafted(record, [7, 8, 1], [-1, 0, 1])
    LookupBranch.learn(record, (0, 1, 2))  # all three accepted: three tried, three right
    assert (record.tried, record.accepted) == (7, 5)
    branch.propose(record, [4, 5, 6, 7, 8, 1, 5, 6], room=3)
    LookupBranch.drafted(record, [9], [-1])  # sizing kept none of the chain: nothing tried
    LookupBranch.learn(record, (0,))
    assert (record.tried, record.accepted) == (7, 5) and 0 < record.rate < 1


def test_bad_ngram_bounds_are_refused():
    with pytest.raises(QuickdraftError, match="min_ngram"):
        LookupBranch(max_ngram=2, min_ngram=3)
