"""A stream of requests that repeat each other: one extraction template answered as JSON over the
PubMedQA abstracts in ../shared/data/pubmedqa (MIT licence; its README), run in order through
`quickdraft bench --in-order` so suffix decoding's pool learns from the answers before (issue 63).

Every request asks the same thing of another abstract: a JSON record with fixed keys. What repeats
from one answer to the next is the record's frame (keys, quotes, braces, recurring phrases); what
changes is copied from the abstract (prompt lookup's strength) or new. The stream's file is written
under --output and kept beside the report.

Run:  .venv/bin/python benchmarks/extraction_stream.py [--requests 64] [--max-new-tokens 128]
      [--methods prompt-lookup suffix] [--output bench-out/extraction-stream]
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2] / "shared" / "data" / "pubmedqa" / "pqal_rag.jsonl"
TEMPLATE = (
    "Study: {abstract}\n\nQuestion: {question}\n\n"
    'Reply with a JSON object with the keys "question", "design", "participants", "finding" and "answer" '
    "(yes, no or maybe), like:\n"
    '{{"question": "...", "design": "...", "participants": "...", "finding": "...", "answer": "..."}}'
)


def abstract_and_question(prompt: str) -> tuple[str, str]:
    """A PubMedQA record's prompt (one of its three wordings) -> (abstract, question)."""
    header = "Read the following abstract and answer the question.\n\n"
    if prompt.startswith(header):
        abstract, _, question = prompt[len(header) :].rpartition("\n\nQuestion: ")
    elif "\n\nBased on the passage above, " in prompt:
        abstract, _, question = prompt.rpartition("\n\nBased on the passage above, ")
    else:
        abstract, _, question = prompt.rpartition("\n")
    return abstract.strip(), question.strip()


def write_stream(path: Path, requests: int, source: Path = SOURCE) -> Path:
    """The first `requests` abstracts as Spec-Bench-style JSONL, category "extraction", in file order."""
    records = [json.loads(line) for line in source.read_text().splitlines() if line.strip()][:requests]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for number, record in enumerate(records, start=1):
            abstract, question = abstract_and_question(record["prompt"])
            turn = TEMPLATE.format(abstract=abstract, question=question)
            out.write(json.dumps({"question_id": number, "category": "extraction", "turns": [turn]}) + "\n")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--methods", nargs="+", default=["prompt-lookup", "suffix"])
    parser.add_argument("--target", help="default: the embedded target")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--output", type=Path, default=Path("bench-out/extraction-stream"))
    args = parser.parse_args()

    import quickdraft
    from quickdraft.bench.bench_command import bench

    stream = write_stream(args.output / "stream.jsonl", args.requests)
    decoder = quickdraft.load(args.target, None, "none", backend=args.backend)
    paths = bench(
        decoder,
        args.methods,
        args.output,
        data=stream,
        per_category=args.requests,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        peers=(),
        batch=0,
        in_order=True,
        command=shlex.join([sys.executable.rsplit("/", 1)[-1], *sys.argv]),
    )
    report = paths["report"].read_text()
    print(report[report.index("## By request") :].split("\n## Plots")[0])
    print("wrote " + ", ".join(str(path) for path in paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
