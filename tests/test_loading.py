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
    with pytest.raises(QuickdraftError, match=r"could not read GGUF file .*cut.gguf: the file ends inside tensor "
                                              r"\S+ \(bytes .*truncated") as info:
        load_model(str(path), cache_dir=tmp_path / "cache")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "cache" / "converted").exists() or not any((tmp_path / "cache" / "converted").iterdir())


def test_an_unknown_tensor_type_names_the_tensor(random_ggufs, tmp_path):
    data = bytearray(random_ggufs["llama", "F32"].read_bytes())
    name = b"output_norm.weight"
    at = data.index(name) + len(name) + 4 + 8  # past its dimension count and its one dimension: its type
    data[at:at + 4] = (99).to_bytes(4, "little")
    path = tmp_path / "odd.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(QuickdraftError, match=r"odd.gguf: tensor output_norm.weight has ggml type 99"):
        load_model(str(path), cache_dir=tmp_path / "cache")


def test_a_hub_id_that_cannot_be_fetched_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub client's own switch: no network in the test
    with pytest.raises(QuickdraftError, match="could not load model 'no-such-owner/no-such-model'") as info:
        load_model("no-such-owner/no-such-model")
    assert "\n" not in str(info.value)
