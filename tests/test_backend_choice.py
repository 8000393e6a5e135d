"""auto's llama.cpp-or-native verdict (backends/choice.py) from injected timings: nothing here is
timed, so nothing depends on how busy the machine is. The last test runs the real decoder path on
the embedded default (skipped without llama-cpp-python)."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from quickdraft.backends.choice import BackendChoice, Timings, cached_backend_choice, decide, observe, planned_verdict
from quickdraft.backends.llama_cpp import llama_cpp_installed
from quickdraft.measured import read_choice, write_choice

SIGNATURE = {"choice": "test", "file": "f"}
QUIET_TRUE = Timings([12.0, 11.5, 12.2, 11.9, 12.4, 12.0, 11.8, 12.1, 12.3], [40.0] * 9, cpu_share=0.97)


def test_a_busy_moment_keeps_the_default_and_is_not_kept(tmp_path):
    # What a process beside us does: llama.cpp's waiting threads lose most, native looks faster.
    busy = Timings(
        [60.0, 75.0, 58.0, 90.0, 66.0, 70.0, 61.0, 80.0, 64.0],
        [40.0, 45.0, 42.0, 50.0, 39.0, 44.0, 41.0, 47.0, 43.0],
        cpu_share=0.45,
    )
    choice = decide(busy, "fp32")
    assert choice.llama_cpp and not choice.keep
    assert "busy" in choice.reason and "45%" in choice.reason
    kept = cached_backend_choice(tmp_path, SIGNATURE, lambda: busy, "fp32")
    assert kept.llama_cpp and read_choice(tmp_path, SIGNATURE) is None  # the next load times again


def test_native_needs_a_clear_margin_in_most_pairs():
    # Quiet, native a little faster in most pairs: not clear, the default stays.
    close = Timings([12.0] * 9, [11.0] * 9, cpu_share=0.95)
    assert decide(close, "fp32").llama_cpp
    # Quiet, native much faster in only a few pairs (a burst that hit llama.cpp): the default stays.
    burst = Timings([12.0] * 6 + [40.0] * 3, [15.0] * 6 + [8.0] * 3, cpu_share=0.9)
    assert decide(burst, "fp32").llama_cpp
    # Quiet, native at half llama.cpp's time in every pair: native.
    clear = Timings([20.0] * 9, [10.0] * 9, cpu_share=0.95)
    choice = decide(clear, "fp32")
    assert not choice.llama_cpp and choice.keep and choice.native_ms == 10.0
    assert decide(QUIET_TRUE, "fp32").llama_cpp


def test_a_kept_wrong_choice_is_corrected_by_a_run_that_observes_otherwise(tmp_path):
    # A wrong verdict kept from an earlier load (timed while something else ran but unnoticed).
    wrong = BackendChoice(False, "native: planted", llama_cpp_ms=60.0, native_ms=45.0)
    write_choice(tmp_path, SIGNATURE, asdict(wrong))

    def must_not_time() -> Timings:
        raise AssertionError("a kept verdict is read, not timed again")

    kept = cached_backend_choice(tmp_path, SIGNATURE, must_not_time, "fp32")
    assert not kept.llama_cpp and "kept from an earlier load" in kept.reason
    # A run whose passes were slower than recorded (busy now, or batched) proves nothing.
    assert not observe(tmp_path, SIGNATURE, kept, [0.050] * 20)
    assert not observe(tmp_path, SIGNATURE, kept, [0.010] * 3)  # too few passes to judge
    assert read_choice(tmp_path, SIGNATURE) is not None
    # A run on the chosen backend 2.5x faster than recorded: the record was made while busier; dropped.
    assert observe(tmp_path, SIGNATURE, kept, [0.018] * 20)
    assert read_choice(tmp_path, SIGNATURE) is None
    again = cached_backend_choice(tmp_path, SIGNATURE, lambda: QUIET_TRUE, "fp32")
    assert again.llama_cpp and again.keep and "kept" not in again.reason
    assert "llama.cpp 12.0 ms" in planned_verdict(tmp_path, SIGNATURE).reason


def test_plan_says_when_nothing_was_timed_yet(tmp_path):
    planned = planned_verdict(tmp_path, SIGNATURE)
    assert planned.llama_cpp and not planned.keep and "not timed on this machine yet" in planned.reason


@pytest.mark.integration
@pytest.mark.skipif(not llama_cpp_installed(), reason="llama-cpp-python is not installed (./setup.sh builds it)")
def test_the_decoder_uses_a_kept_verdict_says_why_and_drops_it_when_a_run_contradicts_it(tmp_path):
    from quickdraft import Decoder
    from quickdraft.backends.select import choice_signature, shapes_folder
    from quickdraft.models.loading import load_model

    loaded = load_model(None)
    folder, signature = shapes_folder(tmp_path), choice_signature(loaded.gguf, "fp32")
    # Planted: native chosen from a record whose passes took 10 s (as only a very busy moment gives).
    write_choice(
        folder, signature, asdict(BackendChoice(False, "native: planted", llama_cpp_ms=20000.0, native_ms=10000.0))
    )
    decoder = Decoder(loaded, None, "none", cache_dir=tmp_path)
    assert decoder.backend_kind == "native" and "planted" in decoder.backend_reason
    decoder.generate("Name three colours.", max_new_tokens=12)
    assert read_choice(folder, signature) is None  # 12 one-token passes far under 10 s: dropped
    explicit = Decoder(loaded, None, "none", backend="llama.cpp", cache_dir=tmp_path, measure_shapes=False)
    assert explicit.backend_reason == "llama.cpp: asked for (backend=llama.cpp)"
