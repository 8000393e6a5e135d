"""Cost of one target pass: transformers runner vs native runner at each precision, next to the bandwidth floor.

For 1, 2, 4, 8 and 16 tokens per pass at context 128 and 1024 it times a pass (median of
--repeats, cache rolled back after each), then plain decoding tokens/s of both runners and of
transformers' model.generate, all in one process on the embedded default target. Native rows run
at fp32, bf16, int8 and int4 (int4: the GGUF's own Q4_1 blocks). Rows marked torch.compile run the
same native forward compiled by inductor (dynamic shapes; fp32/bf16 on unpacked weights).

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
from quickdraft.models.native import NativeRunner, NativeWeights
from quickdraft.models.precision import PRECISIONS
from quickdraft.models.runner import HFRunner
from quickdraft.models.select import make_runner

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


def weight_bytes(weights: NativeWeights) -> int:
    """Bytes a decode step must read: every layer's matrices and the LM head (norms and the few
    embedding rows are noise)."""
    linears = [weights.lm_head] + [linear for layer in weights.layers
                                   for linear in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    return sum(linear.nbytes for linear in linears)


class CompiledNative:
    """The native runner's own forward under torch.compile (dynamic shapes), on unpacked weights:
    measured to see whether compiling the decode/verify step pays on this CPU."""

    def __init__(self, weights: NativeWeights) -> None:
        self.runner = NativeRunner(weights)
        self.forward = torch.compile(self.runner.forward, dynamic=True)
        self.reset, self.truncate = self.runner.reset, self.runner.truncate


def pass_ms(runner, context: int, tokens: int, repeats: int) -> float:
    runner.reset()
    runner.forward([1 + (i % 500) for i in range(context)], all_logits=False)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        runner.forward([7] * tokens)
        times.append(time.perf_counter() - start)
        runner.truncate(context)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--no-compile", action="store_true", help="leave out the torch.compile rows")
    parser.add_argument("--output", type=Path, default=Path("bench-out/runner"))
    args = parser.parse_args()

    decoder = quickdraft.load(method="none", runner="hf")
    model = decoder.target.model
    precisions = list(PRECISIONS)
    runners = {"transformers": HFRunner(model)}
    for label in precisions:
        runners[f"native {label}"] = make_runner(decoder.target, "native", precision=label)
    if not args.no_compile:
        for label in precisions:
            weights = (NativeWeights.from_model(model, label, pack=False) if label in ("fp32", "bf16")
                       else runners[f"native {label}"].weights)
            runners[f"native {label} torch.compile"] = CompiledNative(weights)
    bandwidth = copy_bandwidth()

    table = {}
    cases = [(c, n) for c in args.contexts for n in args.tokens]
    for name, runner in tqdm(runners.items(), desc="warm-up (compiles)", unit="runner"):
        for tokens in (1, 8):
            pass_ms(runner, 32, tokens, 3)
    for context, tokens in tqdm(cases, desc="pass timings", unit="case"):
        for name, runner in runners.items():  # interleaved: drift hits all runners alike
            table[(name, context, tokens)] = pass_ms(runner, context, tokens, args.repeats)

    # Plain decoding, tokens/s, all counted as new tokens over the whole call.
    ids = decoder.encode(PROMPT)
    speeds = {}
    input_ids = torch.tensor([ids])
    model.generate(input_ids, max_new_tokens=8, do_sample=False)
    start = time.perf_counter()
    out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                         max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens)
    speeds["transformers model.generate (fp32)"] = args.new_tokens / (time.perf_counter() - start)
    reference = out[0, len(ids):].tolist()
    same = {}
    for label, runner_kind, precision in ([("quickdraft none, transformers runner", "hf", "fp32")]
                                          + [(f"quickdraft none, native {p}", "native", p) for p in precisions]):
        plain = decoder.with_method("none", runner=runner_kind, precision=precision)
        plain.generate(ids, max_new_tokens=8)
        result = plain.generate(ids, max_new_tokens=args.new_tokens)
        result_ids = result.token_ids
        speeds[label] = len(result_ids) / result.stats.wall_time
        same[label] = result_ids == reference[: len(result_ids)]

    floor = {label: 1000 * weight_bytes(runners[f"native {label}"].weights) / bandwidth for label in precisions}
    machine = f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    lines = [f"Target: {decoder.target.name}; {date.today()}; {machine}; copy bandwidth "
             f"{bandwidth / 1e9:.1f} GB/s; weight bytes read per pass -> floor (bytes / bandwidth): "
             + ", ".join(f"{p} {weight_bytes(runners[f'native {p}'].weights) / 1e6:.0f} MB -> {floor[p]:.1f} ms"
                         for p in precisions) + ".", "",
             "ms per target pass (median of %d)" % args.repeats, "",
             "| context | runner | " + " | ".join(f"{n} tok" for n in args.tokens) + " | 8 tok / 1 tok |",
             "|---" * (len(args.tokens) + 3) + "|"]
    for context in args.contexts:
        for name in runners:
            cells = [f"{table[(name, context, n)]:.1f}" for n in args.tokens]
            ratio = table[(name, context, 8)] / table[(name, context, 1)] if 8 in args.tokens else float("nan")
            lines.append(f"| {context} | {name} | " + " | ".join(cells) + f" | {ratio:.2f}x |")
    lines += ["", f"Plain greedy decoding, {args.new_tokens} new tokens, chat prompt {PROMPT!r}:", "",
              "| decoder | tok/s | vs model.generate | same tokens as model.generate |", "|---|---|---|---|"]
    base = speeds["transformers model.generate (fp32)"]
    for label, speed in speeds.items():
        lines.append(f"| {label} | {speed:.1f} | {speed / base:.2f}x | {same.get(label, 'reference')} |")
    report = "\n".join(lines)
    print(report)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "report.md").write_text(report + "\n")
    raw = {f"{name}|{context}|{tokens}": ms for (name, context, tokens), ms in table.items()}
    (args.output / "raw.json").write_text(json.dumps({"pass_ms": raw, "tok_s": speeds, "floor_ms": floor,
                                                      "bandwidth": bandwidth}, indent=1))


if __name__ == "__main__":
    main()
