"""A pytest plugin that breaks every drafter, for scripts/check-tests-catch-stalls.py:

    pytest -p broken_drafter --broken-drafter=nothing|wrong ...   (with scripts/ on PYTHONPATH)

It wraps Generation.lay_out, the one place every drafter's proposal (chain, tree, aux tokens)
passes on its way to the target pass and verification:
  nothing: an empty draft (no tokens, no aux tokens), as if the drafter never proposed;
  wrong:   each draft token replaced by (token + 1) % vocab (tree siblings: by the smallest shift
           that puts none on a sibling's token), with one-hot q (probs None), so verification
           rejects it unless the drafter was wrong and the shifted token is the target's pick by chance.
quickdraft itself knows nothing of this; the patch lives only in this test run.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--broken-drafter",
        choices=("nothing", "wrong"),
        default=None,
        help="break every drafter's proposals: propose nothing, or propose wrong tokens",
    )


def shifted(tokens: list[int], parents: list[int] | None, vocab: int) -> list[int]:
    """Each token + d (mod vocab); d = 1 for a chain. In a tree, the siblings under one parent
    move by the smallest d that lands none of them on a sibling's original token, so a tree that
    held the right token among its siblings no longer does."""
    parents = parents if parents is not None else [i - 1 for i in range(len(tokens))]
    siblings: dict[int, set[int]] = {}
    for token, parent in zip(tokens, parents):
        siblings.setdefault(parent, set()).add(token)
    offset = {
        parent: next((d for d in range(1, vocab) if not {(t + d) % vocab for t in group} & group), 1)
        for parent, group in siblings.items()
    }
    return [(token + offset[parent]) % vocab for token, parent in zip(tokens, parents)]


def broken(draft, mode: str, vocab: int):
    from quickdraft.drafters.drafter import Draft

    if mode == "nothing":
        return Draft()
    return Draft(
        shifted(draft.tokens, draft.parents, vocab),
        None,
        draft.parents,
        draft.aux_tokens,
        draft.aux_offsets,
        draft.aux_mask,
    )


def pytest_configure(config: pytest.Config) -> None:
    mode = config.getoption("--broken-drafter")
    if mode is None:
        return
    from quickdraft.engine import Generation

    lay_out = Generation.lay_out

    def broken_lay_out(self, k, room, draft, draft_time):
        return lay_out(self, k, room, broken(draft, mode, self.target.vocab_size), draft_time)

    Generation.lay_out = broken_lay_out
    config.add_cleanup(lambda: setattr(Generation, "lay_out", lay_out))


def pytest_report_header(config: pytest.Config) -> str | None:
    mode = config.getoption("--broken-drafter")
    return None if mode is None else f"broken drafter: every draft replaced ({mode})"
