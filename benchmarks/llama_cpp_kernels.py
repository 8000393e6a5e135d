"""What one llama.cpp decode of N new tokens costs against one of a single token, on our build and
on a stock llama-cpp-python, side by side in one run (issue 61's table).

Each build runs in its own process through llama-cpp-python's own low-level API (the same calls for
both): load the file, decode `--context` tokens, then time decodes of N new tokens with logits for
every row, rolled back after each, rounds interleaved across N; each build's process runs --repeats
times, alternating with the other's, and the median is kept. Files: the default target, its
Q4_0 / Q8_0 / Q4_K_M requantizations (llama.cpp's quantizer), and random weights at TinyLlama-1.1B
and Llama-3-8B shapes (Q4_0, plus Q4_K_M at 1B), made once under --files (real shapes, never shipped).
The memory floor is the file's bytes over the bandwidth a torch sum over 2 GB measures on the same
threads; the bound is the largest N x one row / N rows (how much a pass of N beats N passes of one).

A stock build in a folder (its default flags: native CPU, repacking on):
    pip install --no-deps --target /tmp/stock llama-cpp-python==0.3.36
Run:  .venv/bin/python benchmarks/llama_cpp_kernels.py [--stock-site /tmp/stock] [--files /tmp/kernel-files]
      [--only default,Q4_0] [--rounds 7] [--sizes 1,2,4,8,16]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

SIZES = (1, 2, 4, 8, 16)
SHAPE_1B = dict(hidden=2048, layers=22, ffn=5632, heads=32, kv_heads=4, head_dim=64, context=2048)  # TinyLlama
SHAPE_8B = dict(hidden=4096, layers=32, ffn=14336, heads=32, kv_heads=8, head_dim=128, context=2048)  # Llama 3
FILES = ("default", "Q4_0", "Q8_0", "Q4_K_M", "1B-Q4_0", "1B-Q4_K_M", "8B-Q4_0")


def time_decodes(path: str, sizes: list[int], context: int, rounds: int, threads: int) -> dict:
    """ms of each decode size (median over rounds), through llama_cpp's low-level API."""
    import llama_cpp as lib

    lib.llama_backend_init()
    model = lib.llama_model_load_from_file(path.encode(), lib.llama_model_default_params())
    params = lib.llama_context_default_params()
    params.n_ctx = context + max(sizes) + 8
    params.n_batch = params.n_ubatch = max(context, max(sizes))
    params.n_threads = params.n_threads_batch = threads
    params.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_ENABLED
    ctx = lib.llama_init_from_model(model, params)
    vocab = lib.llama_n_vocab(lib.llama_model_get_vocab(model))
    batch = lib.llama_batch_init(params.n_batch, 0, 1)

    def decode(tokens: list[int], start: int, logits: bool) -> None:
        batch.n_tokens = len(tokens)
        for i, token in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, start + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = logits
        if lib.llama_decode(ctx, batch) != 0:
            raise RuntimeError(f"llama_decode failed for {len(tokens)} tokens")

    tokens = [(7 + 13 * i) % min(vocab, 32000) for i in range(context + max(sizes))]
    decode(tokens[:context], 0, False)
    memory = lib.llama_get_memory(ctx)
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(rounds + 1):  # the first round warms up
        for n in sizes:
            start = time.perf_counter()
            decode(tokens[context : context + n], context, True)
            times[n].append(1000 * (time.perf_counter() - start))
            lib.llama_memory_seq_rm(memory, 0, context, -1)
    lib.llama_batch_free(batch)
    lib.llama_free(ctx)
    lib.llama_model_free(model)
    patches = Path(lib.__file__).parent / "quickdraft-patches.txt"
    return {
        "ms": {n: statistics.median(t[1:]) for n, t in times.items()},
        "patches": patches.read_text().split() if patches.exists() else [],
        "system_info": lib.llama_print_system_info().decode(),
    }


def make_files(folder: Path, wanted: list[str]) -> dict[str, Path]:
    """The files of FILES asked for, made once under `folder`."""
    from quickdraft.models import default_gguf_path
    from quickdraft.models.random_gguf import GgufShape, quantize_gguf, random_gguf

    folder.mkdir(parents=True, exist_ok=True)
    default = Path(default_gguf_path())
    paths: dict[str, Path] = {}
    for name in wanted:
        path = folder / f"{name}.gguf"
        if name == "default":
            path = default
        elif not path.exists():
            print(f"making {path} (once)", file=sys.stderr)
            if name in ("Q4_0", "Q8_0", "Q4_K_M"):
                quantize_gguf(default, path, name, allow_requantize=True)
            elif name.endswith("-Q4_0"):
                shape = SHAPE_1B if name.startswith("1B") else SHAPE_8B
                random_gguf(default, path, GgufShape(**shape), dtype="Q4_0", progress=True)
            else:  # 1B-Q4_K_M: llama.cpp's quantizer from an F32 file of the shape
                base = folder / "1B-F32.gguf"
                if not base.exists():
                    random_gguf(default, base, GgufShape(**SHAPE_1B), progress=True)
                quantize_gguf(base, path, "Q4_K_M")
        paths[name] = path
    return paths


def bandwidth_gb_s(threads: int) -> float:
    """GB/s a torch sum over 2 GB reads on `threads` threads (best of 5)."""
    import torch

    torch.set_num_threads(threads)
    data = torch.ones(2**29, dtype=torch.float32)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return data.numel() * 4 / best / 1e9


def run_build(site: str | None, path: Path, args: argparse.Namespace) -> dict:
    """time_decodes in a process of its own, with `site` (a stock build's folder) first on its path."""
    env = dict(os.environ)
    if site:
        env["PYTHONPATH"] = os.pathsep.join([site, env.get("PYTHONPATH", "")])
    command = [sys.executable, __file__, "--worker", str(path), "--sizes", args.sizes, "--context", str(args.context)]
    command += ["--rounds", str(args.rounds), "--threads", str(args.threads)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stock-site", help="folder holding a stock llama-cpp-python build")
    parser.add_argument("--files", default="/tmp/kernel-files", help="where the made files are kept")
    parser.add_argument("--only", default=",".join(FILES), help=f"a comma list of {', '.join(FILES)}")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--context", type=int, default=128, help="cached tokens before each timed decode")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=3, help="processes per build and file, alternating")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    if args.worker:
        print(json.dumps(time_decodes(args.worker, sizes, args.context, args.rounds, args.threads)))
        return
    from tqdm import tqdm

    paths = make_files(Path(args.files), args.only.split(","))
    builds = {"ours": None} | ({"stock": args.stock_site} if args.stock_site else {})
    gb_s = bandwidth_gb_s(args.threads)
    results = {}
    for name, path in tqdm(paths.items(), desc="files", unit="file"):
        runs: dict[str, list[dict]] = {build: [] for build in builds}
        for _ in range(args.repeats):  # the builds' processes alternate, so drifts in the machine hit both
            for build, site in builds.items():
                runs[build].append(run_build(site, path, args))
        for build, done in runs.items():
            ms = {n: statistics.median(run["ms"][n] for run in done) for n in done[0]["ms"]}
            results[name, build] = done[0] | {"ms": ms}
    print(
        f"ms of one decode of N new tokens after {args.context} cached, logits for every row: median of "
        f"{args.repeats} processes (alternating builds) of the median of {args.rounds} rounds; "
        f"{args.threads} threads; {time.strftime('%Y-%m-%d')}, {platform.machine()}; memory read {gb_s:.1f} GB/s"
    )
    for build in builds:
        first = next(r for (_, b), r in results.items() if b == build)
        print(f"- {build}: patches {', '.join(first['patches']) or 'none'}; {first['system_info'].strip()}")
    print()
    print(f"| file | build | floor ms | {' | '.join(f'{n} rows' if n > 1 else '1 row' for n in sizes)} | bound |")
    print("|---|---|---|" + "---|" * (len(sizes) + 1))
    for name, path in paths.items():
        floor = path.stat().st_size / gb_s / 1e6
        for build in builds:
            ms = {int(n): v for n, v in results[name, build]["ms"].items()}
            one = ms[sizes[0]]
            cells = [f"{one:.1f} ms"] + [f"{ms[n] / one:.2f}x" for n in sizes[1:]]
            bound = max(n * one / ms[n] for n in sizes)
            print(f"| {name} | {build} | {floor:.1f} | {' | '.join(cells)} | {bound:.2f} |")


if __name__ == "__main__":
    main()
