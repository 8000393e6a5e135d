"""Options declared once: the API, the CLI, specs and the server read one declaration."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest
from conftest import loaded

from quickdraft import Decoder, QuickdraftError
from quickdraft.cli import build_parser, given_options
from quickdraft.methods import METHODS, MethodConfig, configure
from quickdraft.options import MAX_K, OPTION, OPTIONS, parse_spec


def test_every_option_has_help_and_a_default_its_own_check_accepts():
    for option in OPTIONS:
        assert option.help and option.check(option.default) == option.default, option.name
    assert len({option.flag for option in OPTIONS}) == len(OPTIONS)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"k": 0}, "k must be in 1..64, got 0"),
        ({"k": MAX_K + 1}, "k must be in 1..64"),
        ({"k": 1180591620717411303424}, "k must be in 1..64"),
        ({"k": 2.5}, "k must be an integer"),
        ({"k_max": 10**9}, "k_max must be in 1..64"),
        ({"draft_length": "sometimes"}, "unknown draft_length 'sometimes'"),
        ({"confidence": 1.0}, r"confidence must be in \(0, 1\)"),
        ({"confidence": float("nan")}, "confidence must be"),
        ({"precision": "fp8"}, "unknown precision 'fp8'"),
        ({"device": "tpu"}, "unknown device 'tpu'"),
        ({"backend": "fast"}, "unknown backend 'fast'"),
        ({"colour": "red"}, "unknown option 'colour'"),
        ({"tree_nodes": 4}, "does not apply to method 'prompt-lookup'"),
    ],
)
def test_bad_settings_are_refused_with_the_option_named(settings, message):
    with pytest.raises(QuickdraftError, match=message) as caught:
        configure("prompt-lookup", False, **settings)
    assert caught.value.option == next(iter(settings))


def test_method_config_has_one_typed_field_per_option():
    """The typed record and the declaration cannot drift: the same names, in order, of the declared kinds."""
    names = [f.name for f in fields(MethodConfig)]
    assert names == ["method", *(option.name for option in OPTIONS), "given"]
    types = {f.name: f.type for f in fields(MethodConfig)}
    for option in OPTIONS:
        assert option.kind.__name__ in types[option.name], option.name
    config = configure("eagle:tree_nodes=8", False)
    assert config.tree_nodes == 8 and config.settings()["tree_nodes"] == 8 and config.label() == "eagle:tree_nodes=8"
    assert not hasattr(MethodConfig, "__getattr__")
    with pytest.raises(AttributeError):
        config.colour  # noqa: B018 - an unknown name is an error, not a lookup


def test_methods_take_their_defaults_from_one_place():
    for name, method in METHODS.items():
        config = configure(name, True)
        assert config.k == (method.default_k if method.speculative else 0)
        assert config.draft_length == method.default_draft_length
        assert config.max_ngram == OPTION["max_ngram"].default and config.tree_nodes == OPTION["tree_nodes"].default
    assert configure(None, False).method == "prompt-lookup" and configure(None, True).method == "draft"
    with pytest.raises(QuickdraftError, match="needs a draft model"):
        configure("draft", False)
    with pytest.raises(QuickdraftError, match="given twice"):
        configure("prompt-lookup:k=2", False, k=3)


def test_a_spec_the_cli_and_keywords_give_the_same_configuration():
    spec = configure("prompt-lookup:k=4,max_ngram=5,draft_length=fixed", False)
    keywords = configure("prompt-lookup", False, k=4, max_ngram=5, draft_length="fixed")
    args = build_parser().parse_args(
        ["generate", "hi", "--method", "prompt-lookup", "--k", "4", "--max-ngram", "5", "--draft-length", "fixed"]
    )
    cli = configure(args.method, False, **given_options(args))
    assert spec.settings() == keywords.settings() == cli.settings()
    assert spec.label() == "prompt-lookup:k=4,max_ngram=5,draft_length=fixed"
    flagged = build_parser().parse_args(["generate", "--method", "self-spec:layers=0+2", "--precision", "int4"])
    assert configure(flagged.method, False, **given_options(flagged)).layers == (0, 2)
    assert given_options(flagged) == {"precision": "int4"}  # flags not given stay out: their defaults live here
    # A switch that is on by default is turned off by its --no- flag, as by a spec or a keyword.
    off = build_parser().parse_args(["generate", "--method", "eagle", "--no-lookup"])
    assert configure(off.method, False, **given_options(off)).lookup is False
    assert configure("eagle:lookup=false", False).lookup is False and configure("eagle", False).lookup is True
    assert configure("medusa", False, lookup=False).lookup is False
    with pytest.raises(QuickdraftError, match="does not apply to method 'prompt-lookup'"):
        configure("prompt-lookup", False, lookup=True)


def test_cli_flags_come_from_the_declaration_and_check_their_values(capsys):
    parser = build_parser()
    for command in ("generate", "serve"):
        args = parser.parse_args([command])
        assert all(hasattr(args, option.name) for option in OPTIONS), command
    bench = parser.parse_args(["bench"])
    assert hasattr(bench, "precision") and not hasattr(bench, "max_ngram")  # bench: methods come as specs
    with pytest.raises(SystemExit):
        parser.parse_args(["generate", "--k", "0"])
    assert "k must be in 1..64, got 0" in capsys.readouterr().err
    assert parser.parse_args(["generate", "--full-vocab"]).full_vocab is True


def test_specs_expand_for_sweeps_and_check_each_value():
    assert [label for label, _, _ in parse_spec("lookahead:k=1/2,window=3", expand=True)] == [
        "lookahead:k=1,window=3",
        "lookahead:k=2,window=3",
    ]
    # a path keeps its slashes: only the tree sweeps here
    assert [s for _, _, s in parse_spec("eagle:head=runs/eagle3,tree_nodes=4/16", expand=True)] == [
        {"head": "runs/eagle3", "tree_nodes": 4},
        {"head": "runs/eagle3", "tree_nodes": 16},
    ]
    with pytest.raises(QuickdraftError, match="window must be in 1..64"):
        parse_spec("lookahead:window=0")


def test_with_method_keeps_the_models_and_the_settings_that_apply(tiny_target):
    base = Decoder(loaded(tiny_target, "t"), None, "prompt-lookup:max_ngram=4", precision="int4")
    same = base.with_method(k=2)
    assert same.config.max_ngram == 4 and same.k == 2 and same.precision == "int4"
    other = base.with_method("lookahead")  # prompt lookup's own settings do not follow it
    assert other.method == "lookahead" and other.precision == "int4"
    assert other.target_backend is base.target_backend


def test_an_old_option_name_works_for_one_release_with_a_warning(tiny_target):
    """runner= became backend=: code written for the earlier API still runs, and is told."""
    with pytest.warns(FutureWarning, match="'runner' is deprecated and is now called 'backend'") as told:
        decoder = Decoder(loaded(tiny_target, "t"), None, "prompt-lookup", runner="hf")
    assert told[0].filename == __file__  # the warning points at the caller's line
    assert decoder.backend_kind == "hf" and decoder.config.backend == "hf"
    with pytest.warns(FutureWarning):
        assert decoder.with_method(runner="native").backend_kind == "native"
    with pytest.warns(FutureWarning):
        assert parse_spec("prompt-lookup:runner=hf") == [
            ("prompt-lookup:backend=hf", "prompt-lookup", {"backend": "hf"})
        ]
    with pytest.raises(QuickdraftError, match="old name of 'backend'"):
        Decoder(loaded(tiny_target, "t"), None, runner="hf", backend="native")
    changelog = (Path(__file__).resolve().parents[1] / "CHANGELOG.md").read_text()
    assert "`runner`" in changelog and "`backend`" in changelog
