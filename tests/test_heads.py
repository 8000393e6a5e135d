"""Draft-head training on tiny models: data formats, features, Medusa training, save and load."""

import json

import pytest
import torch

from quickdraft.errors import QuickdraftError
from quickdraft.heads.data import Example, read_examples
from quickdraft.heads.features import extract_features, load_features
from quickdraft.heads.medusa import MedusaHeads, medusa_loss
from quickdraft.heads.train import TrainSettings, load_medusa, medusa_positions, train_medusa


class IdTokenizer:
    """Characters as token ids (0..31), no chat template: enough for features on a tiny model."""

    chat_template = None

    def encode(self, text, add_special_tokens=True):
        return [ord(c) % 32 for c in text]


def test_training_files_in_every_format_and_evaluation_sets_refused(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps([{"instruction": "Add", "input": "1 2", "response": "3"}]))
    (tmp_path / "b.jsonl").write_text(json.dumps({"question": "q?", "answer": "a."}) + "\n")
    (tmp_path / "c.txt").write_text("one\n\ntwo\n")
    assert read_examples(tmp_path / "a.json") == [Example("Add\n\n1 2", "3")]
    assert read_examples(tmp_path / "b.jsonl") == [Example("q?", "a.")]
    assert read_examples(tmp_path / "c.txt") == [Example("", "one"), Example("", "two")]
    (tmp_path / "test.jsonl").write_text("")
    with pytest.raises(QuickdraftError, match="evaluation set"):
        read_examples(tmp_path / "test.jsonl")
    with pytest.raises(QuickdraftError, match="not found"):
        read_examples(tmp_path / "missing.json")


def test_head_targets_are_the_tokens_k_plus_2_ahead():
    shard = {"tokens": torch.arange(6, dtype=torch.int32), "hidden": torch.zeros(6, 4, dtype=torch.bfloat16),
             "offsets": torch.tensor([0, 6]), "starts": torch.tensor([2])}
    data = medusa_positions([shard], heads=2)
    assert data.rows.tolist() == [1, 2, 3, 4]  # from the last prompt token to the one before the end
    assert data.targets.tolist() == [[3, 4, 5, -1], [4, 5, -1, -1]]


def test_a_fresh_head_is_the_targets_own_next_token_head():
    lm_head = torch.randn(32, 8)
    hidden = torch.randn(5, 8)
    assert torch.allclose(MedusaHeads(lm_head, 3)(hidden)[1], hidden @ lm_head.T)


def test_medusa_training_lowers_the_loss_resumes_and_saves(tiny_target, tmp_path):
    text = "abcdefgh " * 12
    examples = [Example("", text[i:] + text[:i]) for i in range(40)]
    features = extract_features(tiny_target, IdTokenizer(), examples, tmp_path / "features", progress=False)
    shards = load_features(features)
    assert shards[0]["hidden"].shape[1] == tiny_target.config.hidden_size
    lm_head = tiny_target.lm_head.weight.detach()
    settings = TrainSettings(steps=60, positions=128, lr=3e-3, eval_every=20, checkpoint_every=30)
    before = MedusaHeads(lm_head, 2)
    data = medusa_positions(shards, 2)
    first_loss = medusa_loss(before(data.hidden[data.rows].float()), data.targets)[0].item()
    result = train_medusa(shards, lm_head, 2, tmp_path / "heads", settings, "tiny", progress=False)
    assert result["final_loss"] < 0.7 * first_loss
    assert result["held_out_top1"][0] > 0.5  # a repeating text: head 1 learns it
    loaded = load_medusa(tmp_path / "heads", lm_head)
    hidden = data.hidden[data.rows[:10]].float()
    trained = MedusaHeads(lm_head, 2)
    trained.load_state_dict(torch.load(tmp_path / "heads" / "checkpoint.pt")["model"])
    assert torch.equal(loaded(hidden), trained(hidden))
    # Resuming at the last step does nothing more and gives the same heads.
    again = train_medusa(shards, lm_head, 2, tmp_path / "heads", settings, "tiny", progress=False)
    assert again["steps"] == 60 and torch.equal(load_medusa(tmp_path / "heads", lm_head)(hidden), loaded(hidden))


def test_train_command_refuses_evaluation_data_before_loading_anything(tmp_path, capsys):
    from quickdraft.cli import main

    data = tmp_path / "spec_bench" / "question.jsonl"
    data.parent.mkdir()
    data.write_text(json.dumps({"category": "qa", "turns": ["q"]}) + "\n")
    assert main(["train", "medusa", "--data", str(data), "--output", str(tmp_path / "out")]) == 2
    assert "evaluation set" in capsys.readouterr().err
    assert main(["train", "medusa", "--data", str(tmp_path / "none.json"), "--output", str(tmp_path)]) == 2
