"""CLI paths that need no model; `generate` on the default target is in test_integration.py."""

from quickdraft.analysis import expected_tokens_per_pass
from quickdraft.cli import main


def test_analyze_default_table_is_computed(capsys):
    assert main(["analyze"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip()[:1].isdigit()]
    assert [(float(r[0]), int(r[1])) for r in rows] == [(a, k) for a in (0.5, 0.7, 0.9) for k in (4, 8)]
    for row in rows:
        assert float(row[2]) == round(expected_tokens_per_pass(float(row[0]), int(row[1])), 3)


def test_analyze_one_case_with_cost_ratio(capsys):
    assert main(["analyze", "--alpha", "0.8", "--k", "5", "--cost-ratio", "0.1"]) == 0
    row = capsys.readouterr().out.splitlines()[2].split()
    assert row[:3] == ["0.80", "5", "3.689"] and row[4] == "2.46x"


def test_analyze_bad_input_is_one_line(capsys):
    assert main(["analyze", "--alpha", "0.8"]) == 2
    assert main(["analyze", "--alpha", "1.8", "--k", "3"]) == 2
    assert capsys.readouterr().err.count("quickdraft: error:") == 2


def test_analyze_writes_a_speedup_plot(tmp_path, capsys):
    path = tmp_path / "speedup.png"
    assert main(["analyze", "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {path}" in capsys.readouterr().out


def test_bench_bad_input_is_one_line_before_loading(capsys):
    for argv, message in (
        (["--repeats", "0"], "repeats must be >= 1"),
        (["--per-category", "0"], "--per-category must be >= 1"),
        (["--temperature", "-1"], "temperature must be >= 0"),
    ):
        assert main(["bench", *argv]) == 2
        assert message in capsys.readouterr().err
