"""What loading and generating cost a fresh process: its peak RSS and wall time, for quickdraft and
for its peers run the way their own users run them (tests/test_real_sizes.py, benchmarks/real_sizes.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import dataclass

# Runs a command and prints the peak RSS (bytes) of the process it started, its wall seconds and
# the seconds its load took (the command's "load_s" line; -1 if it printed none).
_PEAK = textwrap.dedent("""
    import resource, subprocess, sys, time
    start = time.perf_counter()
    run = subprocess.run(sys.argv[1:], capture_output=True, text=True)
    if run.returncode:
        sys.exit(run.stderr[-3000:])
    load = [line.split()[1] for line in run.stdout.splitlines() if line.startswith("load_s ")] or ["-1"]
    print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, time.perf_counter() - start, load[-1])
""")

# llama-cpp-python as its README runs it: load a GGUF file, complete a prompt.  argv: file, tokens,
# threads[, n_ctx (default: its own, 512)]
LLAMA_CPP_PYTHON = textwrap.dedent("""
    import sys, time
    from llama_cpp import Llama
    start = time.perf_counter()
    cells = {"n_ctx": int(sys.argv[4])} if sys.argv[4:] else {}
    model = Llama(model_path=sys.argv[1], n_threads=int(sys.argv[3]), verbose=False, **cells)
    print("load_s", time.perf_counter() - start)
    print(model("The capital of France is", max_tokens=int(sys.argv[2]), temperature=0)["choices"][0]["text"])
""")

# transformers as its docs run it: from_pretrained in bf16, generate.  argv: folder, tokens
TRANSFORMERS = textwrap.dedent("""
    import sys, time, torch
    from transformers import AutoModelForCausalLM
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16)
    print("load_s", time.perf_counter() - start)
    ids = torch.tensor([[1, 2, 3, 4]])
    print(model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=int(sys.argv[2]),
                         do_sample=False)[0, 4:].tolist())
""")

# quickdraft's library on one backend and precision, plain decoding; load_s: loading the model and
# making its decoder (with measure "1": timing pass shapes as `quickdraft generate` does, once per
# machine and file).  argv: model, backend, precision, tokens[, measure]
QUICKDRAFT = textwrap.dedent("""
    import sys, time
    import quickdraft
    precision = None if sys.argv[3] == "-" else sys.argv[3]
    start = time.perf_counter()
    decoder = quickdraft.load(sys.argv[1], method="none", backend=sys.argv[2], precision=precision,
                              measure_shapes=sys.argv[5:] == ["1"])
    print("load_s", time.perf_counter() - start)
    print(decoder.generate([1, 2, 3, 4], max_new_tokens=int(sys.argv[4])).token_ids)
""")

# What quickdraft's process holds before any model: the interpreter with torch and transformers.
IMPORTS = "import quickdraft, quickdraft.cli, transformers.models.llama.modeling_llama"


@dataclass(frozen=True)
class Footprint:
    peak_rss: int  # bytes
    seconds: float  # the whole process
    load_seconds: float | None = None  # its load alone, where the program times it


def footprint(command: list[str], env: dict[str, str] | None = None, timeout: float = 3600) -> Footprint:
    """Run `command` in a fresh process; its peak RSS and wall time (an error with its stderr if it fails)."""
    run = subprocess.run(
        [sys.executable, "-c", _PEAK, *command], capture_output=True, text=True, timeout=timeout, env=env
    )
    if run.returncode:
        raise RuntimeError(f"{command[:4]} failed: {run.stderr[-3000:]}")
    peak, seconds, load = run.stdout.strip().splitlines()[-1].split()
    return Footprint(int(peak), float(seconds), float(load) if float(load) >= 0 else None)


def python(program: str, *args: object) -> list[str]:
    """The command that runs `program` with `args` in this interpreter."""
    return [sys.executable, "-c", program, *map(str, args)]
