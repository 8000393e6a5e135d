"""Kernels and pass costs timed per machine: measured once at load, kept on disk
(quickdraft/measured.py), used for every pass.

Which kernel is fastest for a pass of n rows differs between CPUs: on an AMD EPYC a one-token
fp32 pass through MKL's gemv path took twice as long as a four-token pass through oneDNN's
packed kernel, on an Intel Xeon the reverse. So a backend times its own layers at a few row
counts, both ways where it has two kernels, with and without padding to a larger row count,
and keeps the fastest for each count among those that give the real rows the bits the default
kernel (packed, unpadded) gives them, checked on the timing's own inputs: at fp32 the two kernels
may round differently in the last bits, as any two fp32 kernels do, and a choice made by timing
must change speed, never an output. Also timed here: which bf16
kernel multiplies faster, whether prompt rows go faster widened, whether tree rows may read the
cache in place, and what a whole pass of n tokens costs (the cost model's prior).
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

from quickdraft.backends.kinds import HF, NATIVE
from quickdraft.measured import QUIET, REPEATS, CpuShare, cached_choice, read_choice, wall_ms, write_choice
from quickdraft.models.linear import ColumnLinear, Kernel, PackedLinear, RowLinear, apply_linear

ROW_GRID = (1, 2, 3, 4, 5, 6, 8, 12, 16)  # row counts timed; counts between take the next one up
PAD_GRID = (1, 2, 3, 4, 6, 8)  # token counts timed for the transformers backend


def fastest_at_or_above(costs: dict[tuple, float], grid: tuple[int, ...]) -> dict[int, tuple]:
    """For every n up to the grid's top: the cheapest measured (way, rows) with rows >= n."""
    return {
        n: min((key for key in costs if key[-1] >= n), key=lambda key: (costs[key], key[-1]))
        for n in range(1, grid[-1] + 1)
    }


def measure_row_kernels(weights, folder: Path | None, progress: bool = True) -> dict[int, Kernel]:
    """The native backend's Kernel per row count: packed or plain kernel (fp32), padded or not.
    Empty where there is nothing to choose: bf16's column layout already pads to 16 rows, and
    bf16 one row at a time costs n one-row products whatever the padding."""
    linears = [linear for layer in weights.layers for linear in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    linears.append(weights.lm_head)
    if all(isinstance(linear, (ColumnLinear, RowLinear)) for linear in linears):
        return {}
    ways = (True, False) if any(isinstance(x, PackedLinear) and x.has_packed for x in linears) else (True,)
    signature = {
        "backend": NATIVE,
        "precision": weights.precision,
        "device": str(weights.device),
        "shapes": sorted({tuple(_shape(x)) for x in linears}),
        "layers": len(weights.layers),
        "grid": ROW_GRID,
        "bits": "default kernel's",  # choices made before only the default's bits were allowed are timed again
    }

    def measure() -> dict[int, list]:
        inputs = {_shape(x)[1] for x in linears}
        generator = torch.Generator().manual_seed(0)
        cases = [(packed, rows) for rows in ROW_GRID for packed in ways]
        xs = {
            (size, rows): torch.randn(rows, size, generator=generator).to(weights.dtype).to(weights.device)
            for size in inputs
            for rows in ROW_GRID
        }

        def run(packed: bool, rows: int) -> None:
            for linear in linears:
                apply_linear(linear, xs[(_shape(linear)[1], rows)], Kernel(packed))

        costs: dict[tuple, list[float]] = {case: [] for case in cases}
        with torch.inference_mode():
            run(*cases[0])  # warm-up
            for _ in tqdm(
                range(REPEATS),
                desc=f"quickdraft: timing {weights.precision} pass shapes (once)",
                unit="round",
                disable=not progress,
                file=sys.stderr,
            ):
                for case in cases:  # interleaved: drift hits every case alike
                    costs[case].append(wall_ms(lambda: run(*case)))

            def same_bits(n: int, packed: bool, rows: int) -> bool:  # n real rows get the default kernel's bits
                return all(
                    torch.equal(apply_linear(linear, x, Kernel(packed, rows)), apply_linear(linear, x, Kernel()))
                    for linear in linears
                    for x in [xs[(_shape(linear)[1], ROW_GRID[-1])][:n]]
                )

            medians = {case: statistics.median(t) for case, t in costs.items()}
            choice = {}
            for n in range(1, ROW_GRID[-1] + 1):  # the fastest case that keeps the bits (the default always does)
                fastest = sorted((case for case in medians if case[-1] >= n), key=lambda c: (medians[c], c[-1]))
                packed, rows = next((c for c in fastest if c == (True, n) or same_bits(n, *c)), (True, n))
                choice[n] = [packed, rows if rows > n else 0]
        return choice

    choice = cached_choice(folder, signature, measure)
    return {
        int(n): Kernel(bool(packed), int(rows)) for n, (packed, rows) in choice.items() if (packed, rows) != (True, 0)
    }


def measure_pad_sizes(backend, folder: Path | None, progress: bool = True) -> dict[int, int]:
    """The transformers backend's token count to run for each pass size (padding after the real tokens)."""
    from quickdraft.backends.backend import SeqPass

    model = backend.model
    signature = {
        "backend": HF,
        "model": type(model).__name__,
        "config": model.config.to_json_string(),
        "device": str(backend.device),
        "grid": PAD_GRID,
    }

    def measure() -> dict[int, list]:
        context = [(1 + i) % backend.vocab_size for i in range(32)]
        cache = backend.new_cache()
        backend.forward([SeqPass(cache, context, logits="none")])

        def run(rows: int) -> None:
            backend.forward([SeqPass(cache, [context[-1]] * rows)])
            cache.truncate(len(context))

        costs: dict[tuple, list[float]] = {(rows,): [] for rows in PAD_GRID}
        run(1)
        for _ in tqdm(
            range(REPEATS),
            desc="quickdraft: timing transformers pass shapes (once)",
            unit="round",
            disable=not progress,
            file=sys.stderr,
        ):
            for case in costs:
                costs[case].append(wall_ms(lambda: run(case[0])))
        best = fastest_at_or_above({case: statistics.median(t) for case, t in costs.items()}, PAD_GRID)
        return {n: [rows] for n, (rows,) in best.items()}

    choice = cached_choice(folder, signature, measure)
    return {int(n): int(size[0]) for n, size in choice.items() if size[0] > int(n)}


# The pass sizes a bf16 kernel is chosen for. A target's: a one-token pass and a typical verify
# pass, whatever its method (one kernel serves every pass, or plain decoding would round a token
# otherwise than speculation). A draft model's: the one-token passes it drafts with.
VERIFY_ROWS = (1, 4)
DECODE_ROWS = (1,)
PROMPT_ROWS = (64,)  # a short prompt's prefill
DENSE_QUESTION, PROMPT_QUESTION = "bf16 columns or rows", "prompt rows one at a time or widened"
FIRST_LAYER = ("self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj")


def measure_dense_kernel(
    tensor: Callable[[str], torch.Tensor],
    folder: Path | None,
    rows: tuple[int, ...] = VERIFY_ROWS,
    progress: bool = True,
) -> str:
    """ "bf16" or "rows": how this machine multiplies bf16 weights faster, as bf16 matrix columns
    (ColumnLinear) or one row at a time (RowLinear; CPUs without bf16 arithmetic, or plain
    decoding), timed on the first layer's matrices at `rows` rows (VERIFY_ROWS or DECODE_ROWS).
    Both keep the weights in bf16: widening them to fp32 would double a bf16 model's memory.
    tensor: a weight by its transformers name (LoadedModel.tensor)."""
    return _faster_bf16(
        {"bf16": ColumnLinear, "rows": RowLinear},
        rows,
        tensor,
        folder,
        DENSE_QUESTION,
        "bf16 matrix products",
        progress,
    )


def measure_prompt_kernel(tensor: Callable[[str], torch.Tensor], folder: Path | None, progress: bool = True) -> bool:
    """Whether prompt rows go faster through RowLinear.widened (the weight widened to fp32 a block
    at a time) than one row at a time, timed on the first layer's matrices at PROMPT_ROWS rows:
    the native backend's widen_prompts where its bf16 kernel is RowLinear."""
    widened = lambda weight: RowLinear(weight).widened  # noqa: E731 - a kind is made from a weight
    return (
        _faster_bf16(
            {"rows": RowLinear, "widened": widened},
            PROMPT_ROWS,
            tensor,
            folder,
            PROMPT_QUESTION,
            "bf16 prompt rows",
            progress,
        )
        == "widened"
    )


def bf16_signature(question: str, rows: tuple[int, ...], matrices: list[torch.Tensor]) -> dict:
    """What a bf16 kernel choice is kept under: the question, the rows timed, the first layer's shapes."""
    return {"backend": NATIVE, "dense": question, "rows": list(rows), "shapes": [list(m.shape) for m in matrices]}


def _faster_bf16(
    kinds: dict[str, Callable],
    rows: tuple[int, ...],
    tensor: Callable[[str], torch.Tensor],
    folder: Path | None,
    question: str,
    what: str,
    progress: bool,
) -> str:
    """The kind (a maker of a callable [n, in] -> [n, out] from a bf16 weight) that multiplies the
    first layer's matrices faster at `rows` rows, timed once per machine and shapes (cached)."""
    matrices = [tensor(f"model.layers.0.{name}.weight") for name in FIRST_LAYER]
    signature = bf16_signature(question, rows, matrices)

    def measure() -> str:
        weights = [m.detach().to(torch.bfloat16) for m in matrices]
        made = {kind: [make(w) for w in weights] for kind, make in kinds.items()}
        generator = torch.Generator().manual_seed(0)
        xs = {n: [torch.randn(n, w.shape[1], generator=generator).to(torch.bfloat16) for w in weights] for n in rows}
        costs: dict[str, list[float]] = {kind: [] for kind in kinds}
        with torch.inference_mode():
            for _ in tqdm(
                range(REPEATS),
                desc=f"quickdraft: timing {what} (once)",
                unit="round",
                disable=not progress,
                file=sys.stderr,
            ):
                for kind, linears in made.items():
                    costs[kind].append(
                        sum(wall_ms(lambda: [linear(x) for linear, x in zip(linears, xs[n])]) for n in rows)
                    )
        return min(kinds, key=lambda kind: statistics.median(costs[kind]))

    return str(cached_choice(folder, signature, measure))


def check_in_place_trees(weights, folder: Path | None) -> bool:
    """Whether tree rows may read the KV cache in place below fp32 (models/row_attention.py
    trees_read_in_place: a property of this machine's matmul kernel), checked once per machine
    and attention shape, cached in `folder`; None: not checked, so gather (always exact)."""
    from quickdraft.models.row_attention import trees_read_in_place

    if folder is None or weights.dtype == torch.float32:  # fp32 passes use SDPA, not row groups
        return False
    signature = {
        "check": "trees read in place",
        "heads": weights.heads,
        "kv_heads": weights.kv_heads,
        "head_dim": weights.head_dim,
        "device": str(weights.device),
    }
    return bool(
        cached_choice(
            folder,
            signature,
            lambda: trees_read_in_place(weights.heads, weights.kv_heads, weights.head_dim, weights.device),
        )
    )


def _shape(linear) -> tuple[int, int]:
    """(out, in) of any of the native backend's linear layers."""
    return linear.out_features, linear.in_features


COST_GRID = (1, 2, 4, 8, 16)  # tokens per pass timed for the cost model's prior
COST_CONTEXT = 128  # cached tokens before the timed pass: a typical prompt


def measure_pass_costs(
    backend,
    folder: Path | None,
    signature: dict | None = None,
    progress: bool = True,
    grid: tuple[int, ...] = COST_GRID,
) -> dict[int, float]:
    """Milliseconds of one whole pass of n tokens (all logits) after COST_CONTEXT cached ones, for n
    in `grid`: the median of REPEATS interleaved rounds. What verification costs on this backend
    here, for the cost model's prior, the tree budget and choosing a backend; cached per machine."""
    from quickdraft.backends.backend import SeqPass

    signature = {
        "backend": type(backend).__name__,
        "name": backend.name,
        "precision": getattr(backend, "precision", None),
        "device": str(backend.device),
        "grid": grid,
        "context": COST_CONTEXT,
        **(signature or {}),
    }

    cached = max(1, min(COST_CONTEXT, backend.max_length - max(grid)))  # a short context: fewer cached tokens
    grid = tuple(rows for rows in grid if cached + rows <= backend.max_length)

    def measure() -> tuple[dict[int, float], float]:
        context = [(7 + 13 * i) % backend.vocab_size for i in range(max(cached, max(grid)))]
        cache = backend.new_cache(cached + max(grid))
        backend.forward([SeqPass(cache, context[:cached], logits="none")])

        def run(rows: int) -> None:
            backend.forward([SeqPass(cache, context[:rows])])
            cache.truncate(cached)

        costs: dict[int, list[float]] = {rows: [] for rows in grid}
        run(1)  # warm-up
        share = CpuShare(getattr(backend, "threads", None) or torch.get_num_threads())
        for _ in tqdm(
            range(REPEATS),
            desc=f"quickdraft: timing {backend.name} passes (once)",
            unit="round",
            disable=not progress,
            file=sys.stderr,
        ):
            for rows in grid:
                costs[rows].append(wall_ms(lambda: run(rows)))
        return {rows: statistics.median(t) for rows, t in costs.items()}, share.share()

    record = read_choice(folder, signature)
    if record is None:
        record, share = measure()
        # Timed while other work had the cores (a CPU backend's threads got under QUIET of them):
        # used for this run, not kept, so a quiet later load measures again.
        if backend.device.type != "cpu" or share >= QUIET:
            write_choice(folder, signature, record)
    return {int(n): float(ms) for n, ms in record.items()}
