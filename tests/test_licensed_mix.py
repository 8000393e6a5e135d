"""scripts/licensed_mix.py: only permissive licences reach a shipped head's data; the kinds take turns."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "licensed_mix.py"
spec = importlib.util.spec_from_file_location("licensed_mix", SCRIPT)
licensed_mix = importlib.util.module_from_spec(spec)
spec.loader.exec_module(licensed_mix)


def test_only_permissive_licences_are_shippable():
    for license in ("Apache-2.0", "MIT", "CC-BY-4.0", "CC-BY-2.0-FR (Tatoeba)", "MIT (DuoRC)"):
        assert licensed_mix.shippable(license), license
    for license in (
        "CC-BY-SA-3.0",
        "CC-BY-SA-4.0 (FLORES-200)",
        "MIT (KILT) / CC-BY-SA-4.0 (HotpotQA)",  # one of its parts is share-alike
        "unknown on the xsum card (BBC article text); XSum code MIT",
        "CC-BY-NC-4.0",
        "GPL-3.0",
    ):
        assert not licensed_mix.shippable(license), license


def test_the_mix_keeps_shippable_records_of_each_kind_in_turn(tmp_path):
    def record(kind: str, license: str, i: int) -> str:
        return json.dumps({"kind": kind, "license": license, "prompt": f"{kind} {i}"}) + "\n"

    for name in licensed_mix.FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    (tmp_path / "webquestions/questions.jsonl").write_text("".join(record("qa", "CC-BY-4.0", i) for i in range(5)))
    (tmp_path / "nq_efficientqa/questions.jsonl").write_text("".join(record("qa", "CC-BY-SA-3.0", i) for i in range(5)))
    (tmp_path / "pubmedqa/pqal_rag.jsonl").write_text("".join(record("rag", "MIT", i) for i in range(2)))
    (tmp_path / "oasst_prompts/prompts.jsonl").write_text(record("chat", "Apache-2.0", 0) + record("other", "MIT", 1))
    mix = licensed_mix.interleave(licensed_mix.read_records(tmp_path, 100), per_kind=3, seed=0)
    assert [r["kind"] for r in mix] == ["qa", "rag", "chat", "qa", "rag", "qa"]
    assert all(r["license"] != "CC-BY-SA-3.0" and r["response"] == "" for r in mix)
    assert licensed_mix.read_records(tmp_path, 3)["qa"] == []  # prompts over max_chars are left out
