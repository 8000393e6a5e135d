"""What a target pass costs on a GPU against the rows it scores, and plain decoding against
transformers' generate on the same GPU, in one run (part (b) of benchmarks/gpu_check.sh).

For each model shape: the default target (the embedded GGUF, or --target), and SmolLM2-1.7B and
Llama-3-8B shapes with random weights (timing only; nothing to download):
  - a static pass whose fixed shape is n rows (one CUDA graph each), for n in --rows: what a
    verify pass of n tokens costs when the graph is made for exactly n;
  - passes of n tokens on the static backend as quickdraft runs it (every pass 64 rows);
  - plain greedy decoding of --new-tokens tokens: quickdraft (Decoder, method none) against
    transformers' model.generate on the same weights, bf16, same prompt.
Prints markdown tables and writes passes.json to --out.

Run (GPU):   python3 benchmarks/gpu_passes.py --out gpu-out
Dry run:     python benchmarks/gpu_passes.py --dry-run --out /tmp/gpu-dry   (CPU, tiny random shapes)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import LlamaConfig, LlamaForCausalLM

from quickdraft import Decoder
from quickdraft.backends.backend import SeqPass
from quickdraft.backends.select import STATIC_ROWS
from quickdraft.backends.static import StaticBackend
from quickdraft.models.loading import LoadedModel, load_model
from quickdraft.models.native_weights import NativeWeights

SHAPES = {  # configs of public checkpoints (their config.json), weights random here
    "smollm2-1.7b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=24,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=49152,
        max_position_embeddings=8192,
        rope_theta=130000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
    "llama3-8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    ),
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    ),
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_ms(run, device: torch.device, rounds: int) -> float:
    """Median wall milliseconds of run() over `rounds`, GPU work included."""
    times = []
    for _ in range(rounds):
        sync(device)
        start = time.perf_counter()
        run()
        sync(device)
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


def build(shape: str, target: str | None, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    if shape == "default":
        loaded = load_model(target)
        return LoadedModel.of(loaded.transformers_model(dtype).to(device), loaded.tokenizer, loaded.name)
    config = LlamaConfig(**SHAPES[shape], bos_token_id=None, eos_token_id=None, pad_token_id=None)
    with torch.device(device):
        model = LlamaForCausalLM._from_config(config, dtype=dtype).eval()
    return LoadedModel.of(model, None, shape)


def pass_costs(weights: NativeWeights, rows: list[int], context: int, rounds: int, graphs: bool) -> dict:
    """ms of a pass of n tokens after `context` cached ones: with a graph made for n rows, and on the
    static backend as quickdraft runs it (STATIC_ROWS rows every pass)."""
    device, vocab = weights.device, weights.lm_head.out_features
    tokens = [(7 + 13 * i) % vocab for i in range(context + max(rows))]

    def cost(backend: StaticBackend, n: int) -> float:
        cache = backend.new_cache(context + max(rows))
        backend.forward([SeqPass(cache, tokens[:context], logits="none")])

        def run() -> None:
            backend.forward([SeqPass(cache, tokens[context : context + n])])
            cache.truncate(context)

        run()  # captures the graph
        return timed_ms(run, device, rounds)

    shared = StaticBackend(weights, "bench", rows=STATIC_ROWS, graphs=graphs)
    out = {"own_graph": {}, "static": {}}
    for n in tqdm(rows, desc="pass costs", unit="size", file=sys.stderr):
        out["own_graph"][n] = cost(StaticBackend(weights, "bench", rows=n, graphs=graphs), n)
        out["static"][n] = cost(shared, n) if n <= STATIC_ROWS else None
    return out


def plain_decoding(
    loaded: LoadedModel, device: torch.device, precision: str, prompt: list[int], new_tokens: int, graphs: bool
) -> dict:
    """tok/s of greedy decoding: quickdraft's static backend (method none) and transformers' generate."""
    decoder = Decoder(
        loaded, None, "none", device=str(device), backend="static", precision=precision, measure_shapes=False
    )
    decoder.generate(prompt, max_new_tokens=8)  # captures the graphs this length needs
    sync(device)
    start = time.perf_counter()
    ours = decoder.generate(prompt, max_new_tokens=new_tokens)
    sync(device)
    ours_s = time.perf_counter() - start
    ids = torch.tensor([prompt], device=device)
    options = dict(
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=0,
    )
    with torch.inference_mode():
        loaded.model.generate(ids, **(options | dict(max_new_tokens=8, min_new_tokens=8)))  # warm-up
        sync(device)
        start = time.perf_counter()
        theirs = loaded.model.generate(ids, **options)[0, len(prompt) :].tolist()
        sync(device)
        theirs_s = time.perf_counter() - start
    same = next((i for i, (a, b) in enumerate(zip(ours.token_ids, theirs)) if a != b), len(theirs))
    return {
        "quickdraft_tok_s": len(ours.token_ids) / ours_s,
        "transformers_tok_s": len(theirs) / theirs_s,
        "speedup": (len(ours.token_ids) / ours_s) / (len(theirs) / theirs_s),
        "same_prefix": same,
        "tokens": len(theirs),
        "graphs": graphs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--shapes", nargs="+", default=["default", "smollm2-1.7b", "llama3-8b"], choices=["default", *SHAPES]
    )
    parser.add_argument("--target", help="the default shape's model (default: the embedded GGUF)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--context", type=int, default=512, help="cached tokens before each timed pass")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dry-run", action="store_true", help="CPU, the tiny shape, few rows and tokens")
    parser.add_argument("--out", type=Path, default=Path("gpu-out"))
    args = parser.parse_args()
    if args.dry_run:
        args.device, args.shapes, args.rows, args.context, args.new_tokens, args.rounds = (
            "cpu",
            ["tiny"],
            [1, 2, 4],
            32,
            8,
            2,
        )
    device = torch.device(args.device)
    graphs = device.type == "cuda"
    dtype, precision = (torch.bfloat16, "bf16") if device.type == "cuda" else (torch.float32, "fp32")
    results = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": platform.node(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if graphs else platform.processor() or "cpu",
        "precision": precision,
        "context": args.context,
        "shapes": {},
    }
    for shape in args.shapes:
        print(f"== {shape}", file=sys.stderr)
        loaded = build(shape, args.target, device, dtype)
        weights = NativeWeights.from_model(loaded.model, precision, device=device, dense_kernel="linear")
        costs = pass_costs(weights, args.rows, args.context, args.rounds, graphs)
        prompt = [(3 + 11 * i) % weights.lm_head.out_features for i in range(64)]
        plain = plain_decoding(loaded, device, precision, prompt, args.new_tokens, graphs)
        results["shapes"][shape] = {"passes": costs, "plain": plain}
        del loaded, weights
        if graphs:
            torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "passes.json").write_text(json.dumps(results, indent=1))
    print(report(results))


def report(results: dict) -> str:
    lines = [
        f"{results['date']}, {results['device']}, torch {results['torch']}, {results['precision']}, "
        f"{results['context']} cached tokens",
        "",
    ]
    for shape, data in results["shapes"].items():
        own, static = data["passes"]["own_graph"], data["passes"]["static"]
        one = own[min(own)]
        lines += [
            f"### {shape}",
            "",
            f"| tokens in the pass | graph of exactly n rows, ms | x 1 row | static backend ({STATIC_ROWS} rows), ms |",
            "| --- | --- | --- | --- |",
        ]
        for n, ms in own.items():
            padded = "" if static[n] is None else f"{static[n]:.3f}"
            lines.append(f"| {n} | {ms:.3f} | {ms / one:.2f} | {padded} |")
        p = data["plain"]
        lines += [
            "",
            f"plain greedy decoding, {p['tokens']} tokens: quickdraft {p['quickdraft_tok_s']:.1f} tok/s, "
            f"transformers generate {p['transformers_tok_s']:.1f} tok/s: {p['speedup']:.2f}x "
            f"(outputs agree for the first {p['same_prefix']} tokens)",
            "",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
