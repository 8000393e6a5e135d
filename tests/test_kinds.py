"""One traits record per backend (backends/kinds.py) and one function that chooses (select.choose_backend):
what auto picks, what an asked-for backend refuses, and that `quickdraft plan` and the loader
choose alike."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from transformers import Gemma3TextConfig, GPT2Config, LlamaConfig

from quickdraft.backends.choice import BackendChoice
from quickdraft.backends.kinds import BACKENDS, GGUF, HF, LLAMA_CPP, NATIVE, STATIC, TRAITS, all_precisions, traits_for
from quickdraft.backends.llama_cpp import llama_cpp_installed
from quickdraft.backends.select import choose_backend, draft_backend
from quickdraft.errors import QuickdraftError
from quickdraft.options import OPTION

LLAMA = LlamaConfig(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)
GPT2 = GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4)
GEMMA3 = Gemma3TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, head_dim=8)
CPU, CUDA = torch.device("cpu"), torch.device("cuda")  # a device object is planned for, not checked present
FILE = Path("model.gguf")  # only whether a target is a GGUF file is read


def test_the_options_and_the_cli_take_their_choices_from_the_specs():
    assert OPTION["backend"].choices == BACKENDS == ("auto", NATIVE, HF, LLAMA_CPP, STATIC)
    assert set(OPTION["precision"].choices) == set(all_precisions()) == {"fp32", "bf16", "int8", "int4", "fp16", GGUF}
    assert TRAITS[LLAMA_CPP].shared_kv and TRAITS[STATIC].rows == 64
    # llama.cpp records layer inputs (EAGLE-3's features) in some architectures' graphs only
    assert TRAITS[LLAMA_CPP].inner_layers(LLAMA) and not TRAITS[LLAMA_CPP].inner_layers(GEMMA3)
    assert TRAITS[NATIVE].inner_layers(GEMMA3)


def test_auto_picks_by_device_file_and_architecture():
    assert choose_backend(LLAMA, None, "m", device=CPU)[:2] == (NATIVE, "fp32")
    assert choose_backend(LLAMA, None, "m", device=CUDA)[:2] == (STATIC, "bf16")
    assert choose_backend(LLAMA, None, "m", precision="int4", device=CUDA)[:2] == (NATIVE, "int4")
    hf = choose_backend(GPT2, None, "g", device=CPU)
    assert hf[:2] == (HF, "fp32") and "not a GGUF file; the native backend does not support it" in hf.reason
    with pytest.raises(QuickdraftError, match="the hf backend computes at fp32, bf16, fp16, not int4"):
        choose_backend(GPT2, None, "g", precision="int4", device=CPU)


def test_the_hf_backend_computes_in_the_checkpoints_own_dtype_unless_asked():
    assert choose_backend(GPT2, None, "g", device=CPU, stored="bf16")[:2] == (HF, "bf16")  # auto: bf16 stays bf16
    assert choose_backend(GPT2, None, "g", device=CUDA, stored="fp16")[:2] == (HF, "fp16")
    assert choose_backend(LLAMA, None, "m", HF, device=CPU, stored="bf16")[:2] == (HF, "bf16")
    assert choose_backend(LLAMA, None, "m", HF, "fp32", device=CPU, stored="bf16")[:2] == (HF, "fp32")
    assert choose_backend(GPT2, None, "g", precision="fp32", device=CPU, stored="bf16")[:2] == (HF, "fp32")
    # Native computes at the precision asked for, never at the checkpoint's (fp32 on a CPU by default).
    assert choose_backend(LLAMA, None, "m", device=CPU, stored="bf16")[:2] == (NATIVE, "fp32")
    fp16 = choose_backend(LLAMA, None, "m", precision="fp16", device=CPU)  # only hf computes at fp16
    assert fp16[:2] == (HF, "fp16") and "the native backend does not compute at fp16" in fp16.reason
    with pytest.raises(QuickdraftError, match="the native backend computes at fp32, bf16, int8, int4, not fp16"):
        choose_backend(LLAMA, None, "m", NATIVE, "fp16", device=CPU)


@pytest.mark.skipif(not llama_cpp_installed(), reason="llama-cpp-python is not installed (./setup.sh builds it)")
def test_auto_on_a_gguf_file_asks_for_the_verdict_only_where_it_times_one():
    asked = []

    def verdict(llama_cpp: bool):
        return lambda: (
            asked.append(llama_cpp)
            or BackendChoice(llama_cpp, "native: planted" if not llama_cpp else "llama.cpp: planted")
        )

    assert choose_backend(LLAMA, FILE, "m", device=CPU, verdict=verdict(True))[:2] == (LLAMA_CPP, GGUF)
    assert choose_backend(LLAMA, FILE, "m", device=CPU, verdict=verdict(False)) == (NATIVE, "fp32", "native: planted")
    assert asked == [True, False]
    big = LlamaConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
    )  # an 8B shape: its fp32 copy is 32 GB
    untimed = choose_backend(big, FILE, "8b", device=CPU, verdict=verdict(False))
    assert untimed.kind == LLAMA_CPP and "not timed against native" in untimed.reason and asked == [True, False]
    assert choose_backend(LLAMA, FILE, "m", precision="int4", device=CPU).kind == NATIVE
    eagle3 = choose_backend(LLAMA, FILE, "m", device=CPU, inner_layers=True, verdict=verdict(True))
    assert eagle3.kind == LLAMA_CPP and asked == [True, False, True]  # timed like any method
    gemma = choose_backend(GEMMA3, FILE, "m", device=CPU, inner_layers=True, verdict=verdict(True))
    assert gemma.kind == NATIVE and "does not return for 'gemma3_text' models" in gemma.reason
    assert choose_backend(LLAMA, FILE, "m", precision=GGUF, device=CPU)[:2] == (LLAMA_CPP, GGUF)


def test_an_asked_for_backend_says_in_one_line_why_it_cannot_run_this():
    cases = [
        (dict(kind=NATIVE, config=GPT2), "the native backend supports .*'gpt2'"),
        (dict(kind=STATIC, precision="int4"), "the static backend computes at fp32, bf16, not int4"),
        (
            dict(kind=HF, precision="int8"),
            "the hf backend computes at fp32, bf16, fp16, not int8; use the native backend",
        ),
        (dict(kind=NATIVE, precision=GGUF), "precision gguf is the llama.cpp backend's"),
        (dict(kind="fast"), "unknown backend 'fast'"),
    ]
    if llama_cpp_installed():
        cases += [
            (dict(kind=LLAMA_CPP), "runs GGUF files; 'm' was not loaded from one"),
            (dict(kind=LLAMA_CPP, gguf=FILE, precision="int4"), "GGUF file's own types"),
            (dict(kind=LLAMA_CPP, gguf=FILE, device=CUDA), "runs on cpu here, not on cuda"),
            (dict(kind=LLAMA_CPP, config=GEMMA3, gguf=FILE, inner_layers=True), "inner layers.*'gemma3_text'"),
        ]
    for given, message in cases:
        setting = {"config": LLAMA, "gguf": None, "device": CPU} | given
        with pytest.raises(QuickdraftError, match=message):
            choose_backend(setting.pop("config"), setting.pop("gguf"), "m", **setting)
    assert choose_backend(LLAMA, None, "m", NATIVE, device=CPU) == (
        NATIVE,
        "fp32",
        "native: asked for (backend=native)",
    )


def test_a_draft_runs_beside_its_target_where_it_can():
    class Draft:  # what draft_backend reads of a loaded draft model
        def __init__(self, config, gguf=None, stored="fp32"):
            self.config, self.gguf, self.stored_precision = config, gguf, stored

    assert draft_backend(LLAMA_CPP, GGUF, Draft(LLAMA, FILE), CPU) == (LLAMA_CPP, GGUF)
    assert draft_backend(LLAMA_CPP, GGUF, Draft(LLAMA), CPU) == ("auto", "fp32")  # not a GGUF file
    assert draft_backend(STATIC, "bf16", Draft(GPT2), CUDA) == (HF, "fp32")  # another architecture
    assert draft_backend(NATIVE, "fp32", Draft(GPT2, stored="bf16"), CPU) == (HF, "bf16")  # in its own dtype
    assert draft_backend(NATIVE, "int4", Draft(LLAMA), CPU) == (NATIVE, "int4")


@pytest.mark.integration
@pytest.mark.skipif(not llama_cpp_installed(), reason="llama-cpp-python is not installed (./setup.sh builds it)")
@pytest.mark.parametrize("verdict", [True, False])
def test_plan_and_the_loader_choose_the_same_backend(tmp_path, capsys, verdict):
    from quickdraft import Decoder
    from quickdraft.backends.select import choice_signature, shapes_folder
    from quickdraft.cli import planned_choice
    from quickdraft.measured import write_choice
    from quickdraft.memory import read_shape
    from quickdraft.models.loading import load_model

    loaded = load_model(None, cache_dir=tmp_path)
    write_choice(
        shapes_folder(tmp_path),
        choice_signature(loaded.gguf, "fp32"),
        asdict(BackendChoice(verdict, "planted", llama_cpp_ms=10.0, native_ms=20.0 if verdict else 5.0)),
    )
    planned = planned_choice(read_shape(None), "auto", None, "cpu", tmp_path)
    decoder = Decoder(loaded, None, "none", cache_dir=tmp_path)
    assert (planned.kind, planned.precision) == (decoder.backend_kind, decoder.precision)
    assert planned.kind == (LLAMA_CPP if verdict else NATIVE) and "planted" in decoder.backend_reason
    assert traits_for(decoder.target_backend).name == decoder.backend_kind
    int4 = planned_choice(read_shape(None), "auto", "int4", "cpu", tmp_path)
    assert (int4.kind, int4.precision) == (NATIVE, "int4")
