"""What a sequence's verified trees teach: the head's calibration and the branch's rates."""

import math

from quickdraft.drafters.head_tree import TreeDraft
from quickdraft.drafters.tree_record import TreeRecord


def counts(record):
    return record.first.accepted, record.first.tried, record.next.accepted, record.next.tried


def test_the_branch_counts_chain_tokens_shown_with_their_parent_accepted():
    record = TreeRecord()
    # Chain 7 -> 8 (1 was cut by sizing) beside the head's 9 under the root.
    record.latest = TreeDraft([7, 9, 8], [-1, -1, 0], [0.0, 0.5, 0.0], chain=[0, 2])
    record.learn((0,))  # 7 accepted, then 8 rejected
    assert counts(record) == (1 + 1, 2 + 1, 1, 2 + 1) and record.latest is None
    record.latest = TreeDraft([7, 8, 1], [-1, 0, 1], [0.0] * 3, chain=[0, 1, 2])
    record.learn((0, 1, 2))  # all three accepted: the first and two next ones
    assert counts(record) == (3, 4, 3, 5)
    record.latest = TreeDraft([7, 9], [-1, -1], [0.0, 0.6], chain=[0])
    record.learn((1,))  # the head's 9 was accepted, not the chain's 7
    assert counts(record) == (3, 5, 3, 5)
    record.latest = TreeDraft([9], [-1], [0.6], chain=[])  # sizing kept none of the chain: nothing tried
    record.learn(())
    assert counts(record) == (3, 5, 3, 5)
    record.learn((0,))  # no tree was drafted (decoded plainly): nothing changes
    assert counts(record) == (3, 5, 3, 5)
    scores = record.branch_scores(3)
    assert [round(math.exp(s), 4) for s in scores] == [0.6, 0.36, 0.216]


def test_the_heads_confidence_is_scaled_by_what_it_got_accepted():
    record = TreeRecord()
    assert record.head_scale == 0.0
    for _ in range(9):  # the head expects 1.5 tokens a step and gets 0.5
        record.latest = TreeDraft([3, 4, 5], [-1, 0, -1], [0.9, 0.5, 0.1], chain=[])
        record.learn((0,))
    assert math.exp(record.head_scale) == (1 + 9 * 1) / (1 + 9 * 1.5)
    for _ in range(40):  # now it gets more than it expects: never scaled above its own estimate
        record.latest = TreeDraft([3, 4, 5], [-1, 0, -1], [0.9, 0.5, 0.1], chain=[])
        record.learn((0, 1))
    assert record.head_scale == 0.0


def test_a_resting_head_still_drafts_every_few_steps():
    from quickdraft.drafters.tree_record import RECHECK_EVERY

    record, rests = TreeRecord(), 0
    while record.may_rest():
        record.idle += 1
        rests += 1
    assert rests == RECHECK_EVERY - 1
