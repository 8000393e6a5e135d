"""The memory report: predicted from shapes (no weights) it equals the bytes a loaded decoder holds,
and both agree with what the process actually allocates (RSS deltas in a fresh process; CUDA's
allocator where present) within 10%."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from quickdraft import Decoder
from quickdraft.cli import main
from quickdraft.errors import QuickdraftError
from quickdraft.memory import (
    fit_advice,
    loaded_memory,
    parse_bytes,
    plan_memory,
    read_shape,
    shape_from_config,
    shape_from_gguf,
)
from quickdraft.models.loading import LoadedModel, load_model

CASES = [
    ("native", "fp32"),
    ("native", "bf16"),
    ("native", "int8"),
    ("native", "int4"),
    ("static", "fp32"),
    ("static", "bf16"),
    ("hf", "fp32"),
]


def small_config(tied: bool, **sizes) -> LlamaConfig:
    values = (
        dict(
            vocab_size=4096,
            hidden_size=256,
            intermediate_size=768,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=2,
            max_position_embeddings=512,
        )
        | sizes
    )
    return LlamaConfig(**values, tie_word_embeddings=tied, bos_token_id=None, eos_token_id=None, pad_token_id=None)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_the_plan_from_shapes_equals_the_bytes_a_loaded_decoder_holds(tied, tmp_path):
    config = small_config(tied)
    torch.manual_seed(0)  # test-only: reproducible random weights
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(tmp_path / "m")
    shape = shape_from_config(config)
    assert shape.params == sum(p.numel() for p in model.parameters())
    for backend, precision in CASES:
        decoder = Decoder(
            load_model(tmp_path / "m"), None, "none", backend=backend, precision=precision, measure_shapes=False
        )
        held, planned = (
            loaded_memory(decoder, max_batch=3),
            plan_memory(shape, backend=backend, precision=precision, max_batch=3),
        )
        assert held.target_weights == pytest.approx(planned.target_weights, rel=0.01), (backend, precision)
        assert held.transformers_copy == planned.transformers_copy == 0  # only the hf backend builds one
        assert (held.kv_per_token, held.kv_per_sequence) == (planned.kv_per_token, planned.kv_per_sequence)
        # The KV figures are the cache's own tensors at the context length.
        cache = decoder.target_backend.new_cache(shape.context)
        if backend == "native":
            cache.reserve(shape.context)
            assert cache.keys.nbytes + cache.values.nbytes == planned.kv_per_sequence
        if backend == "static":
            pool = decoder.target_backend
            assert (pool.keys.nbytes + pool.values.nbytes) // pool.slots == planned.kv_per_sequence


MEASURE = textwrap.dedent("""
    import ctypes, gc, json, os, sys
    import torch
    import quickdraft
    from quickdraft.models.loading import load_model

    libc = ctypes.CDLL("libc.so.6")

    def rss():  # resident bytes, freed heap memory given back first
        gc.collect()
        libc.malloc_trim(0)
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    backend, precision, folder = sys.argv[1], sys.argv[2], sys.argv[3]
    # Code first: the modules a load imports take RSS too (the architecture's, via a storage-free model).
    from transformers import AutoConfig
    from quickdraft.models.weights import rotary_embedding
    rotary_embedding(AutoConfig.from_pretrained(folder))
    before = rss()
    decoder = quickdraft.Decoder(load_model(folder), None, "none", backend=backend, precision=precision,
                                 measure_shapes=False)
    weights = rss() - before
    config = decoder.target.config
    before = rss()
    caches = [decoder.target_backend.new_cache(config.max_position_embeddings) for _ in range(3)]
    for cache in caches:
        cache.reserve(config.max_position_embeddings)
        cache.keys.fill_(1)
        cache.values.fill_(1)
    print(json.dumps({"weights": weights, "kv": rss() - before}))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm and glibc's malloc_trim")
@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8", "int4"])
def test_the_plan_agrees_with_what_the_process_allocates(precision, tmp_path):
    sizes = dict(
        vocab_size=16384,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=6,
        num_attention_heads=12,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)  # test-only: reproducible random weights
    LlamaForCausalLM(LlamaConfig(**sizes)).save_pretrained(tmp_path / "m")
    run = subprocess.run(
        [sys.executable, "-c", MEASURE, "native", precision, str(tmp_path / "m")],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ | {"OMP_NUM_THREADS": "1"},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    measured = json.loads(run.stdout.strip().splitlines()[-1])
    plan = plan_memory(shape_from_config(LlamaConfig(**sizes)), backend="native", precision=precision)
    assert measured["weights"] == pytest.approx(plan.target_weights, rel=0.10)
    assert measured["kv"] == pytest.approx(3 * plan.kv_per_sequence, rel=0.10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_the_plan_agrees_with_cudas_allocator():
    config = small_config(
        False,
        vocab_size=32768,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=8,
        num_key_value_heads=4,
        num_attention_heads=16,
        max_position_embeddings=2048,
    )
    model = LlamaForCausalLM(config).eval()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    decoder = Decoder(
        LoadedModel.of(model, None, "m"),
        None,
        "none",
        device="cuda",
        backend="static",
        precision="bf16",
        measure_shapes=False,
    )
    torch.cuda.synchronize()
    plan = plan_memory(shape_from_config(config), backend="static", precision="bf16", device="cuda")
    pool = 2 * plan.kv_per_sequence  # the pool starts with two sequence slots
    assert torch.cuda.memory_allocated() - before == pytest.approx(plan.target_weights + pool, rel=0.10)
    assert decoder.target_backend.slots == 2


def test_fit_advice_names_what_would_fit():
    shape = shape_from_config(small_config(False, max_position_embeddings=4096))
    report = plan_memory(shape, max_batch=8)
    fits, lines = fit_advice(report, report.total + 1, shape, None, "native", "fp32", "cpu")
    assert fits and lines[0].startswith("fits")
    budget = report.total - 3 * report.kv_per_sequence
    fits, lines = fit_advice(report, budget, shape, None, "native", "fp32", "cpu")
    assert not fits and lines[0].startswith("does not fit")
    batch = int(next(line for line in lines if "--max-batch" in line).split()[1])
    assert plan_memory(shape, max_batch=batch).total <= budget < plan_memory(shape, max_batch=batch + 1).total
    context = int(next(line for line in lines if "--context" in line).split()[1])
    assert plan_memory(shape, max_batch=8, context=context).total <= budget
    assert parse_bytes("8GiB") == 8 << 30 and parse_bytes("512 MiB") == 512 << 20 and parse_bytes("1000") == 1000
    with pytest.raises(QuickdraftError, match="memory must be a size"):
        parse_bytes("lots")


def test_plan_command_reads_headers_and_answers_whether_it_fits(capsys, tmp_path):
    folder = tmp_path / "model"
    small_config(True).save_pretrained(folder)  # a config and no weights: plan reads nothing else
    assert main(["plan", "--target", str(folder), "--max-batch", "2", "--context", "256"]) == 0
    out = capsys.readouterr().out
    assert "KV cache per sequence at 256 tokens" in out and "total at 2 sequences" in out
    assert main(["plan", "--target", str(folder), "--max-batch", "64", "--memory", "20MiB"]) == 1
    assert "does not fit" in capsys.readouterr().out
    assert main(["plan", "--target", str(folder), "--max-batch", "0"]) == 2
    assert main(["plan", "--target", str(tmp_path / "missing")]) == 2
    assert main(["plan", "--target", str(folder), "--context", "100000"]) == 2
    errors = capsys.readouterr().err
    assert "--max-batch must be >= 1" in errors and "model not found" in errors and "context length" in errors


@pytest.mark.integration
def test_the_default_targets_gguf_header_gives_its_config_shape():
    from quickdraft.models.loading import load_model

    from_header = read_shape(None)
    from_config = shape_from_config(load_model(None).model.config)
    assert (
        from_header.layers,
        from_header.hidden,
        from_header.intermediate,
        from_header.heads,
        from_header.kv_heads,
        from_header.head_dim,
        from_header.vocab,
        from_header.context,
        from_header.tied,
    ) == (
        from_config.layers,
        from_config.hidden,
        from_config.intermediate,
        from_config.heads,
        from_config.kv_heads,
        from_config.head_dim,
        from_config.vocab,
        from_config.context,
        from_config.tied,
    )
    from quickdraft.models import default_gguf_path

    assert shape_from_gguf(default_gguf_path()).file_bytes > 90_000_000
