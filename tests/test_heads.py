"""Draft-head training on tiny models: data formats, features, draft vocabulary, Medusa and EAGLE
training (the loss falls, training resumes), save and load."""

import json

import pytest
import torch
from heads_util import target_backend

from quickdraft.backends.llama_cpp import llama_cpp_installed
from quickdraft.errors import QuickdraftError
from quickdraft.heads.config import Eagle3Config, EagleConfig
from quickdraft.heads.eagle3 import Eagle3Head
from quickdraft.heads.eagle_head import EagleHead
from quickdraft.heads.format import CONFIG_FILE, load_eagle, load_medusa
from quickdraft.heads.medusa_heads import MedusaHeads
from quickdraft.models.loading import LoadedModel
from quickdraft.training.data import Example, read_examples
from quickdraft.training.distill import answers_file, prompt_key, read_answers, regenerate
from quickdraft.training.features import extract_features, feature_batches, load_features
from quickdraft.training.loop import TrainSettings, held_out
from quickdraft.training.train_command import distilled, feature_decoder
from quickdraft.training.train_eagle import eagle_batch, eagle_sequences, train_eagle
from quickdraft.training.train_medusa import medusa_loss, medusa_positions, train_medusa
from quickdraft.training.vocab import coverage, draft_vocabulary, vocabulary_index


def test_training_files_in_every_format_and_evaluation_sets_refused(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps([{"instruction": "Add", "input": "1 2", "response": "3"}]))
    (tmp_path / "b.jsonl").write_text(json.dumps({"question": "q?", "answer": "a."}) + "\n")
    (tmp_path / "c.txt").write_text("one\n\ntwo\n")
    assert read_examples(tmp_path / "a.json") == [Example("Add\n\n1 2", "3")]
    assert read_examples(tmp_path / "b.jsonl") == [Example("q?", "a.")]
    assert read_examples(tmp_path / "c.txt") == [Example("", "one"), Example("", "two")]
    prompt_sets = [{"prompt": "p", "response": "r"}, {"prompt": "Who?", "answer": ["A", "B"]}, {"prompt": "S"}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(record) + "\n" for record in prompt_sets))
    assert read_examples(tmp_path / "d.jsonl") == [Example("p", "r"), Example("Who?", "A"), Example("S", "")]
    (tmp_path / "test.jsonl").write_text("")
    with pytest.raises(QuickdraftError, match="evaluation set"):
        read_examples(tmp_path / "test.jsonl")
    with pytest.raises(QuickdraftError, match="not found"):
        read_examples(tmp_path / "missing.json")


def test_medusa_head_k_learns_the_targets_choice_k_plus_1_ahead():
    shard = {
        "tokens": torch.arange(6, dtype=torch.int32),
        "choice": torch.arange(100, 106, dtype=torch.int32),
        "hidden": torch.zeros(6, 4, dtype=torch.bfloat16),
        "offsets": torch.tensor([0, 6]),
        "starts": torch.tensor([2]),
    }
    data = medusa_positions([shard], heads=2)
    assert data.rows.tolist() == [0, 1, 2, 3, 4]  # every position with a token after it
    assert data.targets.tolist() == [[101, 102, 103, 104, 105], [102, 103, 104, 105, -1]]


def test_draft_vocabulary_keeps_the_most_frequent_tokens():
    shard = {
        "tokens": torch.tensor([9, 1, 1, 1, 2, 2, 3], dtype=torch.int32),
        "offsets": torch.tensor([0, 7]),
        "starts": torch.tensor([1]),
    }  # 9 is the prompt
    vocab = draft_vocabulary([shard], 2, 10)
    assert vocab.tolist() == [1, 2]
    assert vocabulary_index(vocab, 10).tolist() == [-1, 0, 1, -1, -1, -1, -1, -1, -1, -1]
    assert coverage([shard], vocab, 10) == 5 / 6


def test_eagle_batch_pairs_each_state_with_the_next_token():
    tokens = torch.arange(10, 16)  # 6 tokens
    hidden = torch.arange(6.0)[:, None].expand(6, 2).to(torch.bfloat16)
    data = eagle_sequences(
        [
            {
                "tokens": tokens.int(),
                "choice": (tokens + 1).int(),
                "hidden": hidden,
                "offsets": torch.tensor([0, 6]),
                "starts": torch.tensor([3]),
            }
        ]
    )
    batch = eagle_batch(data, [0], 64, vocabulary_index(torch.arange(20), 20), 0.0, torch.Generator())
    assert batch["hidden"][0, :, 0].tolist() == [0, 1, 2, 3, 4]  # f_j
    assert batch["tokens"][0].tolist() == [11, 12, 13, 14, 15]  # x_{j+1}
    assert batch["targets"][0, :, 0].tolist() == [1, 2, 3, 4, 5]  # f_{j+1}
    assert batch["labels"][0].tolist() == [12, 13, 14, 15, 16]  # the target's choice after j + 1
    assert batch["weight"][0].all()


def test_held_out_examples_stay_held_out_when_the_data_grows():
    generator = torch.Generator().manual_seed(4)

    def shard(examples: int) -> dict[str, torch.Tensor]:
        lengths = torch.randint(3, 9, (examples,), generator=generator)
        return {
            "tokens": torch.randint(50, (int(lengths.sum()),), generator=generator, dtype=torch.int32),
            "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
        }

    old, new = shard(400), shard(200)
    first = held_out([old], TrainSettings())
    assert 8 <= int(first.sum()) <= 40  # about 5%
    grown = held_out([new, old], TrainSettings())  # examples added before and after keep every choice
    assert torch.equal(grown[200:], first) and torch.equal(held_out([old, new], TrainSettings())[:400], first)
    assert not torch.equal(held_out([old], TrainSettings(seed=1)), first)
    assert held_out([shard(1)], TrainSettings()).tolist() == [True]  # at least one


class IdTokenizer:
    """Characters as token ids (0..31), no chat template: enough for features on a tiny model."""

    chat_template = None
    eos_token_id = pad_token_id = None

    def encode(self, text, add_special_tokens=True):
        return [ord(c) % 32 for c in text]


@pytest.fixture(scope="module")
def tiny_shards(tiny_target, tmp_path_factory):
    from quickdraft.training.features import encode_example

    text = "abcdefgh " * 12
    sequences = [encode_example(IdTokenizer(), Example("", text[i:] + text[:i]), 256) for i in range(40)]
    folder = tmp_path_factory.mktemp("features")
    return load_features(extract_features(target_backend(tiny_target), sequences, folder, progress=False))


def test_feature_shards_are_cut_by_content_and_reused_when_examples_are_added(tiny_target, tmp_path):
    generator = torch.Generator().manual_seed(0)
    sequences = [(torch.randint(32, (12,), generator=generator).tolist(), 4) for _ in range(60)]
    folder = extract_features(
        target_backend(tiny_target), sequences, tmp_path / "grown", progress=False, shard_examples=6
    )
    first = {
        name: (folder / name).stat().st_mtime_ns for name in json.loads((folder / "index.json").read_text())["shards"]
    }
    assert len(first) > 4
    added = sequences[:30] + [(torch.randint(32, (12,), generator=generator).tolist(), 4) for _ in range(3)]
    added += sequences[30:]
    grown = load_features(
        extract_features(target_backend(tiny_target), added, folder, progress=False, shard_examples=6)
    )
    now = json.loads((folder / "index.json").read_text())["shards"]
    # Only the shard that took the new examples was made again; every other one was reused as it was.
    assert len(set(first) - set(now)) == 1
    assert all((folder / name).stat().st_mtime_ns == first[name] for name in first)
    fresh = load_features(
        extract_features(target_backend(tiny_target), added, tmp_path / "fresh", progress=False, shard_examples=6)
    )
    assert len(grown) == len(fresh)
    for ours, theirs in zip(grown, fresh):
        assert all(torch.equal(ours[key], theirs[key]) for key in theirs)


def test_feature_batches_group_similar_lengths_within_the_token_budget():
    assert feature_batches([5, 3, 9, 4], 15) == [[1, 3, 0], [2]]  # 3 rows of width 5; 4 of 9 would be 36
    assert feature_batches([5, 3, 9, 4], 100) == [[1, 3, 0, 2]]
    assert feature_batches([5, 3, 9], 1) == [[1], [0], [2]]  # each alone, however long


def test_batched_features_equal_one_example_a_pass(tiny_target, tmp_path):
    generator = torch.Generator().manual_seed(3)
    sequences = [(torch.randint(32, (n,), generator=generator).tolist(), n // 3) for n in range(4, 40, 3)]
    layers = Eagle3Config.from_target(tiny_target.config).features
    batched = load_features(
        extract_features(
            target_backend(tiny_target),
            sequences,
            tmp_path / "batched",
            progress=False,
            layers=layers,
            batch_tokens=256,
        )
    )
    alone = load_features(
        extract_features(
            target_backend(tiny_target), sequences, tmp_path / "alone", progress=False, layers=layers, batch_tokens=1
        )
    )
    assert len(feature_batches([len(ids) for ids, _ in sequences], 256)) < len(sequences)  # passes of several
    assert len(batched) == len(alone)
    for ours, theirs in zip(batched, alone):
        for key in ("tokens", "choice", "offsets", "starts"):
            assert torch.equal(ours[key], theirs[key]), key
        torch.testing.assert_close(ours["hidden"].float(), theirs["hidden"].float(), atol=2e-2, rtol=1e-2)


def test_distilled_answers_are_kept_per_prompt_and_only_new_prompts_run(tiny_target, tmp_path):
    generator = torch.Generator().manual_seed(1)
    sequences = [(torch.randint(1, 32, (5,), generator=generator).tolist() + [0, 0], 5) for _ in range(6)]
    target = LoadedModel.of(tiny_target, IdTokenizer(), "tiny")
    decoder = feature_decoder(target)
    answered = distilled(decoder, sequences[:4], 6, tmp_path, progress=False, batch=2)
    expected = regenerate(decoder, [(ids[:5], 5) for ids, _ in sequences], 6, progress=False)
    assert answered == expected[:4]
    saved = answers_file(tmp_path, "tiny", 6)
    assert len(saved.read_text().splitlines()) == 4
    # A crash in the middle of a line: that answer is made again, the others are read back.
    saved.write_text(saved.read_text()[:-9])
    assert len(read_answers(saved)) == 3
    assert distilled(decoder, sequences, 6, tmp_path, progress=False, batch=2) == expected
    assert len(read_answers(saved)) == 6
    # Lines name prompts by digest; a file of the earlier form (prompt ids in full) is read the same.
    lines = [json.loads(line) for line in saved.read_text().splitlines() if line.endswith("]]")]  # whole ones
    assert len(lines) == 6 and all(len(key) == 16 for key, _ in lines)
    earlier = tmp_path / "earlier" / saved.name
    earlier.parent.mkdir()
    earlier.write_text("".join(json.dumps([ids[:5], ids[5:]]) + "\n" for ids, _ in expected))
    assert read_answers(earlier) == read_answers(saved)
    assert distilled(decoder, sequences, 6, earlier.parent, progress=False, batch=2) == expected
    assert len(earlier.read_text().splitlines()) == 6  # nothing answered again
    # Another target does not read these answers.
    assert answers_file(tmp_path, "other", 6) != saved


@pytest.mark.integration
def test_the_projects_answers_for_the_default_target_are_found_as_the_train_command_asks():
    from pathlib import Path

    from quickdraft.models.embedded import DEFAULT_NAME
    from quickdraft.models.loading import load_model
    from quickdraft.training.features import encode_example

    root = Path(__file__).resolve().parents[1]
    saved = answers_file(root / "data" / "answers", DEFAULT_NAME, 128)  # what `--answers data/answers` reads
    answers = read_answers(saved)
    assert len(answers) == len(saved.read_text().splitlines())  # every line whole, no prompt twice
    loaded = load_model(None)
    vocab = loaded.config.vocab_size
    assert all(0 < len(r) <= 128 and all(0 <= t < vocab for t in r) for r in answers.values())
    # The project's own prompts, and where ../shared/data is here the licensed mix's first 1,000
    # (scripts/licensed_mix.py's defaults), encoded as the train command encodes them, find their answers.
    examples = read_examples(root / "data" / "general-prompts.jsonl")[:200]
    shared = root.parent / "shared" / "data"
    if shared.is_dir():
        from test_licensed_mix import licensed_mix

        mix = licensed_mix.interleave(licensed_mix.read_records(shared, 4000), 2000, 0)[:1000]
        examples += [Example(record["prompt"], "") for record in mix]
    prompts = [ids[:start] for ids, start in (encode_example(loaded.tokenizer, e, 1280) for e in examples)]
    assert all(prompt_key(prompt) in answers for prompt in prompts)


def test_a_fresh_head_is_the_targets_own_next_token_head():
    generator = torch.Generator().manual_seed(0)
    lm_head, hidden = torch.randn(32, 8, generator=generator), torch.randn(5, 8, generator=generator)
    # Zero residual blocks: the target's LM head itself, up to rounding (F.linear against a matmul).
    assert torch.allclose(MedusaHeads(lm_head, 3)(hidden)[1], hidden @ lm_head.T, atol=1e-5)


def test_medusa_training_lowers_the_loss_resumes_and_saves(tiny_target, tiny_shards, tmp_path):
    assert tiny_shards[0]["hidden"].shape[1] == tiny_target.config.hidden_size
    lm_head = tiny_target.lm_head.weight.detach()
    settings = TrainSettings(steps=60, positions=128, lr=3e-3, eval_every=20, checkpoint_every=30, precision="fp32")
    before = MedusaHeads(lm_head, 2)
    data = medusa_positions(tiny_shards, 2)
    first_loss = medusa_loss(before(data.hidden[data.rows].float()), data.targets)[0].item()
    result = train_medusa(tiny_shards, lm_head, 2, tmp_path / "heads", settings, "tiny", progress=False)
    assert result["final_loss"] < 0.7 * first_loss
    assert result["held_out_top1"][0] > 0.5  # a repeating text: head 1 learns it
    loaded = load_medusa(tmp_path / "heads", lm_head)
    hidden = data.hidden[data.rows[:10]].float()
    trained = MedusaHeads(lm_head, 2, loaded.vocab)
    trained.load_state_dict(torch.load(tmp_path / "heads" / "checkpoint.pt")["model"])
    assert torch.equal(loaded(hidden), trained(hidden))
    # Resuming at the last step does nothing more and gives the same heads.
    again = train_medusa(tiny_shards, lm_head, 2, tmp_path / "heads", settings, "tiny", progress=False)
    assert again["steps"] == 60 and torch.equal(load_medusa(tmp_path / "heads", lm_head)(hidden), loaded(hidden))


def test_eagle_training_lowers_the_loss_and_saves(tiny_target, tiny_shards, tmp_path):
    lm_head, embed = tiny_target.lm_head.weight.detach(), tiny_target.model.embed_tokens.weight.detach()
    settings = TrainSettings(
        steps=80, sequences=4, window=64, lr=3e-3, eval_every=40, checkpoint_every=40, precision="fp32"
    )
    fresh = train_eagle(
        tiny_shards,
        lm_head,
        embed,
        tiny_target.config,
        tmp_path / "fresh",
        TrainSettings(steps=1, lr=0.0),
        "tiny",
        progress=False,
    )
    result = train_eagle(
        tiny_shards, lm_head, embed, tiny_target.config, tmp_path / "eagle", settings, "tiny", progress=False
    )
    assert result["final_loss"] < 0.7 * fresh["final_loss"]
    assert result["held_out_top1"][0] > 0.6 > fresh["held_out_top1"][0]
    config = json.loads((tmp_path / "eagle" / "config.json").read_text())
    assert config["kind"] == "eagle" and config["target"] == "tiny"
    head = load_eagle(tmp_path / "eagle", lm_head, embed)
    trained = EagleHead(EagleConfig(**config["layer"]), embed, lm_head, head.vocab)
    trained.load_state_dict(torch.load(tmp_path / "eagle" / "checkpoint.pt")["model"])
    hidden, tokens = torch.randn(1, 5, tiny_target.config.hidden_size), torch.tensor([[1, 2, 3, 4, 5]])
    mask = torch.ones(5, 5, dtype=torch.bool).tril()[None]
    with torch.no_grad():
        assert torch.equal(
            head(hidden, tokens, torch.arange(5)[None], mask), trained(hidden, tokens, torch.arange(5)[None], mask)
        )


def test_eagle_head_with_a_cache_equals_one_pass():
    config = EagleConfig(hidden=16, intermediate=32, heads=4, kv_heads=2, head_dim=4, rope_theta=10000.0, eps=1e-6)
    head = EagleHead(config, torch.randn(20, 16), torch.randn(20, 16), torch.arange(20)).eval()
    hidden, tokens, positions = torch.randn(1, 6, 16), torch.randint(20, (1, 6)), torch.arange(6)[None]
    causal = torch.ones(6, 6, dtype=torch.bool).tril()[None]
    cache = head.new_cache(64)
    with torch.no_grad():
        whole = head(hidden, tokens, positions, causal)
        first = head(hidden[:, :4], tokens[:, :4], positions[:, :4], causal[:, :4, :4], cache)
        cache.advance(4)
        tree = head(hidden[:, 4:], tokens[:, 4:], positions[:, 4:], causal[:, 4:], cache)  # tried, then dropped
        cache.advance(2)
        cache.truncate(4)  # as a drafter drops its tree's entries: a pointer move
        rest = head(hidden[:, 4:], tokens[:, 4:], positions[:, 4:], causal[:, 4:], cache)
    assert cache.capacity >= 6 and cache.length == 4
    assert torch.allclose(torch.cat([first, rest], 1), whole, atol=1e-5) and torch.equal(tree, rest)


def test_train_command_refuses_evaluation_data_before_loading_anything(tmp_path, capsys):
    from quickdraft.cli import main

    data = tmp_path / "spec_bench" / "question.jsonl"
    data.parent.mkdir()
    data.write_text(json.dumps({"category": "qa", "turns": ["q"]}) + "\n")
    assert main(["train", "medusa", "--data", str(data), "--output", str(tmp_path / "out")]) == 2
    assert "evaluation set" in capsys.readouterr().err
    assert main(["train", "eagle", "--data", str(tmp_path / "none.json"), "--output", str(tmp_path)]) == 2
    assert "not found" in capsys.readouterr().err
    good = tmp_path / "train.jsonl"
    good.write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    assert (
        main(
            [
                "train",
                "eagle",
                "--data",
                str(good),
                "--output",
                str(tmp_path / "out"),
                "--distill",
                "8",
                "--distill-batch",
                "0",
            ]
        )
        == 2
    )
    assert "--distill-batch must be >= 1" in capsys.readouterr().err
    assert main(["train", "eagle", "--data", str(good), "--output", str(tmp_path / "out"), "--feature-batch", "0"]) == 2
    assert "--feature-batch must be >= 1" in capsys.readouterr().err
    base = ["train", "eagle", "--data", str(good), "--output", str(tmp_path / "out")]
    assert main([*base, "--prompt-rows", "-0.5"]) == 2
    assert "--prompt-rows must be >= 0" in capsys.readouterr().err
    assert main([*base, "--prompt-rows", "0.5", "--eagle", "1"]) == 2
    assert "--prompt-rows trains EAGLE-3 heads only" in capsys.readouterr().err
    assert main([*base, "--head-layers", "0"]) == 2
    assert "--head-layers must be >= 1" in capsys.readouterr().err
    assert main(["train", "medusa", *base[2:], "--head-layers", "2"]) == 2
    assert "--head-layers stacks EAGLE-3 heads only" in capsys.readouterr().err


def test_training_runs_where_the_device_flag_says(tmp_path, capsys):
    # `train --device` resolves as every other --device does (backends.select.resolve_device).
    from quickdraft.backends.select import resolve_device
    from quickdraft.cli import main

    assert str(resolve_device("auto")) == ("cuda" if torch.cuda.is_available() else "cpu")
    assert str(resolve_device("cpu")) == "cpu"
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    assert main(["train", "eagle", "--data", str(data), "--output", str(tmp_path / "out"), "--device", "tpu"]) == 2
    assert "unknown device" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["train", "eagle", "--data", str(data), "--output", str(tmp_path / "out"), "--device", "cuda"]) == 2
        assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("kernel", ["int8", "int4"])
def test_drafting_copies_agree_with_the_trained_heads(kernel):
    from quickdraft.heads.inference import FusedLayers, QuantizedLayer, for_drafting

    torch.manual_seed(0)  # test-only: reproducible random weights
    lm_head, hidden = torch.randn(64, 32), torch.randn(6, 32)
    medusa = MedusaHeads(lm_head, 2)
    for block in medusa.blocks:
        torch.nn.init.normal_(block.linear.weight, std=0.1)
    exact = medusa(hidden)
    fast = for_drafting(medusa, kernel)
    assert isinstance(fast.blocks[0].linear, QuantizedLayer)
    assert type(fast.blocks[0].linear.inner).__name__ == {"int8": "Int8Linear", "int4": "Int4Linear"}[kernel]
    assert (fast(hidden).argmax(-1) == exact.argmax(-1)).float().mean() > 0.9
    assert torch.allclose(fast(hidden), exact, atol=0.15 * exact.abs().max().item())
    config = EagleConfig(hidden=32, intermediate=64, heads=4, kv_heads=2, head_dim=8, rope_theta=1e4, eps=1e-6)
    eagle = EagleHead(config, torch.randn(64, 32), lm_head, torch.arange(64)).eval()
    args = (hidden[None], torch.arange(6)[None], torch.arange(6)[None], torch.ones(6, 6, dtype=torch.bool).tril()[None])
    with torch.no_grad():
        exact = eagle.logits(eagle(*args)[0])
        fast = for_drafting(eagle, kernel)
        approx = fast.logits(fast(*args)[0])
    # q, k, v and gate, up read one input: one product each, and the separate layers are gone.
    assert set(fast.fused) == {"q+k+v", "gate+up"} and all(isinstance(m, FusedLayers) for m in fast.fused.values())
    assert not hasattr(fast, "q") and not hasattr(fast, "gate")
    assert (approx.argmax(-1) == exact.argmax(-1)).float().mean() > 0.8
    config3 = Eagle3Config(**config.to_dict(), features=(0, 1, 2), layers=2)  # a later layer fuses alike
    eagle3 = Eagle3Head(config3, torch.randn(64, 32), torch.arange(64), lm_head).eval()
    args3 = (torch.randn(1, 6, 96), *args[1:])
    with torch.no_grad():
        exact = eagle3.logits(eagle3(*args3)[0])
        names = set(eagle3.state_dict())
        fast = for_drafting(eagle3, kernel)
        approx = fast.logits(fast(*args3)[0])
    for layer in (fast.midlayer, fast.layers["1"]):
        assert set(layer.self_attn.fused) == {"q_proj+k_proj+v_proj"} and set(layer.mlp.fused) == {"gate_proj+up_proj"}
    assert (approx.argmax(-1) == exact.argmax(-1)).float().mean() > 0.8
    assert names == set(
        Eagle3Head(config3, torch.randn(64, 32), torch.arange(64)).state_dict()
    )  # training layout unchanged


def test_draft_kernel_is_measured_once_and_cached(tmp_path):
    from quickdraft.heads.inference import DRAFT_KERNELS, draft_kernel

    torch.manual_seed(0)  # test-only: reproducible random weights
    config = EagleConfig(hidden=32, intermediate=64, heads=4, kv_heads=2, head_dim=8, rope_theta=1e4, eps=1e-6)
    head = EagleHead(config, torch.randn(64, 32), torch.randn(64, 32), torch.arange(64))
    assert draft_kernel(head, None) == "int8"  # not measuring: the default
    chosen = draft_kernel(head, tmp_path, progress=False)
    assert chosen in DRAFT_KERNELS
    (saved,) = tmp_path.glob("*.json")
    other = next(k for k in DRAFT_KERNELS if k != chosen)
    saved.write_text(saved.read_text().replace(f'"choice": "{chosen}"', f'"choice": "{other}"'))
    assert draft_kernel(head, tmp_path, progress=False) == other  # read back, not measured again


def test_features_and_answers_come_through_the_backend_without_a_transformers_model(tiny_target, tmp_path):
    from quickdraft.models.loading import load_model
    from quickdraft.training.features import target_features

    tiny_target.save_pretrained(tmp_path / "tiny")
    target = load_model(str(tmp_path / "tiny"))
    decoder = feature_decoder(target)
    assert decoder.backend_kind == "native" and decoder.precision == "fp32"  # the checkpoint's own, as saved
    generator = torch.Generator().manual_seed(2)
    sequences = [(torch.randint(32, (n,), generator=generator).tolist(), 3) for n in (7, 12, 20)]
    layers = Eagle3Config.from_target(target.config).features
    made = target_features(decoder.target_backend, sequences, layers) + target_features(
        decoder.target_backend, sequences, ()
    )
    answers = regenerate(decoder, [(ids[:4], 4) for ids, _ in sequences], 6, progress=False)
    assert not target.built  # neither distillation nor features built a transformers model
    for (ids, start), (fused, fused_choice), (last, choice), (answer, _) in zip(sequences, made[:3], made[3:], answers):
        with torch.no_grad():  # transformers' own forward over the same weights
            out = tiny_target.model(torch.tensor([ids]), output_hidden_states=True)
            expected_choice = tiny_target.lm_head(out.last_hidden_state[0]).argmax(-1)
            expected = tiny_target.generate(torch.tensor([ids[:4]]), max_new_tokens=6, do_sample=False)[0].tolist()
        torch.testing.assert_close(last.float(), out.last_hidden_state[0], atol=2e-2, rtol=1e-2)  # stored as bf16
        torch.testing.assert_close(
            fused.float(), torch.cat([out.hidden_states[i][0] for i in layers], -1), atol=2e-2, rtol=1e-2
        )
        assert torch.equal(choice, expected_choice.to(torch.int32))
        assert (fused_choice[: max(start - 2, 0)] == -1).all()  # EAGLE-3: no choices in the prompt
        assert torch.equal(fused_choice[max(start - 2, 0) :], choice[max(start - 2, 0) :])
        assert answer == expected[: len(answer)] and (len(answer) == 10 or answer[-1] in decoder.eos_ids)


@pytest.mark.integration
@pytest.mark.skipif(not llama_cpp_installed(), reason="llama-cpp-python is not installed (./setup.sh builds it)")
@pytest.mark.parametrize("kind", ["F32", "Q4_1"])
def test_a_gguf_target_distils_and_extracts_on_llama_cpp_as_native_does(random_ggufs, tmp_path, kind):
    """The file's weights, llama.cpp's arithmetic: an F32 file's features equal native fp32's to
    their bf16 storage's rounding; a Q4_1 file's (activations rounded to 8 bits for its products)
    within a few percent. The greedy choices and answers agree (a random model's logits have no near ties at
    these prompts)."""
    from quickdraft.models.loading import load_model
    from quickdraft.training.features import target_features

    target = load_model(random_ggufs["llama", kind], cache_dir=tmp_path)
    ours, native = feature_decoder(target), feature_decoder(target, precision="fp32")
    assert (ours.backend_kind, native.backend_kind) == ("llama.cpp", "native")
    generator = torch.Generator().manual_seed(4)
    sequences = [(torch.randint(100, 8000, (n,), generator=generator).tolist(), 3) for n in (9, 30, 70)]
    layers = Eagle3Config.from_target(target.config).features
    tolerance = 0.01 if kind == "F32" else 0.1  # features are kept as bf16 (8 bits of mantissa)
    for backend_features in zip(*(target_features(d.target_backend, sequences, layers) for d in (ours, native))):
        (fused, choice), (fused_native, choice_native) = backend_features
        error = (fused.float() - fused_native.float()).norm(dim=-1) / fused_native.float().norm(dim=-1)
        assert error.max() < tolerance, error.max()
        assert (choice == choice_native).float().mean() >= 0.9
    prompts = [(ids[:5], 5) for ids, _ in sequences]
    assert regenerate(ours, prompts, 8, progress=False) == regenerate(native, prompts, 8, progress=False)


@pytest.mark.parametrize("kind, eagle", [("medusa", 3), ("eagle", 3)])
def test_quickdraft_train_distils_and_extracts_through_the_backend_on_the_default_target(tmp_path, capsys, kind, eagle):
    from quickdraft.cli import main

    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(
            json.dumps({"question": f"Count to {n}.", "answer": " ".join(map(str, range(n)))}) + "\n"
            for n in range(3, 9)
        )
    )
    out = tmp_path / kind
    assert (
        main(
            [
                "train",
                kind,
                "--data",
                str(data),
                "--output",
                str(out),
                "--distill",
                "6",
                "--steps",
                "3",
                "--vocab",
                "64",
                "--eagle",
                str(eagle),
                "--device",
                "cpu",
                "--precision",
                "fp32",
                *(["--answers", str(tmp_path / "answers")] if kind == "eagle" else []),
            ]
        )
        == 0
    )
    config = json.loads((out / CONFIG_FILE).read_text())
    assert config["kind"] == kind and config["target"] == "SmolLM2-135M-Instruct"
    assert "trained a" in capsys.readouterr().out
    kept = tmp_path / "answers" if kind == "eagle" else out / "cache"  # --answers, else the cache
    answers = list(kept.glob("answers-*.jsonl"))  # the target's own answers, kept
    assert len(answers) == 1 and len(answers[0].read_text().splitlines()) == 6
    assert kind == "medusa" or not list((out / "cache").glob("answers-*.jsonl"))
