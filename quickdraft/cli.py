"""`quickdraft generate`: speculative decoding from the command line."""

from __future__ import annotations

import argparse
import json
import sys

from quickdraft.errors import QuickdraftError
from quickdraft.methods import METHODS

DEMO_PROMPT = "Write a Python function that checks whether a number is prime."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quickdraft", description="Lossless speculative decoding.")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="generate text from a prompt")
    gen.add_argument("prompt", nargs="?", help="the prompt (default: standard input, else a demo prompt)")
    gen.add_argument("--target", help="hub id, folder or .gguf file (default: the embedded SmolLM2-135M-Instruct)")
    gen.add_argument("--draft", help="draft model: hub id, folder or .gguf file")
    gen.add_argument("--method", choices=list(METHODS), help="drafting method (default: the fastest available)")
    gen.add_argument("--k", type=int, help="draft tokens per step (default depends on the method)")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    gen.add_argument("--top-k", type=int)
    gen.add_argument("--top-p", type=float)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--stop", action="append", help="stop string (repeatable)")
    gen.add_argument("--max-ngram", type=int, default=3, help="prompt lookup: longest n-gram to match")
    gen.add_argument("--min-ngram", type=int, default=2, help="prompt lookup: shortest n-gram to match")
    gen.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                     help="apply the chat template (default: when the model has one)")
    gen.add_argument("--verbose", action="store_true", help="print each step's drafted and accepted text")
    gen.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _generate(args)
    except QuickdraftError as error:
        print(f"quickdraft: error: {error}", file=sys.stderr)
        return 2


def _read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        return args.prompt
    if not sys.stdin.isatty():
        text = sys.stdin.read().strip()
        if text:
            return text
    return DEMO_PROMPT


def _generate(args: argparse.Namespace) -> int:
    import quickdraft  # deferred: argument errors and --help stay instant

    prompt = _read_prompt(args)
    decoder = quickdraft.load(args.target, args.draft, args.method, args.k,
                              max_ngram=args.max_ngram, min_ngram=args.min_ngram)
    options = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                   seed=args.seed, stop=args.stop, chat=args.chat)
    generation = decoder.start(prompt, args.max_new_tokens, **options)
    printed = ""
    for step in generation:
        if args.verbose and not args.json:
            print(describe_step(decoder, step), flush=True)
        elif not args.json:
            # Stream: print whatever text the new tokens completed (stop strings are cut at the end).
            text = decoder.decode(generation.new_tokens)
            if text.startswith(printed) and not args.stop:
                print(text[len(printed):], end="", flush=True)
                printed = text
    out = decoder.finish(generation, args.stop)
    if args.json:
        print(json.dumps(out.to_dict() | {"method": decoder.method, "k": decoder.k}))
        return 0
    if args.verbose or args.stop or out.text != printed:
        print(out.text[len(printed):] if out.text.startswith(printed) else "\n" + out.text, end="")
    print()
    print(f"[{decoder.method}, k={decoder.k}] {out.stats.summary()}", file=sys.stderr)
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
