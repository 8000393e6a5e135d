"""Loading: clear one-line errors for missing or unreadable models; local folders work."""

import pytest

import quickdraft
from quickdraft import QuickdraftError
from quickdraft.models.loading import load_model


def test_missing_path_is_a_one_line_error(tmp_path):
    with pytest.raises(QuickdraftError, match="no such file or folder") as info:
        load_model(str(tmp_path / "missing-model"))
    assert "\n" not in str(info.value)


def test_file_that_is_not_gguf_is_refused(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\x00" * 10)
    with pytest.raises(QuickdraftError, match="not a .gguf"):
        load_model(str(path))


def test_unreadable_gguf_is_a_one_line_error(tmp_path):
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"GGUF but not really")
    with pytest.raises(QuickdraftError, match="could not read GGUF file") as info:
        load_model(str(path), cache_dir=tmp_path / "cache")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "cache" / "converted").exists() or not any((tmp_path / "cache" / "converted").iterdir())


def test_folder_without_model_is_refused(tmp_path):
    with pytest.raises(QuickdraftError, match="no config.json"):
        load_model(str(tmp_path))


def test_local_folder_loads_and_generates_like_the_model(tmp_path, tiny_target):
    tiny_target.save_pretrained(tmp_path / "tiny")
    decoder = quickdraft.load(str(tmp_path / "tiny"), method="none")
    direct = quickdraft.load(tiny_target, method="none")
    prompt = [3, 4, 5]
    assert decoder.generate(prompt, max_new_tokens=10).token_ids == direct.generate(prompt, max_new_tokens=10).token_ids
    assert decoder.tokenizer is None  # no tokenizer files: token-id prompts only


def test_a_truncated_gguf_names_the_tensor_and_leaves_no_cache(random_ggufs, tmp_path):
    whole = random_ggufs["llama", "F32"].read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(whole[: len(whole) * 2 // 3])
    with pytest.raises(
        QuickdraftError,
        match=r"could not read GGUF file .*cut.gguf: the file ends inside tensor "
        r"\S+ \(bytes .*truncated",
    ) as info:
        load_model(str(path), cache_dir=tmp_path / "cache")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "cache" / "converted").exists() or not any((tmp_path / "cache" / "converted").iterdir())


def test_an_unknown_tensor_type_names_the_tensor(random_ggufs, tmp_path):
    data = bytearray(random_ggufs["llama", "F32"].read_bytes())
    name = b"output_norm.weight"
    at = data.index(name) + len(name) + 4 + 8  # past its dimension count and its one dimension: its type
    data[at : at + 4] = (99).to_bytes(4, "little")
    path = tmp_path / "odd.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(QuickdraftError, match=r"odd.gguf: tensor output_norm.weight has ggml type 99"):
        load_model(str(path), cache_dir=tmp_path / "cache")


def test_a_hub_id_that_cannot_be_fetched_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub client's own switch: no network in the test
    with pytest.raises(QuickdraftError, match="could not load model 'no-such-owner/no-such-model'") as info:
        load_model("no-such-owner/no-such-model")
    assert "\n" not in str(info.value)


def test_the_hf_backend_builds_the_checkpoint_in_its_own_dtype_and_another_only_when_asked(tmp_path, tiny_target):
    import copy

    import torch

    from quickdraft.memory import plan_memory, read_shape

    folder = tmp_path / "tiny-bf16"
    copy.deepcopy(tiny_target).to(torch.bfloat16).save_pretrained(folder)  # on disk in bf16 (the fixture untouched)
    target = load_model(str(folder))
    assert target.stored_precision == "bf16" and not target.built  # nothing built by loading
    assert read_shape(folder).stored == "bf16"  # `quickdraft plan` reads it from the headers alone
    own = quickdraft.Decoder(target, None, "none", backend="hf")
    assert own.precision == "bf16" and own.target_backend.model.dtype == torch.bfloat16
    assert list(target.built) == [torch.bfloat16]  # no fp32 copy beside it
    asked = quickdraft.Decoder(target, None, "none", backend="hf", precision="fp32")
    assert asked.target_backend.model.dtype == torch.float32 and set(target.built) == {torch.bfloat16, torch.float32}
    assert quickdraft.Decoder(target, None, "none", backend="hf").target_backend is own.target_backend  # kept
    from quickdraft.cli import planned_choice

    choice = planned_choice(read_shape(folder), "hf", None, "cpu")
    assert choice.precision == "bf16"  # the plan chooses as the loader does
    report = plan_memory(read_shape(folder), backend="hf", precision=choice.precision)
    assert report.target_weights == sum(p.numel() for p in tiny_target.parameters()) * 2  # bf16: 2 bytes each
    # Greedy, plain and speculative, against transformers' own generate in bf16: equal, except that
    # below fp32 a pass of other rows may round a near-tie the other way (then the two logits at
    # the first difference are within bf16 rounding of each other).
    model = target.built[torch.bfloat16]
    for prompt in ([3, 1, 4, 1, 5], [7, 7, 2, 7, 7, 2, 7]):
        ids = torch.tensor([prompt])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=12,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
        )
        expected, scores = out.sequences[0, len(prompt) :].tolist(), [s[0].float() for s in out.scores]
        for decoder in (own, quickdraft.Decoder(target, None, "prompt-lookup", 3, backend="hf", draft_length="fixed")):
            made = decoder.generate(prompt, max_new_tokens=12).token_ids
            first = next((i for i, (a, b) in enumerate(zip(made, expected)) if a != b), None)
            if first is None:
                assert made == expected
            else:
                gap = (scores[first][expected[first]] - scores[first][made[first]]).abs()
                assert gap <= 0.02 * scores[first].abs().max(), (prompt, first, gap)
