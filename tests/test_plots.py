from quickdraft.plots import (
    plot_acceptance_by_position,
    plot_grouped_bars,
    plot_speedup_vs_k,
    plot_tokens_per_second_vs_k,
)

PNG = b"\x89PNG\r\n\x1a\n"


def test_each_plot_writes_a_png(tmp_path):
    paths = [
        plot_speedup_vs_k(tmp_path / "a.png", [0.5, 0.9], cost_ratio=0.05),
        plot_acceptance_by_position(tmp_path / "b.png", {"draft": [0.8, 0.6, 0.4], "lookup": [0.5, 0.3]}),
        plot_grouped_bars(
            tmp_path / "sub" / "c.png",
            {"none": {"qa": 30.0, "rag": 14.0}, "lookup": {"qa": 31.0, "rag": 18.0}},
            "tokens / s",
            "by group",
            reference=1.0,
        ),
        plot_tokens_per_second_vs_k(tmp_path / "d.png", {"prompt-lookup": [(4.0, 30.0), (1.5, 25.0)]}, 24.0),
    ]
    for path in paths:
        assert path.read_bytes()[:8] == PNG
