"""What speculation should buy, in closed form (Leviathan et al. 2023, section 3).

Model: each draft token is accepted independently with probability alpha (the acceptance
rate); a step drafts K tokens at T_draft each and verifies them in one target pass costing
T_target(K). Plain decoding costs T_target(1) per token.
"""

from __future__ import annotations

from dataclasses import dataclass


def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """E = (1 - a^(K+1)) / (1 - a): accepted prefix plus the recovered or bonus token."""
    _check(alpha, k)
    if alpha >= 1.0:
        return float(k + 1)  # the limit of the geometric sum at a = 1
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def time_per_token(alpha: float, k: int, t_draft: float, t_target: float) -> float:
    """(K * T_draft + T_target(K)) / E: one step's cost spread over the tokens it yields."""
    return (k * t_draft + t_target) / expected_tokens_per_pass(alpha, k)


def predicted_speedup(alpha: float, k: int, cost_ratio: float, verify_ratio: float = 1.0) -> float:
    """Plain time per token over speculative time per token, in units of a 1-token target pass.

    cost_ratio c = T_draft / T_target(1); verify_ratio = T_target(K) / T_target(1).
    """
    return 1.0 / time_per_token(alpha, k, cost_ratio, verify_ratio)


def best_k(alpha: float, cost_ratio: float, k_max: int = 16, verify_ratio=None) -> int:
    """The K in 1..k_max with the highest predicted speedup (verify_ratio: K -> T_target(K)/T_target(1))."""

    def speedup(k: int) -> float:
        ratio = verify_ratio(k) if verify_ratio is not None else 1.0
        return predicted_speedup(alpha, k, cost_ratio, ratio)

    return max(range(1, k_max + 1), key=speedup)


@dataclass(frozen=True)
class Prediction:
    alpha: float
    k: int
    cost_ratio: float
    expected_tokens: float
    speedup: float


def predict(alpha: float, k: int, cost_ratio: float, verify_ratio: float = 1.0) -> Prediction:
    return Prediction(
        alpha, k, cost_ratio, expected_tokens_per_pass(alpha, k), predicted_speedup(alpha, k, cost_ratio, verify_ratio)
    )


def _check(alpha: float, k: int) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")


DEFAULT_TREE_NODES = 4  # where every row costs (CPUs): the size measured best there (docs/bench/history.md)
MOST_TREE_NODES = 63  # one static pass of 64 rows: the root and 63 nodes


def pass_cost(pass_ms: dict[int, float], rows: int) -> float:
    """Milliseconds of a pass of `rows` tokens: measured, else on the line between the nearest
    measured sizes (past the largest, the line through the last two)."""
    if rows in pass_ms:
        return pass_ms[rows]
    sizes = sorted(pass_ms)
    if len(sizes) == 1 or rows < sizes[0]:
        return pass_ms[sizes[0]]
    upper = next((n for n in sizes if n > rows), sizes[-1])  # past the largest: the last segment
    lower = sizes[sizes.index(upper) - 1]
    return pass_ms[lower] + (pass_ms[upper] - pass_ms[lower]) * (rows - lower) / (upper - lower)


def padded_costs(pass_ms: dict[int, float]) -> dict[int, float]:
    """Each pass at the cost of the cheapest measured pass at least as large: a backend that pads a
    pass to a cheaper shape (the native backend's row kernels, measured at load) never pays more."""
    return {rows: min(ms for n, ms in pass_ms.items() if n >= rows) for rows, ms in pass_ms.items()}


def speedup_from_steps(steps: list[tuple[int, int]], pass_ms: dict[int, float], draft_ms: float = 0.0) -> float:
    """A measured run's steps replayed at other pass costs: plain time per token over speculative.
    steps: (drafted, tokens) per target pass; each costs a pass of drafted + 1 rows plus drafted
    draft tokens at draft_ms, and yields `tokens`; plain decoding costs a 1-row pass per token.
    No independence assumption: the run's own mix of long and short accepts is kept."""
    tokens = sum(emitted for _, emitted in steps)
    spent = sum(pass_cost(pass_ms, drafted + 1) + drafted * draft_ms for drafted, _ in steps)
    return tokens * pass_cost(pass_ms, 1) / spent if spent else 1.0


def best_tree_size(confidences: list[float], pass_ms: dict[int, float]) -> int:
    """How many draft nodes to verify, given each node's chance that its whole path is right
    (most confident first; any prefix of them is a tree): the n with the most expected tokens
    per millisecond, (1 + sum of the first n) / cost(root + n rows). A node is accepted exactly
    when its path is, so the sum is the expected accepted length (EAGLE-2's value). At most the
    largest pass measured, less its root: past it a backend may run the pass in parts (the static
    backend's fixed rows). 0: drafting does not pay this step, decode plainly."""
    best, best_value, expected = 0, 1.0 / pass_cost(pass_ms, 1), 1.0
    for n, p in enumerate(confidences[: max(pass_ms) - 1], start=1):
        expected += p
        value = expected / pass_cost(pass_ms, n + 1)
        if value > best_value:
            best, best_value = n, value
    return best


def best_tree_value(confidences: list[float], pass_ms: dict[int, float], extra_ms: float = 0.0) -> float:
    """The most expected tokens per millisecond any tree over these nodes (most confident first)
    gives, when a step that verifies any of them also pays `extra_ms` (a head's drafting); the
    empty tree (a plain pass) pays none of it."""
    best, expected = 1.0 / pass_cost(pass_ms, 1), 1.0
    for n, p in enumerate(confidences[: max(pass_ms) - 1], start=1):
        expected += p
        best = max(best, expected / (pass_cost(pass_ms, n + 1) + extra_ms))
    return best


def drafting_pays(accepted: float, rows: float, extra_ms: float, pass_ms: dict[int, float]) -> bool:
    """Whether steps that verify `rows` drafted rows (on average), of which `accepted` are
    accepted, and pay `extra_ms` to draft them, give more tokens per millisecond than plain passes."""
    return (1 + accepted) / (pass_cost(pass_ms, 1 + rows) + extra_ms) > 1 / pass_cost(pass_ms, 1)


def tree_budget(pass_ms: dict[int, float] | None, tolerance: float = 1.1) -> int:
    """Draft nodes a token tree should verify per pass: the largest pass measured to cost at most
    `tolerance` x a one-token pass, less its root row (on a GPU rows are nearly free: up to 63;
    on a CPU each costs: DEFAULT_TREE_NODES, the floor). No measurement: the floor."""
    if not pass_ms or 1 not in pass_ms:
        return DEFAULT_TREE_NODES
    cheap = max(n for n, ms in pass_ms.items() if ms <= tolerance * pass_ms[1])
    return min(MOST_TREE_NODES, max(DEFAULT_TREE_NODES, cheap - 1))


def cost_at_threads(pass_ms_by_threads: dict[int, float], threads: int) -> float:
    """A pass's milliseconds on `threads` threads, from its cost measured at two or more thread
    counts: the least-squares fit of cost = serial + parallel / threads (Amdahl's law; the
    serial part is what more cores do not shorten, as reading the weights from memory). The
    serial part is at least 0 and at most the cheapest measured cost."""
    if len(pass_ms_by_threads) < 2:
        raise ValueError("a fit over threads needs costs at two thread counts at least")
    xs = [1.0 / t for t in pass_ms_by_threads]  # cost is linear in 1 / threads
    ys = list(pass_ms_by_threads.values())
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    parallel = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread
    serial = min(max(mean_y - parallel * mean_x, 0.0), min(ys))
    parallel = max(mean_y - serial, 0.0) / mean_x  # refit the slope with the serial part held
    return serial + parallel / threads
