"""Write a balanced mix of training prompts from the sets in ../shared/data that carry a `kind`
and a `license` (README section "Training-prompt sets added 2026-12-02"), keeping only records
whose licence lets a shipped head read them: Apache-2.0, MIT or CC-BY, never share-alike,
non-commercial or unknown.

Each kind's records are shuffled (seeded) and the kinds interleaved in turn, so any prefix of the
file is balanced too: `quickdraft train --max-examples N` takes the first N, and a later run with
a larger N reuses the answers distilled for the smaller one. Responses are left empty:
`quickdraft train --distill` has the target answer each prompt itself.

    python scripts/licensed_mix.py --data ../shared/data --output data/licensed-mix.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections import Counter
from pathlib import Path

# (folder/file, kinds taken from it): the files with a `kind` and a `license` on every record.
FILES = {
    "opus_mt_testsets_deu/de_en.jsonl": ("translation",),
    "scitldr/abstract_tldr.jsonl": ("summarization",),
    "self_instruct/t0_train_prompts.jsonl": ("summarization", "qa", "rag"),
    "webquestions/questions.jsonl": ("qa",),
    "nq_efficientqa/questions.jsonl": ("qa",),
    "pubmedqa/pqal_rag.jsonl": ("rag",),
    "oasst_prompts/prompts.jsonl": ("chat",),
    "self_instruct/seed_tasks.jsonl": ("chat",),
}
KINDS = ("translation", "summarization", "qa", "rag", "chat")
ALLOWED = re.compile(r"^(Apache-2\.0|MIT|CC-BY-\d)")  # the licence a record's field names first
FORBIDDEN = re.compile(r"-SA|NC|unknown", re.IGNORECASE)  # share-alike, non-commercial or unclear anywhere


def shippable(license: str) -> bool:
    """Whether a record's licence lets a shipped head read it (every licence it names is permissive)."""
    return bool(ALLOWED.match(license)) and not FORBIDDEN.search(license)


def read_records(data: Path, max_chars: int) -> dict[str, list[dict]]:
    """kind -> shippable records of that kind (prompt at most max_chars), each naming its file."""
    by_kind: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    for name, kinds in FILES.items():
        for line in (data / name).read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            if record["kind"] in kinds and shippable(record["license"]) and len(record["prompt"]) <= max_chars:
                by_kind[record["kind"]].append(
                    {
                        "prompt": record["prompt"],
                        "response": "",
                        "kind": record["kind"],
                        "license": record["license"],
                        "file": name,
                    }
                )
    return by_kind


def interleave(by_kind: dict[str, list[dict]], per_kind: int, seed: int) -> list[dict]:
    """Up to per_kind records of each kind, shuffled within the kind, the kinds taken in turn."""
    rng = random.Random(seed)
    pools = []
    for kind in KINDS:
        pool = list(by_kind[kind])
        rng.shuffle(pool)
        pools.append(pool[:per_kind])
    return [pool[i] for i in range(max(map(len, pools))) for pool in pools if i < len(pool)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--output", type=Path, default=Path("data/licensed-mix.jsonl"))
    parser.add_argument("--per-kind", type=int, default=2000, help="at most this many prompts of each kind")
    parser.add_argument("--max-chars", type=int, default=4000, help="longest prompt kept, in characters")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    mix = interleave(read_records(args.data, args.max_chars), args.per_kind, args.seed)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text("".join(json.dumps(record, ensure_ascii=False) + "\n" for record in mix))
    print(f"{len(mix)} prompts in {args.output}")
    for (kind, name), count in sorted(Counter((r["kind"], r["file"]) for r in mix).items()):
        print(f"  {kind:14} {count:6}  {name}")


if __name__ == "__main__":
    main()
