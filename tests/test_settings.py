"""Sampling and run settings declared once: the CLI, the library, the bench and the server read one declaration."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from quickdraft import QuickdraftError, SamplingParams
from quickdraft.bench.harness import BenchSettings
from quickdraft.cli import build_parser, main
from quickdraft.serve.protocol import CompletionRequest
from quickdraft.settings import OPENAI_DEFAULTS, RUN_SETTINGS, SAMPLING, SAMPLING_SETTINGS, SEED_RANGE, checked_sampling


def test_every_setting_has_help_and_a_default_its_own_check_accepts():
    for option in (*SAMPLING_SETTINGS, *RUN_SETTINGS):
        assert option.help and option.check(option.default) == option.default, option.name


@pytest.mark.parametrize(
    "values, message",
    [
        ({"temperature": -1}, "temperature must be >= 0, got -1.0"),
        ({"temperature": float("inf")}, "temperature must be a finite number"),
        ({"temperature": float("nan")}, "temperature must be a finite number"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\], got 0.0"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
        ({"top_k": 0}, "top_k must be >= 1, got 0"),
        ({"max_new_tokens": 0}, "max_new_tokens must be >= 1, got 0"),
        ({"seed": SEED_RANGE[1] + 1}, "seed must be in"),
        ({"logprobs": 21}, "logprobs must be in 0..20, got 21"),
        ({"stop": ["ok", 3]}, "stop must be text"),
    ],
)
def test_bounds_live_in_the_declaration_and_every_checker_reads_them(values, message):
    with pytest.raises(QuickdraftError, match=message) as caught:
        checked_sampling(**values)
    assert caught.value.option == next(iter(values))
    if set(values) <= {"temperature", "top_k", "top_p"}:
        with pytest.raises(QuickdraftError, match=message):
            SamplingParams(**values)
    if set(values) <= {"temperature", "max_new_tokens", "seed"}:
        with pytest.raises(QuickdraftError, match=message):
            BenchSettings(**values).check()


def test_top_p_of_one_and_temperature_zero_are_allowed():
    assert checked_sampling(top_p=1.0, temperature=0, stop="x") == {"top_p": 1.0, "temperature": 0.0, "stop": "x"}


def test_cli_flags_take_the_declared_defaults_and_checks(capsys):
    parser = build_parser()
    generate = parser.parse_args(["generate"])
    for option in SAMPLING_SETTINGS:
        if option.name != "logprobs":
            assert getattr(generate, option.name) == option.default, option.name
    assert parser.parse_args(["generate", "--stop", "a", "--stop", "b"]).stop == ["a", "b"]
    assert parser.parse_args(["bench"]).max_new_tokens is None  # the bench's own default (--quick or not)
    for argv in (
        ["generate", "--threads", "0"],
        ["serve", "--threads", "0"],
        ["bench", "--threads", "0"],
        ["train", "eagle", "--data", "d", "--output", "o", "--threads", "0"],
    ):
        assert main(argv) == 2
        assert "threads must be >= 1, got 0" in capsys.readouterr().err
    assert main(["generate", "--top-p", "0"]) == 2
    assert "top_p must be in (0, 1]" in capsys.readouterr().err


def test_the_server_reads_the_declared_bounds_and_its_own_defaults():
    request = CompletionRequest(model="M", prompt="hi")
    assert (request.temperature, request.top_p, request.seed) == (
        OPENAI_DEFAULTS["temperature"],
        OPENAI_DEFAULTS["top_p"],
        OPENAI_DEFAULTS["seed"],
    )
    assert CompletionRequest.model_fields["temperature"].description == SAMPLING["temperature"].help
    for bad in (
        {"temperature": -0.1},
        {"temperature": 2.5},
        {"top_p": 0},
        {"top_k": 0},
        {"seed": SEED_RANGE[0] - 1},
        {"logprobs": 21},
    ):
        with pytest.raises(ValidationError):
            CompletionRequest(model="M", prompt="hi", **bad)
    assert CompletionRequest(model="M", prompt="hi", temperature=0, top_p=1, seed=SEED_RANGE[1]).seed == SEED_RANGE[1]
