"""Weights, prompts and wheels for a GPU machine, in parts small enough to travel with the working tree.

A GPU machine of this workplace gets the working tree and at most 64 MiB in all, and can download
nothing; the default target's GGUF file alone is 98 MB. So `pack` puts what benchmarks/gpu_check.sh
needs (the GGUF, the Spec-Bench prompts, the transformers and gguf wheels this project pins) in one
tar, cut into parts of --part-mib with a manifest of SHA-256 sums; each device call carries one part
(and the manifest), and `receive`, there, keeps the parts it has seen under a folder that outlives
the call (while the machine stays warm) until all have come, then checks every hash and unpacks.

Here:   .venv/bin/python benchmarks/gpu_stage.py pack            (-> .gpu-stage/, git-ignored)
        [--add FILE ...]: training files too (docs/gpu.md, "Training heads on a GPU")
There:  python3 benchmarks/gpu_stage.py receive .gpu-stage /tmp/quickdraft-stage
        (exit 0: unpacked into /tmp/quickdraft-stage/files; exit 3: parts still missing, named)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

WHEELS = ["transformers==5.24.0", "gguf==0.19.0"]  # pinned here; the machine's own hub and tokenizers satisfy them
MISSING = 3  # receive's exit code while parts are missing


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pack(files: list[Path], out: Path, part_bytes: int) -> dict:
    """files -> out/part-1, part-2, ... (a tar cut into `part_bytes` pieces) and out/manifest.json."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("part-*"):
        old.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "bundle.tar"
        with tarfile.open(bundle, "w") as tar:
            for path in files:
                tar.add(path, arcname=path.name if path.parent.name != "wheels" else f"wheels/{path.name}")
        size, parts = bundle.stat().st_size, []
        with bundle.open("rb") as handle:
            while chunk := handle.read(part_bytes):
                part = out / f"part-{len(parts) + 1}"
                part.write_bytes(chunk)
                parts.append({"name": part.name, "sha256": sha256(part), "bytes": len(chunk)})
        manifest = {
            "bundle_sha256": sha256(bundle),
            "bytes": size,
            "parts": parts,
            "files": [{"name": p.name, "sha256": sha256(p), "bytes": p.stat().st_size} for p in files],
        }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def receive(source: Path, store: Path) -> int:
    """Keep the parts carried in `source` under `store`; once all are there and their hashes hold,
    unpack them into store/files. Returns 0 (ready), MISSING or 1 (a hash failed)."""
    manifest = json.loads((source / "manifest.json").read_text())
    store.mkdir(parents=True, exist_ok=True)
    ready = store / "files" / "READY"
    if ready.is_file() and ready.read_text() == manifest["bundle_sha256"]:
        print("stage: already unpacked")
        return 0
    for part in manifest["parts"]:
        carried = source / part["name"]
        if carried.is_file():
            if sha256(carried) != part["sha256"]:
                print(f"stage: {part['name']} arrived damaged (hash differs)", file=sys.stderr)
                return 1
            shutil.copyfile(carried, store / part["name"])
    have = [p for p in manifest["parts"] if (store / p["name"]).is_file() and sha256(store / p["name"]) == p["sha256"]]
    missing = [p["name"] for p in manifest["parts"] if p not in have]
    if missing:
        print(
            f"stage: have {len(have)} of {len(manifest['parts'])} parts; carry next: "
            + ", ".join(f".gpu-stage/{name}" for name in missing)
        )
        return MISSING
    bundle = store / "bundle.tar"
    with bundle.open("wb") as out:
        for part in manifest["parts"]:
            out.write((store / part["name"]).read_bytes())
    if sha256(bundle) != manifest["bundle_sha256"]:
        print("stage: the joined bundle's hash differs from the manifest's", file=sys.stderr)
        return 1
    files = store / "files"
    with tarfile.open(bundle) as tar:
        tar.extractall(files, filter="data")
    for entry in manifest["files"]:
        found = next(files.rglob(entry["name"]))
        if sha256(found) != entry["sha256"]:
            print(f"stage: {entry['name']} differs from the manifest", file=sys.stderr)
            return 1
    bundle.unlink()
    ready.write_text(manifest["bundle_sha256"])
    print(f"stage: unpacked {len(manifest['files'])} files into {files}")
    return 0


def default_files(wheels: Path) -> list[Path]:
    """The embedded GGUF, the Spec-Bench prompts and the pinned wheels (downloaded into `wheels`)."""
    from quickdraft.bench.prompts import default_prompt_file
    from quickdraft.models import default_gguf_path

    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.12",
            "--implementation",
            "cp",
            "--platform",
            "manylinux2014_x86_64",
            "-d",
            str(wheels),
            *WHEELS,
        ],
        check=True,
    )
    prompts = default_prompt_file()
    if prompts is None:
        raise SystemExit("the Spec-Bench prompts (../shared/data/spec_bench/question.jsonl) are not here")
    return [default_gguf_path(), prompts, *sorted(wheels.glob("*.whl"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("pack", help="here: bundle, split and hash")
    make.add_argument("--out", type=Path, default=Path(".gpu-stage"))
    make.add_argument(
        "--part-mib", type=int, default=48, help="the working tree (~13 MB) plus one part stay under 64 MiB"
    )
    make.add_argument("--files", type=Path, nargs="+", help="what to bundle (default: GGUF, prompts, wheels)")
    make.add_argument(
        "--add",
        type=Path,
        nargs="+",
        default=[],
        help="more files beside the default ones (training data for `quickdraft train --device cuda`)",
    )
    take = commands.add_parser("receive", help="there: keep carried parts; unpack once all have come")
    take.add_argument("source", type=Path)
    take.add_argument("store", type=Path)
    args = parser.parse_args()
    if args.command == "pack":
        with tempfile.TemporaryDirectory() as tmp:
            files = (args.files or default_files(Path(tmp) / "wheels")) + args.add
            manifest = pack(files, args.out, args.part_mib << 20)
        print(f"{len(manifest['parts'])} parts in {args.out}: carry .gpu-stage/manifest.json and one part per call")
    else:
        raise SystemExit(receive(args.source, args.store))


if __name__ == "__main__":
    main()
