"""Cost of one target pass on each backend and precision, with this machine's measured pass shapes
and without them, next to the bandwidth floor.

For 1, 2, 4, 8 and 16 tokens per pass at context 128 and 1024 it times a pass (median of
--repeats, cache rolled back after each), then plain decoding tokens/s, all in one process on
the embedded default target. Every backend runs twice: with the pass shapes it measured at load
on this machine (the default; backends/kernel_timing.py) and with the fixed choice (the packed kernel,
no padding). The transformers backend's measured choice pads small passes instead.

    python benchmarks/runner_bench.py --output bench-out/runner
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from datetime import date
from pathlib import Path

import torch
from tqdm import tqdm

import quickdraft
from quickdraft.backends.backend import SeqPass
from quickdraft.backends.select import make_backend
from quickdraft.models.precision import PRECISIONS

PROMPT = "Write a Python function that checks whether a number is prime."


def copy_bandwidth(megabytes: int = 512, repeats: int = 7) -> float:
    """Bytes per second this machine moves in a large tensor copy (read + write counted)."""
    source = torch.ones(megabytes * 2**20 // 4)
    target = torch.empty_like(source)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        target.copy_(source)
        times.append(time.perf_counter() - start)
    return 2 * source.numel() * 4 / statistics.median(times)


def weight_bytes(weights) -> int:
    """Bytes a decode step must read: every layer's matrices and the LM head (norms and the few
    embedding rows are noise)."""
    linears = [weights.lm_head] + [
        linear for layer in weights.layers for linear in (layer.qkv, layer.o, layer.gate_up, layer.down)
    ]
    return sum(linear.nbytes for linear in linears)


def pass_ms(backend, context: int, tokens: int, repeats: int) -> float:
    cache = backend.new_cache()
    backend.forward([SeqPass(cache, [1 + (i % 500) for i in range(context)], logits="none")])
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        backend.forward([SeqPass(cache, [7] * tokens)])
        times.append(time.perf_counter() - start)
        cache.truncate(context)
    return 1000 * statistics.median(times)


def shapes_text(backend) -> str:
    """The measured choice, for the report: row count -> kernel/padding."""
    choices = getattr(backend, "row_kernels", None) or getattr(backend, "pad_to", None)
    if not choices:
        return "packed, unpadded at every size"
    parts = []
    for n, choice in sorted(choices.items()):
        if isinstance(choice, int):
            parts.append(f"{n}->{choice} tokens")
        else:
            parts.append(
                f"{n}: {'packed' if choice.packed else 'plain'}{f' padded to {choice.rows}' if choice.rows else ''}"
            )
    return "; ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--output", type=Path, default=Path("bench-out/runner"))
    args = parser.parse_args()

    decoder = quickdraft.load(method="none", backend="hf")
    target, model = decoder.target, decoder.target.model
    precisions = list(PRECISIONS)
    backends = {}
    for measured in (True, False):
        label = "measured shapes" if measured else "fixed shapes"
        backends[f"transformers, {label}"] = make_backend(target, "hf", measure=measured)
        for precision in precisions:
            backends[f"native {precision}, {label}"] = make_backend(target, "native", precision, measure=measured)
    bandwidth = copy_bandwidth()

    table = {}
    cases = [(c, n) for c in args.contexts for n in args.tokens]
    for backend in tqdm(backends.values(), desc="warm-up", unit="backend"):
        for tokens in (1, 8):
            pass_ms(backend, 32, tokens, 3)
    for context, tokens in tqdm(cases, desc="pass timings", unit="case"):
        for name, backend in backends.items():  # interleaved: drift hits all backends alike
            table[(name, context, tokens)] = pass_ms(backend, context, tokens, args.repeats)

    # Plain decoding, tokens/s, all counted as new tokens over the whole call.
    ids = decoder.encode(PROMPT)
    speeds, same = {}, {}
    input_ids = torch.tensor([ids])
    model.generate(input_ids, max_new_tokens=8, do_sample=False)
    start = time.perf_counter()
    out = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=False,
        max_new_tokens=args.new_tokens,
        min_new_tokens=args.new_tokens,
    )
    speeds["transformers model.generate (fp32)"] = args.new_tokens / (time.perf_counter() - start)
    reference = out[0, len(ids) :].tolist()
    for measured in (True, False):
        label = "measured shapes" if measured else "fixed shapes"
        for kind, precision in [("hf", "fp32")] + [("native", p) for p in precisions]:
            name = f"quickdraft none, {'transformers' if kind == 'hf' else 'native ' + precision}, {label}"
            plain = quickdraft.Decoder(target, None, "none", backend=kind, precision=precision, measure_shapes=measured)
            plain.generate(ids, max_new_tokens=8)
            result = plain.generate(ids, max_new_tokens=args.new_tokens)
            speeds[name] = len(result.token_ids) / result.stats.wall_time
            same[name] = result.token_ids == reference[: len(result.token_ids)]

    native = {p: backends[f"native {p}, measured shapes"].weights for p in precisions}
    floor = {p: 1000 * weight_bytes(native[p]) / bandwidth for p in precisions}
    machine = f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    lines = [
        f"Target: {target.name}; {date.today()}; {machine}; copy bandwidth "
        f"{bandwidth / 1e9:.1f} GB/s; weight bytes read per pass -> floor (bytes / bandwidth): "
        + ", ".join(f"{p} {weight_bytes(native[p]) / 1e6:.0f} MB -> {floor[p]:.1f} ms" for p in precisions)
        + ".",
        "",
        "Pass shapes measured at load on this machine (row count: kernel):",
        "",
    ]
    for name, backend in backends.items():
        if "measured" in name:
            lines.append(f"- {name.split(',')[0]}: {shapes_text(backend)}")
    lines += [
        "",
        f"ms per target pass (median of {args.repeats})",
        "",
        "| context | backend | " + " | ".join(f"{n} tok" for n in args.tokens) + " | 8 tok / 1 tok |",
        "|---" * (len(args.tokens) + 3) + "|",
    ]
    for context in args.contexts:
        for name in backends:
            cells = [f"{table[(name, context, n)]:.1f}" for n in args.tokens]
            ratio = table[(name, context, 8)] / table[(name, context, 1)] if 8 in args.tokens else float("nan")
            lines.append(f"| {context} | {name} | " + " | ".join(cells) + f" | {ratio:.2f}x |")
    lines += [
        "",
        f"Plain greedy decoding, {args.new_tokens} new tokens, chat prompt {PROMPT!r}:",
        "",
        "| decoder | tok/s | vs model.generate | same tokens as model.generate |",
        "|---|---|---|---|",
    ]
    base = speeds["transformers model.generate (fp32)"]
    for label, speed in speeds.items():
        lines.append(f"| {label} | {speed:.1f} | {speed / base:.2f}x | {same.get(label, 'reference')} |")
    report = "\n".join(lines)
    print(report)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "report.md").write_text(report + "\n")
    raw = {f"{name}|{context}|{tokens}": ms for (name, context, tokens), ms in table.items()}
    (args.output / "raw.json").write_text(
        json.dumps({"pass_ms": raw, "tok_s": speeds, "floor_ms": floor, "bandwidth": bandwidth}, indent=1)
    )


if __name__ == "__main__":
    main()
