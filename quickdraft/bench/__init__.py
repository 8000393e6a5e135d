"""`quickdraft bench`: which method and which K make a model fastest on given prompts, and by how much."""

from quickdraft.bench.contenders import Contender, MethodContender, RunRecord, method_contenders
from quickdraft.bench.harness import BenchResult, BenchSettings, run_bench
from quickdraft.bench.prompts import BenchPrompt, load_prompts

__all__ = [
    "BenchPrompt",
    "BenchResult",
    "BenchSettings",
    "Contender",
    "MethodContender",
    "RunRecord",
    "load_prompts",
    "method_contenders",
    "run_bench",
]
