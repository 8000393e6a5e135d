import json
import sys
from pathlib import Path

import pytest

from quickdraft.bench import BenchSettings, MethodContender, load_prompts, method_contenders, run_bench
from quickdraft.bench.contenders import parse_spec
from quickdraft.bench.harness import run_batched
from quickdraft.bench.peers import transformers_peers
from quickdraft.bench.prompts import BUILTIN_PROMPTS, SPEC_BENCH_RELATIVE, default_prompt_file, read_prompt_file
from quickdraft.bench.report import PLOTS, write_report
from quickdraft.bench.summary import OVERALL, summarise_all
from quickdraft.decoder import Decoder
from quickdraft.errors import QuickdraftError
from tests.conftest import loaded

PNG = b"\x89PNG\r\n\x1a\n"
PROMPTS = [("qa", [3, 5, 7, 9, 3, 5]), ("rag", [1, 2, 3, 1, 2, 3, 1, 2])]


class CorruptedMethod(MethodContender):
    """A deliberately broken method: a real decoder whose third token is replaced."""

    def run(self, prompt_ids, max_new_tokens, temperature, seed):
        record = super().run(prompt_ids, max_new_tokens, temperature, seed)
        record.tokens[2] = (record.tokens[2] + 1) % 32
        return record


@pytest.fixture()
def decoder(tiny_target, tiny_draft):
    return Decoder(loaded(tiny_target, "tiny"), loaded(tiny_draft, "tiny-draft"), "none")


def test_report_has_a_table_per_category_json_and_three_plots(decoder, tmp_path):
    contenders = method_contenders(decoder, ["all", "prompt-lookup:k=2/4,draft_length=fixed"])
    contenders += transformers_peers(decoder.target, decoder.draft, decoder.eos_ids)
    names = [c.name for c in contenders]
    assert names[:2] == ["none", "draft"] and "prompt-lookup:k=2,draft_length=fixed" in names
    assert "transformers assistant_model" in names
    result = run_bench(PROMPTS, contenders, BenchSettings(max_new_tokens=12, repeats=2), progress=False)
    summaries = summarise_all(result)
    assert list(summaries) == [OVERALL, "qa", "rag"]
    overall = summaries[OVERALL]
    assert overall["none"].speedup == pytest.approx(1.0)
    assert overall["draft"].mean_accepted_length > 1 and overall["draft"].acceptance_by_position
    assert all(not s.mismatches for s in overall.values())  # every method and transformers are exact
    assert all(len(p.runs[name]) == 2 for p in result.prompts for name in names)

    paths = write_report(
        tmp_path, result, summaries, {"target": "tiny", "precision": "fp32", "backend": "auto", "prompts": "test ids"}
    )
    report = paths["report"].read_text()
    for heading in ("## overall", "## qa", "## rag", "## Equality check (greedy)"):
        assert heading in report
    assert report.count("| draft |") == 3  # one row in each table
    assert "Every quickdraft method produced its reference's tokens" in report
    raw = json.loads(paths["results"].read_text())
    assert raw["contenders"] == names and len(raw["prompts"]) == 2
    assert raw["summaries"]["qa"]["draft"]["prompts"] == 1
    for file in PLOTS.values():
        assert (tmp_path / file).read_bytes()[:8] == PNG


def test_equality_check_catches_a_broken_method(decoder, tmp_path):
    contenders = method_contenders(decoder, ["prompt-lookup"])
    contenders.append(CorruptedMethod("broken", decoder.with_method("prompt-lookup")))
    result = run_bench(PROMPTS, contenders, BenchSettings(max_new_tokens=10), progress=False)
    summaries = summarise_all(result)
    assert summaries[OVERALL]["broken"].mismatches == [1, 2]
    assert summaries["rag"]["broken"].mismatches == [2]
    assert summaries[OVERALL]["prompt-lookup"].mismatches == []
    report = write_report(
        tmp_path, result, summaries, {"target": "tiny", "precision": "fp32", "backend": "auto", "prompts": "ids"}
    )["report"].read_text()
    assert "**quickdraft methods whose tokens differ from their reference:** broken: prompts [1, 2]" in report
    assert "| broken |" in report and "2/2 |" in report


def test_sampled_runs_check_the_tokens_of_seeded_methods(decoder, tmp_path):
    # At temperature > 0, sampler gumbel's text follows the seed alone: it must equal plain decoding's,
    # and a broken one is caught; rejection sampling's text is the seed's and the draft's, not checked.
    contenders = method_contenders(decoder, ["draft:k=3", "draft:k=3,sampler=rejection"])
    contenders.append(CorruptedMethod("broken", decoder.with_method("draft", 3)))
    result = run_bench(PROMPTS, contenders, BenchSettings(max_new_tokens=12, temperature=0.8, seed=5), progress=False)
    overall = summarise_all(result)[OVERALL]
    assert overall["draft:k=3"].checked and overall["draft:k=3"].mismatches == []
    assert overall["draft:k=3"].acceptance_rate > 0
    assert not overall["draft:k=3,sampler=rejection"].checked
    assert overall["broken"].mismatches == [1, 2]
    report = write_report(
        tmp_path, result, summarise_all(result), {"target": "t", "precision": "fp32", "backend": "auto", "prompts": "p"}
    )["report"].read_text()
    assert "## Equality check (seeded sampling)" in report and "broken: prompts [1, 2]" in report
    assert "| draft:k=3,sampler=rejection |" in report and "(sampled) |" in report


def test_methods_at_another_precision_are_checked_against_plain_decoding_at_it(decoder, tmp_path):
    contenders = method_contenders(
        decoder, ["prompt-lookup:precision=int4", "none:precision=int8", "prompt-lookup:precision=int8"]
    )
    references = {c.name: c.reference for c in contenders}
    assert references == {
        "none": "none",
        "none:precision=int4,backend=native": "none:precision=int4,backend=native",
        "prompt-lookup:precision=int4": "none:precision=int4,backend=native",
        "none:precision=int8": "none:precision=int8",
        "prompt-lookup:precision=int8": "none:precision=int8",
    }
    result = run_bench(PROMPTS, contenders, BenchSettings(max_new_tokens=16), progress=False)
    summaries = summarise_all(result)
    assert all(not s.mismatches for s in summaries[OVERALL].values())
    # int4 plain decoding differs from fp32 (the baseline) but is its own precision's reference.
    report = write_report(
        tmp_path, result, summaries, {"target": "tiny", "precision": "fp32", "backend": "auto", "prompts": "ids"}
    )["report"].read_text()
    assert "| 0/2 vs none:precision=int4,backend=native |" in report


def test_batched_runs_count_the_outputs_that_differ_from_alone(decoder, tmp_path):
    """Each method's prompts again, 2 at a time in shared passes (seeded sampling): every output
    equals the same prompt alone; a method whose alone run was corrupted is counted."""
    contenders = method_contenders(decoder, ["prompt-lookup", "draft:k=3"])
    contenders.append(CorruptedMethod("broken", decoder.with_method("prompt-lookup")))
    result = run_bench(PROMPTS, contenders, BenchSettings(max_new_tokens=12, temperature=0.8, seed=5), progress=False)
    result.batched = run_batched(result, PROMPTS, 2, progress=False)
    differ = {name: run.differ for name, run in result.batched.items()}
    assert differ == {"none": [], "prompt-lookup": [], "draft:k=3": [], "broken": [1, 2]}
    assert all(run.tokens == 24 and run.seconds > 0 for run in result.batched.values())
    paths = write_report(
        tmp_path, result, summarise_all(result), {"target": "t", "precision": "fp32", "backend": "auto", "prompts": "p"}
    )
    report = paths["report"].read_text()
    assert "## Batched (2 prompts at a time)" in report and "| 0 of 2 |" in report
    assert "2 of 2 (prompts [1, 2]) |" in report
    assert json.loads(paths["results"].read_text())["batched"]["broken"]["differ"] == [1, 2]


def test_sampled_runs_skip_the_equality_check(decoder):
    contenders = method_contenders(decoder, ["draft"])
    result = run_bench(PROMPTS[:1], contenders, BenchSettings(max_new_tokens=8, temperature=0.7), progress=False)
    assert summarise_all(result)[OVERALL]["draft"].mismatches == []


def test_specs_expand_and_bad_ones_are_refused(decoder):
    assert [name for name, _, _ in parse_spec("prompt-lookup:k=2/8,max_ngram=4")] == [
        "prompt-lookup:k=2,max_ngram=4",
        "prompt-lookup:k=8,max_ngram=4",
    ]
    assert parse_spec("self-spec:layers=0+1+3")[0][2] == {"layers": (0, 1, 3)}
    with pytest.raises(QuickdraftError, match="unknown method"):
        parse_spec("telepathy")
    with pytest.raises(QuickdraftError, match="key=value"):
        parse_spec("prompt-lookup:k")
    with pytest.raises(QuickdraftError, match="k must be an integer, got .many."):
        parse_spec("prompt-lookup:k=many")
    with pytest.raises(QuickdraftError, match="baseline"):
        method_contenders(decoder, ["none"])
    with pytest.raises(QuickdraftError, match="baseline"):
        run_bench(PROMPTS, method_contenders(decoder, ["draft"])[1:], BenchSettings(), progress=False)
    with pytest.raises(QuickdraftError, match="repeats"):
        run_bench(PROMPTS, method_contenders(decoder, []), BenchSettings(repeats=0), progress=False)


def test_all_leaves_out_the_draft_method_without_a_draft_model(tiny_target):
    names = [c.name for c in method_contenders(Decoder(loaded(tiny_target, "t"), None, "none"), ["all"])]
    assert names == ["none", "prompt-lookup", "self-spec", "lookahead", "suffix"]


def test_prompts_from_spec_bench_style_jsonl(tmp_path):
    path = tmp_path / "q.jsonl"
    rows = [
        {"question_id": 1, "category": "writing", "turns": ["a", "b"]},
        {"question_id": 2, "category": "coding", "turns": ["c"]},
        {"question_id": 3, "category": "translation", "turns": ["d"]},
        {"question_id": 4, "category": "translation", "turns": ["e"]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert [(p.category, p.text) for p in read_prompt_file(path)] == [
        ("mt_bench", "a"),
        ("mt_bench", "c"),
        ("translation", "d"),
        ("translation", "e"),
    ]
    picked = load_prompts(path, ["translation", "mt_bench"], per_category=1)
    assert [(p.category, p.text) for p in picked] == [("translation", "d"), ("mt_bench", "a")]
    with pytest.raises(QuickdraftError, match="unknown categories"):
        load_prompts(path, ["poetry"])
    (tmp_path / "bad.jsonl").write_text('{"category": "x"}\n')
    with pytest.raises(QuickdraftError, match="line 1: no prompt"):
        read_prompt_file(tmp_path / "bad.jsonl")


def test_builtin_prompts_without_a_file():
    prompts = load_prompts(None, per_category=1)
    assert [p.category for p in prompts] == list(BUILTIN_PROMPTS)
    assert all(len(texts) >= 2 for texts in BUILTIN_PROMPTS.values())


def test_default_prompt_file_is_looked_up_beside_the_working_folder(tmp_path):
    work = tmp_path / "project"
    work.mkdir()
    file = tmp_path / SPEC_BENCH_RELATIVE
    file.parent.mkdir(parents=True)
    file.write_text("{}\n")
    assert default_prompt_file(work) == file.resolve()


def test_the_sampler_comparison_reads_both_samplers_of_each_method(decoder, tmp_path, capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from sampler_compare import main

    contenders = method_contenders(decoder, ["draft:k=3,sampler=gumbel/rejection", "prompt-lookup"])
    result = run_bench(PROMPTS, contenders, BenchSettings(max_new_tokens=12, temperature=0.8), progress=False)
    header = {"target": "t", "precision": "fp32", "backend": "auto", "prompts": "p"}
    write_report(tmp_path / "t08", result, summarise_all(result), header)
    assert main([str(tmp_path / "t08"), "--plot", str(tmp_path / "bars.png")]) == 0
    lines = capsys.readouterr().out.splitlines()
    [row] = [line for line in lines if line.startswith("| 0.8 |")]  # prompt-lookup ran with one sampler only
    assert row.startswith("| 0.8 | draft |") and row.endswith("| 0/2 |")
    assert (tmp_path / "bars.png").read_bytes()[:8] == PNG


def test_an_in_order_stream_learns_and_reports_by_request(decoder, tmp_path):
    """The same prompt twice: in order, suffix decoding's second run drafts the first's answer
    back; out of order (the default) no run learns from another, so both run alike."""
    stream = [("extraction", [3, 5, 7, 9, 3, 5]), ("extraction", [3, 5, 7, 9, 3, 5])]
    settings = BenchSettings(max_new_tokens=24)
    results = {}
    for in_order in (False, True):
        contenders = method_contenders(decoder.with_method("none"), ["suffix:draft_length=fixed"])
        results[in_order] = run_bench(stream, contenders, settings, progress=False, in_order=in_order)
    alone = [p.runs["suffix:draft_length=fixed"][0] for p in results[False].prompts]
    learned = [p.runs["suffix:draft_length=fixed"][0] for p in results[True].prompts]
    assert alone[0].passes == alone[1].passes == learned[0].passes  # the warm-up taught nothing either
    assert learned[1].passes < learned[0].passes / 2 and learned[1].tokens == learned[0].tokens
    with pytest.raises(QuickdraftError, match="once"):
        run_bench(stream, contenders, BenchSettings(max_new_tokens=4, repeats=2), progress=False, in_order=True)
    result = results[True]
    paths = write_report(
        tmp_path,
        result,
        summarise_all(result),
        {"target": "tiny", "precision": "fp32", "backend": "native", "prompts": "two", "methods": [], "peers": []},
    )
    report = paths["report"].read_text()
    assert "## By request (in order)" in report and "| suffix:draft_length=fixed | " in report
    assert paths["by_request"].read_bytes().startswith(PNG)
    assert json.loads(paths["results"].read_text())["in_order"] is True
