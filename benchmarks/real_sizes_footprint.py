"""Load time, peak RSS and disk written at real model sizes, each in a fresh process, quickdraft beside
its peers on the same files: random weights at 1B, 3B and 8B shapes with the default target's
vocabulary, made here and never shipped.

- GGUF, Q4_0 (random 4-bit blocks written directly): llama-cpp-python (`Llama(...)` and one
  completion; at its default context of 512 tokens, and at an n_ctx of the pool of cells
  quickdraft's backend makes, the trained context up to 4096, which quickdraft's rows are compared
  with) against quickdraft's llama.cpp backend (`quickdraft.load` timing pass shapes as
  `quickdraft generate` does: a first load, with the one-time checks of a new machine and file,
  then a later load that finds them kept) and the native backend at int4 (which takes the file's
  blocks as they are).
- safetensors, bf16: transformers (`from_pretrained(dtype=bfloat16)` + `generate`) against the
  native backend at bf16 and int4, and the hf backend (transformers' model in the checkpoint's bf16).

Beside each quickdraft run: what `quickdraft plan` predicts for it (the same backend and precision,
one sequence of the run's tokens; llama.cpp's pool of cells as allocated), over the model's share
of the measured peak.

Every run decodes `--tokens` tokens after a 4-token prompt. "seconds" are the whole process
(imports, load, the tokens); "load s" the load alone (`Llama(...)`, `from_pretrained`,
`quickdraft.load`), timed inside the process. Compare them only within one run of this script.

    .venv/bin/python benchmarks/real_sizes_footprint.py [--shapes 1b 3b 8b] [--tokens 2] [--rounds N]
        [--skip LABEL_OR_FILE ...] [--work DIR]

Nothing here is a test.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
from datetime import date
from pathlib import Path

from real_sizes import SHAPES  # this folder's: the 1B/3B/8B shapes
from transformers import LlamaConfig

from quickdraft.backends.kinds import TRAITS
from quickdraft.backends.llama_cpp import DEFAULT_CELLS
from quickdraft.bench.footprint import IMPORTS, LLAMA_CPP_PYTHON, QUICKDRAFT, TRANSFORMERS, Footprint, footprint, python
from quickdraft.cli import planned_choice
from quickdraft.memory import backend_weight_bytes, human, plan_memory, read_shape, shape_from_config
from quickdraft.models import default_gguf_path
from quickdraft.models.random_checkpoint import random_checkpoint
from quickdraft.models.random_gguf import random_gguf


def config_of(name: str) -> LlamaConfig:
    shape = SHAPES[name]
    return LlamaConfig(
        vocab_size=49152,
        hidden_size=shape.hidden,
        intermediate_size=shape.ffn,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.context,
        tie_word_embeddings=False,
    )


def bf16_folder(work: Path, name: str) -> Path:
    """The random bf16 checkpoint at shape `name` under `work`, made on first need (16 GB at 8B)."""
    folder = work / f"{name}-bf16"
    if not (folder / "model.safetensors.index.json").is_file():
        random_checkpoint(config_of(name), folder, progress=True)
    return folder


def planned_bytes(file: Path, backend: str, precision: str, tokens: int) -> int:
    """What `quickdraft plan --target FILE --backend B [--precision P]` says the run needs: its
    choice of backend and precision, and their memory for one sequence of `tokens` tokens (a
    shared pool: its cells, allocated up front)."""
    shape = read_shape(file)
    choice = planned_choice(shape, backend, None if precision == "-" else precision, "cpu")
    context = None if TRAITS[choice.kind].shared_kv else tokens
    return plan_memory(shape, backend=choice.kind, precision=choice.precision, context=context).total


def written(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["1b", "3b", "8b"], choices=list(SHAPES))
    parser.add_argument("--tokens", type=int, default=2)
    parser.add_argument(
        "--work",
        type=Path,
        default=Path("/tmp/quickdraft-real-sizes"),
        help="where the random files are made (kept for a rerun)",
    )
    parser.add_argument(
        "--skip",
        nargs="*",
        default=[],
        help="runs to leave out by label or file, e.g. 'transformers', 'native bf16' or 'bf16' (every "
        "run on the safetensors folder)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="times each run is made, round after round (medians of seconds, the largest peak)",
    )
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    threads = "2"
    base_env = os.environ | {"OMP_NUM_THREADS": threads}
    imports = footprint(python(IMPORTS), base_env)
    print(
        f"{date.today()} · {platform.processor() or platform.machine()} · {threads} threads · {args.tokens} "
        f"tokens after a 4-token prompt · quickdraft's imports alone: {human(imports.peak_rss)} peak RSS, "
        f"{imports.seconds:.1f} s"
    )
    print(
        "| shape | file | run | peak RSS | peak RSS / reference | seconds | load s | load / reference | "
        "disk written | quickdraft plan | plan / peak |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.shapes:
        gguf = args.work / f"{name}-Q4_0-direct.gguf"
        if not gguf.is_file():
            random_gguf(default_gguf_path(), gguf, SHAPES[name], dtype="Q4_0", progress=True)
        folder = args.work / f"{name}-bf16"
        shape = shape_from_config(config_of(name))
        int4_budget = backend_weight_bytes(shape, "native", "int4") + shape.layer_linear_params * 2
        checkpoint = shape.params * 2  # bytes of its bf16 weights (the safetensors files, less their headers)
        llama_cpp = python(QUICKDRAFT, gguf, "llama.cpp", "-", args.tokens, 1)
        cells = min(SHAPES[name].context, DEFAULT_CELLS)  # the pool quickdraft's llama.cpp backend makes
        same_cells = f"llama-cpp-python n_ctx {cells}"
        runs = [  # (label, file, command, the reference its peak is compared with)
            ("llama-cpp-python", gguf, python(LLAMA_CPP_PYTHON, gguf, args.tokens, threads), None),
            (same_cells, gguf, python(LLAMA_CPP_PYTHON, gguf, args.tokens, threads, cells), None),
            ("quickdraft llama.cpp, first load", gguf, llama_cpp, same_cells),
            ("quickdraft llama.cpp, later load", gguf, llama_cpp, same_cells),
            ("quickdraft native int4", gguf, python(QUICKDRAFT, gguf, "native", "int4", args.tokens), int4_budget),
            ("transformers bf16", folder, python(TRANSFORMERS, folder, args.tokens), checkpoint),
            ("quickdraft native bf16", folder, python(QUICKDRAFT, folder, "native", "bf16", args.tokens), checkpoint),
            ("quickdraft hf", folder, python(QUICKDRAFT, folder, "hf", "-", args.tokens), checkpoint),
            (
                "quickdraft native int4 from bf16",
                folder,
                python(QUICKDRAFT, folder, "native", "int4", args.tokens),
                int4_budget,
            ),
        ]
        runs = [run for run in runs if not any(skip and (skip in run[0] or skip in run[1].name) for skip in args.skip)]
        if any(file == folder for _, file, _, _ in runs):
            bf16_folder(args.work, name)  # only where a run reads it
        measured: dict[str, list[Footprint]] = {label: [] for label, _, _, _ in runs}
        disks: dict[str, int] = {}
        for _ in range(args.rounds):  # round after round, so that a slow spell of the machine hits every run alike
            kept = tempfile.TemporaryDirectory(dir=args.work)  # a later load reads what the first one kept
            for label, _, command, _ in runs:
                with tempfile.TemporaryDirectory(dir=args.work) as fresh:
                    cache = kept.name if label.endswith(("first load", "later load")) else fresh
                    before = written(Path(cache))
                    try:
                        measured[label].append(
                            footprint(command, base_env | {"XDG_CACHE_HOME": cache, "HF_HOME": cache})
                        )
                    except RuntimeError as error:
                        print(f"| {name} | {label} | failed: {str(error)[-200:]!r} |", flush=True)
                    disks[label] = written(Path(cache)) - before
            kept.cleanup()
        peaks = {label: max(r.peak_rss for r in results) for label, results in measured.items() if results}
        loads = {
            label: statistics.median(r.load_seconds for r in results) if results[0].load_seconds is not None else None
            for label, results in measured.items()
            if results
        }
        for label, file, command, reference in runs:
            if label not in peaks:
                continue
            seconds = statistics.median(r.seconds for r in measured[label])
            model = peaks[label] - imports.peak_rss if label.startswith("quickdraft") else peaks[label]
            if isinstance(reference, str):
                ratio = f"{model / peaks[reference]:.2f}x {reference}" if reference in peaks else ""
            elif reference is not None:
                ratio = f"{model / reference:.2f}x {'checkpoint' if reference == checkpoint else 'int4 + 1 layer'}"
            else:
                ratio = ""
            load = "" if loads[label] is None else f"{loads[label]:.1f}"
            load_ratio = (
                f"{loads[label] / loads[reference]:.2f}x {reference}"
                if isinstance(reference, str) and loads.get(reference) and loads[label] is not None
                else ""
            )
            plan = planned_bytes(file, *command[4:6], 4 + args.tokens) if label.startswith("quickdraft") else None
            planned = f"{human(plan)} | {plan / model:.2f}x" if plan else " | "
            print(
                f"| {name} | {file.name} ({human(file.stat().st_size if file.is_file() else written(file))}) | "
                f"{label} | {human(peaks[label])} | {ratio} | {seconds:.1f} | {load} | {load_ratio} | "
                f"{human(disks[label])} | {planned} |",
                flush=True,
            )
    print("quickdraft's ratios are of its peak less its imports' peak (the model's share); peers' of their whole peak.")


if __name__ == "__main__":
    main()
