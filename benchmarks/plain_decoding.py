"""Plain decoding at real model sizes: quickdraft's native backend against transformers' `generate`,
the same bf16 checkpoint, the same threads, each in a fresh process: random weights at 1B, 3B and 8B
shapes with the default target's vocabulary, made here and never shipped.

- transformers as its docs run it: `from_pretrained(dtype=bfloat16)`, then `generate` (greedy).
- quickdraft as `quickdraft generate --method none --precision bf16 --backend native` loads it:
  `quickdraft.load(..., measure_shapes=True)`, which picks this machine's faster bf16 product
  (backends/kernel_timing.py: bf16 matrix columns, or one row at a time where the CPU has no bf16
  arithmetic) and times pass shapes, once per machine and file (kept in a cache made for the run).

Each process decodes one token first (warm-up: lazily made buffers, the first pass's page faults),
then times `generate` of up to `--tokens` greedy tokens (fewer where the model ends the text)
after a prompt of each of `--prompts` lengths, and prints new tokens per second, the prompt's
prefill included. A 1-token prompt has no prefill: that column is decoding alone. The ratios are
quickdraft's over transformers', from one run of this script: compare only those.

    .venv/bin/python benchmarks/plain_decoding.py [--shapes 1b 8b] [--prompts 1 64] [--tokens 16] [--rounds 2]
        [--work DIR]

Nothing here is a test.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
from datetime import date
from pathlib import Path

from real_sizes import SHAPES  # this folder's: the 1B/3B/8B shapes
from real_sizes_footprint import bf16_folder, written

from quickdraft.memory import human

# argv: folder, tokens, prompt ids (comma-separated). Prints "tok_s <n>" and the ids.
TRANSFORMERS = textwrap.dedent("""
    import sys, time, torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16)
    ids = torch.tensor([[int(t) for t in sys.argv[3].split(",")]])
    run = lambda n: model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                   do_sample=False)[0, ids.shape[1]:].tolist()
    run(1)
    start = time.perf_counter()
    out = run(int(sys.argv[2]))
    print("tok_s", len(out) / (time.perf_counter() - start))
    print(out)
""")

# argv: folder, tokens, prompt ids. The same, through quickdraft's library.
QUICKDRAFT = textwrap.dedent("""
    import sys, time
    import quickdraft
    decoder = quickdraft.load(sys.argv[1], method="none", backend="native", precision="bf16", measure_shapes=True)
    ids = [int(t) for t in sys.argv[3].split(",")]
    run = lambda n: decoder.generate(ids, max_new_tokens=n).token_ids
    run(1)
    start = time.perf_counter()
    out = run(int(sys.argv[2]))
    print("tok_s", len(out) / (time.perf_counter() - start))
    print(out)
""")


def tokens_per_second(program: str, folder: Path, tokens: int, prompt: int, env: dict[str, str]) -> tuple[float, str]:
    """One fresh process: its decoding speed after a `prompt`-token prompt, and the ids it made."""
    ids = ",".join(str(1 + i % 1000) for i in range(prompt))
    run = subprocess.run(
        [sys.executable, "-c", program, str(folder), str(tokens), ids],
        capture_output=True,
        text=True,
        env=env,
        timeout=7200,
    )
    if run.returncode:
        raise RuntimeError(run.stderr[-3000:])
    lines = run.stdout.strip().splitlines()
    speed = next(float(line.split()[1]) for line in lines if line.startswith("tok_s "))
    return speed, lines[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["1b", "3b", "8b"], choices=list(SHAPES))
    parser.add_argument("--prompts", nargs="+", type=int, default=[1, 64], help="prompt lengths, in tokens")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2, help="runs of each, round after round (medians)")
    parser.add_argument(
        "--work",
        type=Path,
        default=Path("/tmp/quickdraft-real-sizes"),
        help="where the random checkpoints are made (kept for a rerun)",
    )
    args = parser.parse_args()
    threads = "2"
    print(
        f"{date.today()} · {platform.processor() or platform.machine()} · {threads} threads · {args.tokens} greedy "
        f"tokens, bf16 · medians of {args.rounds} rounds"
    )
    print(
        "| shape | checkpoint | prompt tokens | transformers generate tok/s | quickdraft native bf16 tok/s | "
        "quickdraft / transformers | same tokens | each round (transformers / quickdraft) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in args.shapes:
        folder = bf16_folder(args.work, name)
        runs = [
            (label, program, prompt)
            for prompt in args.prompts
            for label, program in (("transformers", TRANSFORMERS), ("quickdraft", QUICKDRAFT))
        ]
        speeds: dict[tuple, list[float]] = {(label, prompt): [] for label, _, prompt in runs}
        made: dict[tuple, str] = {}
        with tempfile.TemporaryDirectory(dir=args.work) as cache:  # the kernel choices kept across rounds
            env = os.environ | {"OMP_NUM_THREADS": threads, "XDG_CACHE_HOME": cache, "HF_HOME": cache}
            for _ in range(args.rounds):  # round after round: a slow spell of the machine hits every run alike
                for label, program, prompt in runs:
                    speed, made[label, prompt] = tokens_per_second(program, folder, args.tokens, prompt, env)
                    speeds[label, prompt].append(speed)
        for prompt in args.prompts:
            ours = statistics.median(speeds["quickdraft", prompt])
            theirs = statistics.median(speeds["transformers", prompt])
            same = "yes" if made["quickdraft", prompt] == made["transformers", prompt] else "no"
            rounds = ", ".join(
                f"{a:.2f} / {b:.2f}" for a, b in zip(speeds["transformers", prompt], speeds["quickdraft", prompt])
            )
            print(
                f"| {name} | {folder.name} ({human(written(folder))}) | {prompt} | {theirs:.2f} | {ours:.2f} | "
                f"{ours / theirs:.2f}x | {same} | {rounds} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
