"""Chi-square goodness of fit, with cells of small expected count pooled (torch only)."""

from __future__ import annotations

import torch


def chi_square_p_value(observed: torch.Tensor, expected_probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """P-value that `observed` counts were drawn from `expected_probs` (both flat [C])."""
    observed = observed.double().flatten()
    expected = expected_probs.double().flatten() * observed.sum()
    impossible = expected == 0
    if observed[impossible].sum() > 0:
        return 0.0  # a sample the target can never produce
    small = expected < min_expected
    # Pool the rare cells into one, so each cell's count is roughly normal.
    obs = torch.cat([observed[~small], observed[small & ~impossible].sum().reshape(1)])
    exp = torch.cat([expected[~small], expected[small & ~impossible].sum().reshape(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    statistic = ((obs - exp) ** 2 / exp).sum()
    dof = obs.numel() - 1
    # Survival function of chi2(dof): the regularised upper incomplete gamma Q(dof/2, x/2).
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), statistic / 2.0))


def decode_together(generations: list) -> None:
    """Prefill the prepared generations in one pass and step them together until each is done (the
    server's path)."""
    from quickdraft.engine import prefill, step

    prefill(generations)
    while live := [g for g in generations if not g.done]:
        step(live)


def sample_batched(decoder, prompt: list[int], runs: int, max_new_tokens: int, batch: int = 250, **options) -> list:
    """The outputs (GenerationOutput) of `runs` generations seeded 0..runs-1, decoded `batch` at a time by the engine's
    batched step (the server's path): a row's distribution is the target's alone or beside others,
    and one batched step costs a fraction of `batch` single ones."""
    outputs = []
    for first in range(0, runs, batch):
        generations = [
            decoder.prepare(prompt, max_new_tokens, seed=seed, **options)
            for seed in range(first, min(first + batch, runs))
        ]
        decode_together(generations)
        for g in generations:
            assert g.error is None, g.error
            outputs.append(decoder.finish(g))
    return outputs
