"""`quickdraft generate | bench | serve | train | export-head | plan | analyze`: speculative decoding from
the command line."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from quickdraft.analysis import best_k, expected_tokens_per_pass, predicted_speedup, time_per_token
from quickdraft.errors import QuickdraftError
from quickdraft.flags import add_flag, add_option_flags, given_options
from quickdraft.methods import METHODS
from quickdraft.options import OPTION
from quickdraft.serve.connections import BODY_SECONDS, HEADER_SECONDS, PER_CLIENT
from quickdraft.settings import RUN, SAMPLING, SAMPLING_SETTINGS

if TYPE_CHECKING:
    from quickdraft.backends.select import Choice
    from quickdraft.memory import ModelShape
    from quickdraft.serve.launch import ServerSettings

DEMO_PROMPT = "Write a Python function that checks whether a number is prime."


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="quickdraft", description="Lossless speculative decoding.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for add_command in (
        add_generate_command,
        add_bench_command,
        add_serve_command,
        add_train_command,
        add_export_head_command,
        add_plan_command,
        add_analyze_command,
    ):
        add_command(commands)
    return parser


def add_generate_command(commands: argparse._SubParsersAction) -> None:
    """`quickdraft generate`: one prompt, printed as it is decoded."""
    gen = commands.add_parser("generate", help="generate text from a prompt")
    gen.add_argument("prompt", nargs="?", help="the prompt (default: standard input, else a demo prompt)")
    add_flag(gen, RUN["target"])
    add_flag(gen, RUN["draft"])
    add_flag(gen, RUN["method"], f"methods: {', '.join(METHODS)}; default: the fastest available")
    for setting in SAMPLING_SETTINGS:
        if setting.name != "logprobs":  # the library's and the server's; generate prints no logprobs
            add_flag(gen, setting)
    add_option_flags(gen)
    add_flag(gen, RUN["threads"])
    gen.add_argument("--verbose", action="store_true", help="print each step's drafted and accepted text")
    gen.add_argument("--json", action="store_true", help="print one JSON object")


def add_bench_command(commands: argparse._SubParsersAction) -> None:
    """`quickdraft bench`: methods and peers timed side by side."""
    bench = commands.add_parser("bench", help="time methods and peers side by side; report, JSON, plots")
    add_flag(bench, RUN["target"])
    add_flag(bench, RUN["draft"], "for method draft and transformers' assistant_model")
    bench.add_argument(
        "--methods",
        nargs="+",
        default=["all"],
        help="METHOD[:key=value,...] specs, or all (default); a value a/b/c runs each, "
        "e.g. prompt-lookup:k=2/4/8,draft_length=fixed",
    )
    bench.add_argument(
        "--data",
        type=Path,
        help="Spec-Bench-style JSONL (default: ../shared/data/spec_bench/question.jsonl when "
        "present, else a built-in set)",
    )
    bench.add_argument("--categories", nargs="+", help="categories to run (default: all in the file)")
    bench.add_argument("--per-category", type=int, help="prompts per category (default 10; --quick: 1)")
    add_flag(bench, SAMPLING["max_new_tokens"], "--quick: 48", declared_default=False)
    add_flag(bench, SAMPLING["temperature"], "at 0 the bench also checks that the outputs are equal")
    add_flag(bench, SAMPLING["seed"], "every prompt and contender samples with it")
    bench.add_argument("--repeats", type=int, default=1, help="timed runs of each prompt per contender")
    bench.add_argument(
        "--peers",
        nargs="+",
        choices=["transformers", "llama.cpp"],
        default=["transformers", "llama.cpp"],
        help="peer libraries to time (llama.cpp: when llama-cpp-python is installed and the target is a GGUF file)",
    )
    bench.add_argument(
        "--batch",
        type=int,
        help="each method also decodes the prompts this many at a time in shared passes; the report counts "
        "outputs that differ from alone (0: no batched run; default 4)",
    )
    bench.add_argument(
        "--in-order",
        action="store_true",
        help="run the prompts in the file's order as one stream of requests: each method learns from the "
        "outputs before (suffix decoding); the report adds tokens per pass and speedup by request",
    )
    bench.add_argument("--no-peers", action="store_true", help="leave out every peer")
    bench.add_argument("--quick", action="store_true", help="1 prompt per category, 48 tokens: a few minutes")
    add_option_flags(bench, model_only=True)
    add_flag(bench, RUN["threads"])
    bench.add_argument("--output", type=Path, default=Path("bench-out/bench"), help="folder for the outputs")


def add_serve_command(commands: argparse._SubParsersAction) -> None:
    """`quickdraft serve`: the OpenAI-compatible server."""
    serve = commands.add_parser("serve", help="an OpenAI-compatible HTTP server with batched speculation")
    add_flag(serve, RUN["target"])
    add_flag(serve, RUN["draft"])
    add_flag(serve, RUN["method"], "the server's default; requests may choose their own")
    serve.add_argument("--model-name", help="the model id clients send (default: the target's name)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--max-batch", type=int, default=8, help="sequences decoded together")
    serve.add_argument("--max-queue", type=int, default=64, help="requests waiting beyond those (then 429)")
    serve.add_argument("--max-tokens-limit", type=int, default=2048, help="the largest max_tokens accepted")
    serve.add_argument("--max-body-bytes", type=int, default=2 << 20, help="larger request bodies get a 413")
    serve.add_argument(
        "--drain-seconds",
        type=float,
        default=30.0,
        help="on shutdown, how long running requests may finish (then they end with a 503)",
    )
    serve.add_argument(
        "--header-seconds",
        type=float,
        default=HEADER_SECONDS,
        help="a request's headers must arrive within this after connecting or the last answer (then 408)",
    )
    serve.add_argument(
        "--body-seconds", type=float, default=BODY_SECONDS, help="a request's body must arrive within this (then 408)"
    )
    serve.add_argument(
        "--max-connections-per-client",
        type=int,
        default=PER_CLIENT,
        help="connections open at once from one client address (more are refused with a 429)",
    )
    serve.add_argument(
        "--api-key",
        action="append",
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' (repeatable: any of them; default: $QUICKDRAFT_API_KEY; "
        "unset: open). Suffix decoding drafts from the same key's earlier outputs only",
    )
    serve.add_argument(
        "--share-across-keys",
        action="store_true",
        help="suffix decoding: every request drafts from every key's earlier outputs (how fast a request "
        "runs then tells what others were sent; for one user's keys)",
    )
    serve.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name to answer besides the bound address (repeatable; e.g. behind a proxy)",
    )
    add_option_flags(serve)
    add_flag(serve, RUN["threads"], "with --ray: per replica, which reserves as many cores")
    on_ray = serve.add_argument_group("past one machine (Ray Serve; docs/scaling.md)")
    on_ray.add_argument("--ray", action="store_true", help="serve as a Ray Serve application (replicas, autoscaling)")
    on_ray.add_argument("--replicas", type=int, metavar="N", help="replicas, each with its own model (default 1)")
    on_ray.add_argument("--autoscale", metavar="MIN:MAX", help="Serve's autoscaling on ongoing requests")
    on_ray.add_argument(
        "--address", help="join this Ray cluster (e.g. HEAD_IP:6379; default: start a local one for the command)"
    )


def add_train_command(commands: argparse._SubParsersAction) -> None:
    """`quickdraft train`: an EAGLE or Medusa head for a target."""
    train = commands.add_parser("train", help="train a draft head (EAGLE or Medusa) on the target's hidden states")
    train.add_argument("kind", choices=["eagle", "medusa"])
    add_flag(train, RUN["target"])
    train.add_argument(
        "--data",
        type=Path,
        nargs="+",
        required=True,
        help="training files: alpaca-style JSON, JSONL (question/answer, prompt/response, "
        "text) or plain .txt; evaluation sets are refused",
    )
    train.add_argument("--output", type=Path, required=True, help="folder for the checkpoint and the head")
    train.add_argument(
        "--cache",
        type=Path,
        help="folder for self-distilled text and features, shareable between kinds (default: OUTPUT/cache)",
    )
    train.add_argument(
        "--distill",
        type=int,
        metavar="TOKENS",
        help="replace responses by the target's own greedy ones, up to TOKENS tokens",
    )
    train.add_argument(
        "--answers",
        type=Path,
        metavar="FOLDER",
        help="with --distill: folder that keeps the target's answers, one file per target and TOKENS, "
        "read first so only new prompts run (default: the cache; the default target's are in data/answers)",
    )
    train.add_argument(
        "--distill-examples",
        type=int,
        metavar="N",
        nargs="+",
        help="with --distill: only the first N examples of each file (the rest keep their "
        "text); one N, or one per --data file",
    )
    train.add_argument(
        "--distill-batch",
        type=int,
        metavar="N",
        help="with --distill: prompts answered at once (default: 16 on llama.cpp, 64 on a CPU, 256 on a GPU)",
    )
    train.add_argument(
        "--feature-batch",
        type=int,
        metavar="TOKENS",
        help="padded tokens of one feature-extraction pass (default: one example a pass on a "
        "CPU, where batches measured slower; 16384 on a GPU)",
    )
    train.add_argument(
        "--eagle",
        type=int,
        choices=[1, 3],
        default=3,
        help="eagle: 3 fuses low, middle and high target layers and trains unrolled (default); "
        "1 reads the last hidden state",
    )
    train.add_argument(
        "--init",
        type=Path,
        metavar="HEAD",
        help="eagle 3: fine-tune this head folder (its weights and draft vocabulary, widened to "
        "--vocab where that is larger; e.g. quickdraft/heads/shipped/<target>/eagle) instead of starting "
        "from the target's layers",
    )
    train.add_argument("--unroll", type=int, default=4, help="eagle 3: steps unrolled on the head's own outputs")
    train.add_argument(
        "--head-layers",
        type=int,
        default=1,
        metavar="N",
        help="eagle 3: decoder layers of the head (default 1; more guess better and draft slower; "
        "with --init, layers the head lacks are added)",
    )
    train.add_argument("--context", type=int, default=128, help="eagle 3: prompt tokens kept before a response")
    train.add_argument(
        "--prompt-rows",
        type=float,
        default=0.0,
        metavar="WEIGHT",
        help="eagle 3: also learn the target's choices on prompt rows, each weighted WEIGHT against a "
        "response row's 1 (0: responses only; the features need the prompts' choices, see "
        "scripts/prompt_choices.py)",
    )
    train.add_argument("--heads", type=int, default=3, help="medusa: number of heads")
    train.add_argument("--steps", type=int, default=2000)
    train.add_argument("--positions", type=int, default=256, help="medusa: sampled positions per step")
    train.add_argument("--sequences", type=int, default=8, help="eagle: sequences per step")
    train.add_argument("--window", type=int, default=256, help="eagle: longest stretch of a sequence per step")
    train.add_argument("--vocab", type=int, default=8192, help="draft vocabulary: most frequent response tokens")
    train.add_argument("--lr", type=float, default=1e-3)
    train.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16"],
        default="auto",
        help="a training step's arithmetic: bf16 autocast (fp32 weights) or fp32; auto: the "
        "faster here, timed on the run's own batches once per machine",
    )
    train.add_argument(
        "--schedule",
        choices=["constant", "cosine"],
        default="constant",
        help="learning rate over the steps: constant, or cosine (warm-up, then down to a tenth)",
    )
    train.add_argument(
        "--max-examples",
        type=int,
        nargs="+",
        metavar="N",
        help="use the first N examples of each file (one N, or one per --data file)",
    )
    train.add_argument("--max-tokens", type=int, default=512, help="tokens per example (prompt + response)")
    add_flag(train, RUN["threads"])
    train.add_argument(
        "--device",
        default="auto",
        help="auto (a CUDA GPU when present, else the CPU), cpu or cuda (cuda:N): where the target "
        "distils and extracts features and the head trains",
    )
    train.add_argument(
        "--target-precision",
        choices=["fp32", "bf16", "int8", "int4"],
        help="what the target computes at while it distils and extracts features, on the native "
        "backend (default: a GGUF file on llama.cpp where it returns inner layers, else the "
        "checkpoint's own where the native backend has it: bf16 stays bf16, a GGUF file fp32)",
    )


def add_export_head_command(commands: argparse._SubParsersAction) -> None:
    """`quickdraft export-head`: a head in vLLM's or SGLang's layout."""
    export = commands.add_parser("export-head", help="write an EAGLE-3 head as a vLLM or SGLang draft model")
    export.add_argument(
        "--head", type=Path, help="folder of an EAGLE-3 head (default: the eagle head shipped for the target)"
    )
    add_flag(export, RUN["target"], "the one the head was trained for; only its config or GGUF header is read")
    export.add_argument("--format", required=True, metavar="{vllm,sglang}", help="the engine whose layout to write")
    export.add_argument("--output", type=Path, required=True, help="folder for config.json and model.safetensors")


def add_plan_command(commands: argparse._SubParsersAction) -> None:
    """`quickdraft plan`: the memory plan, without loading weights."""
    plan = commands.add_parser(
        "plan", help="will the target, the draft and the caches fit? (reads config or GGUF headers; loads no weights)"
    )
    add_flag(plan, RUN["target"])
    add_flag(plan, RUN["draft"])
    plan.add_argument("--head", help="folder of an EAGLE or Medusa head (its file size counts as the draft)")
    plan.add_argument("--max-batch", type=int, default=1, help="sequences decoded together")
    plan.add_argument(
        "--shared-tokens",
        type=int,
        default=0,
        metavar="N",
        help="suffix decoding: tokens of earlier outputs kept per tenant (its shared_tokens option; default 0)",
    )
    plan.add_argument(
        "--context",
        type=int,
        help="tokens per sequence (default: the target's context length; llama.cpp: its one "
        "pool's cells, at most 4096 unless --context says)",
    )
    plan.add_argument("--memory", help="what there is, e.g. 8GiB: say whether it fits and what to cut")
    add_flag(plan, OPTION["backend"], "auto is chosen as generate chooses it, without timing anything")
    add_flag(plan, OPTION["precision"])
    plan.add_argument("--device", choices=["cpu", "cuda"], default="cpu")


def add_analyze_command(commands: argparse._SubParsersAction) -> None:
    """`quickdraft analyze`: the cost model's predictions."""
    analyze = commands.add_parser("analyze", help="expected tokens per pass, predicted speedup, best K")
    analyze.add_argument("--alpha", type=float, help="acceptance rate per draft token")
    analyze.add_argument("--k", type=int, help="draft tokens per step")
    analyze.add_argument(
        "--cost-ratio", type=float, default=0.05, help="draft time per token / target time per pass (default 0.05)"
    )
    analyze.add_argument(
        "--verify-ratio", type=float, default=1.0, help="target pass time with K drafts / with none (default 1)"
    )
    analyze.add_argument("--k-max", type=int, default=16)
    analyze.add_argument("--plot", help="also write a PNG of predicted speedup vs K to this path")


class OneLineParser(argparse.ArgumentParser):
    """Usage errors in one line, like every other quickdraft error (`--help` still shows the usage)."""

    def error(self, message: str) -> None:
        print(f"quickdraft: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # --help (0) or a usage error (2, already printed)
        return int(exit_.code or 0)
    args.argv = sys.argv[1:] if argv is None else list(argv)  # kept in bench reports
    try:
        if args.command == "analyze":
            return _analyze(args)
        if args.command == "bench":
            return _bench(args)
        if args.command == "serve":
            return _serve(args)
        if args.command == "train":
            return _train(args)
        if args.command == "plan":
            return _plan(args)
        if args.command == "export-head":
            return _export_head(args)
        return _generate(args)
    except QuickdraftError as error:
        print(f"quickdraft: error: {error}", file=sys.stderr)
        return 2


def _plan(args: argparse.Namespace) -> int:
    """Print the memory report for a setting; with --memory, whether it fits (exit 0) or not (exit 1)
    and what to cut."""
    from quickdraft.memory import fit_advice, parse_bytes, plan_memory, read_shape

    if args.max_batch < 1:
        raise QuickdraftError(f"--max-batch must be >= 1, got {args.max_batch}")
    if args.context is not None and args.context < 1:
        raise QuickdraftError(f"--context must be >= 1, got {args.context}")
    budget = parse_bytes(args.memory) if args.memory else None
    target = read_shape(args.target)
    draft = read_shape(args.draft) if args.draft else None
    head = sum(f.stat().st_size for f in Path(args.head).glob("*.safetensors")) if args.head else 0
    choice = planned_choice(target, args.backend, args.precision, args.device)
    backend, precision = choice.kind, choice.precision
    if args.context is not None and args.context > target.context:
        raise QuickdraftError(f"--context {args.context} is over {target.name}'s context length {target.context}")
    report = plan_memory(
        target,
        draft,
        backend=backend,
        precision=precision,
        device=args.device,
        max_batch=args.max_batch,
        context=args.context,
        head_bytes=head,
        pool_tokens=OPTION["shared_tokens"].check(args.shared_tokens),
    )
    print(
        f"{target.name} on the {backend} backend, {precision}, "
        f"{args.device}" + (f", draft {draft.name}" if draft else "") + (f", head {args.head}" if head else "")
    )
    print("\n".join(report.lines()))
    print(f"backend {args.backend}: {choice.reason}")
    if budget is None:
        return 0
    fits, advice = fit_advice(report, budget, target, draft, backend, precision, args.device, head)
    print("\n".join(advice))
    return 0 if fits else 1


def planned_choice(
    target: ModelShape, backend: str, precision: str | None, device: str, cache_dir: str | os.PathLike | None = None
) -> Choice:
    """The backend `generate` would choose for `target` (backends/select.py's one rule), without
    timing anything: auto's llama.cpp-or-native verdict is the one kept on this machine, else the
    default the first load keeps unless native is clearly faster."""
    import torch

    from quickdraft.backends.choice import planned_verdict
    from quickdraft.backends.select import choice_signature, choose_backend, default_precision, shapes_folder

    where = torch.device(device)  # planned for, not necessarily present here

    def verdict():
        return planned_verdict(shapes_folder(cache_dir), choice_signature(target.gguf, default_precision(where)))

    return choose_backend(
        target.config, target.gguf, target.name, backend, precision, where, stored=target.stored, verdict=verdict
    )


def _export_head(args: argparse.Namespace) -> int:
    """Export an EAGLE-3 head (reads the target's sizes only) and print how to serve it."""
    from quickdraft.heads.export import check_format, export_head
    from quickdraft.heads.store import SHIPPED
    from quickdraft.memory import read_shape

    check_format(args.format)
    target = read_shape(args.target)
    folder = args.head if args.head is not None else SHIPPED / target.name / "eagle"
    if args.head is None and not folder.is_dir():
        raise QuickdraftError(f"no eagle head is shipped for {target.name!r}; pass --head DIR")
    output = export_head(folder, args.output, args.format, target)
    print(
        f"wrote {output / 'config.json'} and {output / 'model.safetensors'}: the EAGLE-3 head in {folder} "
        f"as a {args.format} draft model for {target.name}"
    )
    print("\n".join(serve_commands(args.target or DEFAULT_HUB_ID, output.resolve(), args.format)))
    return 0


DEFAULT_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the embedded default target's own weights
ENGINES = {"vllm": "vLLM", "sglang": "SGLang"}


def serve_commands(target: str, output: Path, fmt: str) -> list[str]:
    """How to serve `target` with the draft model in `output` (fmt's layout), and with the other engine."""
    other = "sglang" if fmt == "vllm" else "vllm"
    return [
        f"serve it with {ENGINES[fmt]}:",
        "  " + serve_command(fmt, target, str(output)),
        f"for {ENGINES[other]}, export again with --format {other} --output OUT (the engines number the "
        "fused target layers differently), then:",
        "  " + serve_command(other, target, "OUT"),
    ]


def serve_command(fmt: str, target: str, draft: str) -> str:
    """The vLLM or SGLang command line serving `target` with the EAGLE-3 draft model in `draft`."""
    if fmt == "vllm":
        spec = json.dumps({"method": "eagle3", "model": draft, "num_speculative_tokens": 3})
        return f"vllm serve {shlex.quote(target)} --speculative-config {shlex.quote(spec)}"
    return (
        f"python -m sglang.launch_server --model-path {shlex.quote(target)} --speculative-algorithm EAGLE3 "
        f"--speculative-draft-model-path {shlex.quote(draft)} --speculative-num-steps 3 "
        "--speculative-eagle-topk 4 --speculative-num-draft-tokens 16"
    )


def _read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        return args.prompt
    if not sys.stdin.isatty():
        text = sys.stdin.read().strip()
        if text:
            return text
    return DEMO_PROMPT


def _set_threads(threads: int | None) -> None:
    import torch

    if threads is not None:  # checked by its declaration when the flag was parsed
        torch.set_num_threads(threads)  # process-wide by nature: set once, here, by the user


def _train(args: argparse.Namespace) -> int:
    from quickdraft.backends.select import resolve_device
    from quickdraft.training.loop import TrainSettings
    from quickdraft.training.train_command import train

    _set_threads(args.threads)
    settings = TrainSettings(
        steps=args.steps,
        positions=args.positions,
        sequences=args.sequences,
        window=args.window,
        lr=args.lr,
        vocab=args.vocab,
        unroll=args.unroll,
        context=args.context,
        prompt_rows=args.prompt_rows,
        schedule=args.schedule,
        device=str(resolve_device(args.device)),
        precision=args.precision,
    )
    for flag in ("steps", "positions", "sequences", "window", "vocab", "heads", "unroll"):
        if getattr(args, flag) < 1:
            raise QuickdraftError(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    result = train(
        args.kind,
        args.target,
        args.data,
        args.output,
        heads=args.heads,
        head_layers=args.head_layers,
        max_examples=_one_or_each(args.max_examples),
        max_tokens=args.max_tokens,
        distill_tokens=args.distill,
        distill_examples=_one_or_each(args.distill_examples),
        cache=args.cache,
        answers=args.answers,
        settings=settings,
        eagle=args.eagle,
        distill_batch=args.distill_batch,
        feature_batch=args.feature_batch,
        target_precision=args.target_precision,
        init=args.init,
    )
    top1 = ", ".join(f"{a:.1%}" for a in result["held_out_top1"])
    kind = (
        "held-out top-1 (teacher-forced)"
        if len(result["held_out_top1"]) == 1 or args.kind == "medusa"
        else "held-out top-1 by draft depth"
    )
    print(
        f"trained a {args.kind} head for {result['target']} in {result['steps']} steps; {kind} {top1}; "
        f"draft vocabulary {result['draft_vocab']} tokens covering "
        f"{result['draft_vocab_coverage']:.1%}; saved in {args.output}"
    )
    return 0


def _one_or_each(values: list[int] | None) -> int | list[int] | None:
    """A flag given once applies to every file; given several times, one value per file."""
    return values[0] if values is not None and len(values) == 1 else values


def _bench(args: argparse.Namespace) -> int:
    import quickdraft
    from quickdraft.bench.bench_command import bench
    from quickdraft.bench.harness import BenchSettings

    _set_threads(args.threads)
    if args.per_category is not None and args.per_category < 1:
        raise QuickdraftError(f"--per-category must be >= 1, got {args.per_category}")
    BenchSettings(1, args.temperature, args.repeats, args.seed).check()  # before loading anything
    if args.batch is not None and args.batch < 0:
        raise QuickdraftError(f"--batch must be >= 0, got {args.batch}")
    decoder = quickdraft.load(args.target, args.draft, "none", **given_options(args))
    paths = bench(
        decoder,
        args.methods,
        args.output,
        args.data,
        args.categories,
        args.per_category,
        args.max_new_tokens,
        args.temperature,
        args.repeats,
        seed=args.seed,
        peers=() if args.no_peers else tuple(args.peers),
        quick=args.quick,
        command=shlex.join(["quickdraft", *args.argv]),
        **({"batch": args.batch} if args.batch is not None else {}),
        in_order=args.in_order,
    )
    report = paths["report"].read_text()
    print(report[: report.index("\n## ", report.index("## overall") + 1)].rstrip())  # header + overall table
    print("\nwrote " + ", ".join(str(path) for path in paths.values()))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from quickdraft.serve.gate import allowed_hosts
    from quickdraft.serve.launch import ServerSettings

    settings = ServerSettings(
        target=args.target,
        draft=args.draft,
        method=args.method,
        options=given_options(args),
        model_name=args.model_name,
        max_batch=args.max_batch,
        max_queue=args.max_queue,
        max_tokens_limit=args.max_tokens_limit,
        drain_seconds=args.drain_seconds,
        header_seconds=args.header_seconds,
        body_seconds=args.body_seconds,
        max_connections_per_client=args.max_connections_per_client,
        max_body_bytes=args.max_body_bytes,
        api_key=tuple(args.api_key or filter(None, [os.environ.get("QUICKDRAFT_API_KEY")])) or None,
        share_across_keys=args.share_across_keys,
        allowed_hosts=allowed_hosts(args.host, args.allowed_host),
        threads=args.threads,
    )
    if args.ray:
        return _serve_on_ray(args, settings)
    if args.replicas is not None or args.autoscale is not None or args.address is not None:
        raise QuickdraftError("--replicas, --autoscale and --address need --ray")
    return _serve_here(args, settings)


def _serve_here(args: argparse.Namespace, settings: ServerSettings) -> int:
    """`quickdraft serve`: one process, in the foreground."""
    from quickdraft.memory import loaded_memory
    from quickdraft.serve.background import DrainingServer
    from quickdraft.serve.launch import load_decoder, server_app

    _set_threads(args.threads)
    decoder = load_decoder(settings)
    app = server_app(settings, decoder)
    print(
        "\n".join(
            [
                "quickdraft: memory at --max-batch sequences (also at /metrics):",
                *loaded_memory(decoder, args.max_batch).lines(),
            ]
        ),
        file=sys.stderr,
    )
    print(
        f"quickdraft: serving {args.model_name or decoder.target.name} ({decoder.method}, k={decoder.k}) "
        f"on http://{args.host}:{args.port}/v1" + (" (API key required)" if settings.api_key else ""),
        file=sys.stderr,
    )
    DrainingServer(app, args.host, args.port, settings.connection_limits).run()
    return 0


def _serve_on_ray(args: argparse.Namespace, settings: ServerSettings) -> int:
    """`quickdraft serve --ray`: replicas on a Ray cluster (a local one unless --address names one)."""
    try:
        from quickdraft.serve import ray as on_ray
    except ImportError as error:
        raise QuickdraftError(f"--ray needs Ray Serve ({error}): pip install 'quickdraft[ray]'") from None
    scaling = on_ray.Scaling(
        replicas=1 if args.replicas is None else args.replicas,
        autoscale=on_ray.parse_autoscale(args.autoscale) if args.autoscale else None,
    )
    where = f"the Ray cluster at {args.address}" if args.address else "a local Ray cluster"
    print(f"quickdraft: starting {scaling.most} replica(s) on {where} (model files must be readable on every node)")
    try:
        url = on_ray.start(settings, scaling, args.host, args.port, args.address)
        print(
            f"quickdraft: serving on {url}/v1 with Ray Serve "
            + (f"(autoscaling {args.autoscale})" if args.autoscale else f"({scaling.replicas} replica(s))")
            + (" (API key required)" if settings.api_key else ""),
            file=sys.stderr,
        )
        on_ray.wait_for_signal()
    finally:
        on_ray.stop(owns_cluster=args.address is None)
    return 0


def _generate(args: argparse.Namespace) -> int:
    import quickdraft  # deferred: argument errors and --help stay instant

    prompt = _read_prompt(args)
    _set_threads(args.threads)
    decoder = quickdraft.load(args.target, args.draft, args.method, **given_options(args))
    if args.verbose and not args.json:
        from quickdraft.memory import loaded_memory

        print(
            "\n".join([f"backend: {decoder.backend_reason}", "memory:", *loaded_memory(decoder).lines()]),
            file=sys.stderr,
        )
    generation = decoder.start(
        prompt,
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop=args.stop,
        chat=args.chat,
        text=True,
    )
    streaming = not args.json and not args.verbose
    for step in generation:
        if args.verbose and not args.json:
            print(describe_step(decoder, step), flush=True)
        elif streaming:  # the text that is final (a stop string can no longer claim it)
            print(generation.text.delta(), end="", flush=True)
    out = decoder.finish(generation)
    if args.json:
        print(json.dumps(out.to_dict() | {"method": decoder.method, "k": decoder.k}))
        return 0
    print(generation.text.delta() if streaming else out.text)  # the rest, or all of it after the step lines
    print(
        f"[{decoder.method}, k={decoder.k}, {decoder.draft_length} K, {decoder.precision}] {out.stats.summary()}",
        file=sys.stderr,
    )
    if decoder.calibration:
        speeds = ", ".join(f"{depth} layers {speed:.1f} tok/s" for depth, speed in decoder.calibration.items())
        print(f"self-spec calibration: {speeds}; chose {decoder.config.layers}", file=sys.stderr)
    if args.verbose and out.stats.drafted_tokens and not METHODS[decoder.method].drafts_trees:
        print(predicted_line(out.stats), file=sys.stderr)
    return 0


def predicted_line(stats) -> str:
    """What the closed-form model predicts from this generation's measured alpha, K and times."""
    passes = stats.target_passes
    k = stats.drafted_tokens / passes
    t_draft = stats.draft_time / stats.drafted_tokens
    t_pass = stats.verify_time / passes
    alpha = min(stats.acceptance_rate, 0.999)
    k_int = max(1, round(k))
    cost_ratio = t_draft / t_pass
    speedup = predicted_speedup(alpha, k_int, cost_ratio)
    best = best_k(alpha, cost_ratio, 16)
    return (
        f"predicted: {expected_tokens_per_pass(alpha, k_int):.2f} tokens per pass (measured "
        f"{stats.mean_accepted_tokens:.2f}) and {speedup:.2f}x over plain decoding at alpha={alpha:.2f}, "
        f"K={k_int}, cost ratio {cost_ratio:.3f} (verify cost taken as flat; "
        f"quickdraft bench measures the speedup); best K for these: {best}"
    )


def _analyze(args: argparse.Namespace) -> int:
    if (args.alpha is None) != (args.k is None):
        raise QuickdraftError("give both --alpha and --k, or neither for the default table")
    cases = (
        [(args.alpha, args.k)] if args.alpha is not None else [(alpha, k) for alpha in (0.5, 0.7, 0.9) for k in (4, 8)]
    )
    for alpha, k in cases:
        if not 0.0 <= alpha <= 1.0 or k < 1:
            raise QuickdraftError("--alpha must be in [0, 1] and --k >= 1")
    c, v = args.cost_ratio, args.verify_ratio
    print(f"cost ratio c = {c} (draft token / target pass), verify ratio {v}; E = (1 - a^(K+1)) / (1 - a)")
    print(f"{'alpha':>6} {'K':>3} {'E tokens/pass':>14} {'time/token':>11} {'speedup':>8} {'best K':>7}")
    for alpha, k in cases:
        e = expected_tokens_per_pass(alpha, k)
        print(
            f"{alpha:>6.2f} {k:>3d} {e:>14.3f} {time_per_token(alpha, k, c, v):>11.3f} "
            f"{predicted_speedup(alpha, k, c, v):>7.2f}x {best_k(alpha, c, args.k_max):>7d}"
        )
    print("time/token is in units of one plain target pass; speedup = 1 / time/token.")
    if args.plot:
        from quickdraft.plots import plot_speedup_vs_k

        alphas = sorted({alpha for alpha, _ in cases} | {0.5, 0.7, 0.9})
        print(f"wrote {plot_speedup_vs_k(args.plot, alphas, c, v, args.k_max)}")
    return 0


def describe_step(decoder, step) -> str:
    """One line per target pass: what was drafted, what survived, and the token the target added."""
    drafted = decoder.decode(step.draft_tokens)
    accepted = decoder.decode(step.draft_tokens[: step.accepted])
    kind = "bonus" if step.bonus else "recovered"
    if not step.draft_tokens:
        return f"Target: {decoder.decode([step.next_token])!r}"
    return (
        f"Drafted: {drafted!r}  Accepted: {accepted!r} ({step.accepted}/{len(step.draft_tokens)})"
        f"  {kind.capitalize()}: {decoder.decode([step.next_token])!r}"
    )


if __name__ == "__main__":
    sys.exit(main())
