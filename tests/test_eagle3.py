"""EAGLE-3 heads: unrolled training equals drafting, training improves held-out top-1, saved heads load back."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import loaded
from heads_util import target_backend
from test_heads import IdTokenizer
from transformers import Gemma3TextConfig, LlamaConfig

from quickdraft import Decoder
from quickdraft.errors import QuickdraftError
from quickdraft.heads.config import Eagle3Config, EagleConfig, feature_layers
from quickdraft.heads.eagle3 import Eagle3Head
from quickdraft.heads.format import load_eagle
from quickdraft.models.rotary import rotate
from quickdraft.training.data import Example
from quickdraft.training.features import encode_example, extract_features, load_features
from quickdraft.training.loop import TrainSettings, training_vocabulary
from quickdraft.training.train_eagle import Sequences, eagle_batch
from quickdraft.training.train_eagle3 import train_eagle3, unroll_mask, unrolled_loss, unrolled_states
from quickdraft.training.train_precision import PRECISIONS
from quickdraft.training.vocab import coverage, draft_vocabulary, vocabulary_index

H, V = 32, 50
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
CONFIG = Eagle3Config(
    hidden=H, intermediate=64, heads=4, kv_heads=2, head_dim=8, rope_theta=10000.0, eps=1e-6, features=(0, 1, 2)
)


def tiny_head(seed: int = 0, layers: int = 1) -> Eagle3Head:
    torch.manual_seed(seed)
    head = Eagle3Head(replace(CONFIG, layers=layers), torch.randn(V, H), torch.arange(0, V, 2))
    for parameter in head.parameters():  # norms too: a test of where each weight goes
        torch.nn.init.normal_(parameter, std=0.3)
    return head.eval()


def test_feature_layers_are_low_middle_high():
    assert feature_layers(30) == (2, 15, 27)
    assert feature_layers(32) == (2, 16, 29)


def test_the_head_rotates_like_the_target():
    """transformers 5 keeps the rotary base in rope_parameters (per layer type for Gemma 3)."""
    assert Eagle3Config.from_target(LlamaConfig(rope_theta=12345.0)).rope_theta == 12345.0
    assert Eagle3Config.from_target(Gemma3TextConfig(rope_theta=5e5)).rope_theta == 5e5
    assert EagleConfig.from_target(LlamaConfig(rope_theta=100000.0)).rope_theta == 100000.0


def test_unroll_mask_is_the_drafting_tree_attention():
    mask = unroll_mask(5, 2)  # [T, 3T]
    t = 4
    assert mask[t, :5].tolist() == [True, True, True, False, False]  # verified pairs up to t - 2
    assert mask[t, 5:10].tolist() == [False, False, False, True, False]  # step 1: its parent at t - 1
    assert mask[t, 10:].tolist() == [False, False, False, False, True]  # itself
    assert not mask[1, :5].any() and mask[1, 11]  # t < step: nothing verified (such rows have no loss)


@pytest.mark.parametrize("layers", [1, 2, 3])
@torch.no_grad()
def test_unrolled_steps_equal_drafting_with_a_cache(layers):
    """h^j at t from the unrolled training pass == the drafter's chain node at depth j, whose
    parent chain starts after verified pairs 0..t-j (every layer of the head keeps its own keys)."""
    head = tiny_head(layers=layers)
    t, steps = 12, 4
    features = torch.randn(1, t, 3 * H)
    tokens = torch.randint(0, V, (1, t))
    positions = torch.arange(t)[None]
    states = list(unrolled_states(head, features, tokens, positions, steps))
    for root in (3, 6):
        cache = head.new_cache(64)
        mask = torch.ones(root, root, dtype=torch.bool).tril()[None]
        out = head(features[:, :root], tokens[:, :root], positions[:, :root], mask, cache)
        cache.advance(root)
        predicted = out[0, -1]
        torch.testing.assert_close(predicted, states[0][0, root - 1], atol=1e-5, rtol=1e-5)
        for depth in range(1, steps):
            position = root + depth - 1
            mask = torch.ones(1, 1, cache.length + 1, dtype=torch.bool)
            out = head(
                predicted[None, None], tokens[:, position : position + 1], torch.tensor([[position]]), mask, cache
            )
            cache.advance(1)
            predicted = out[0, 0]
            torch.testing.assert_close(predicted, states[depth][0, position], atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_later_layers_are_plain_pre_norm_layers_over_the_first():
    """A two-layer head's output == its first layer's, then a pre-norm attention and MLP written out here."""
    head = tiny_head(layers=2)
    t = 6
    features, tokens, positions = torch.randn(1, t, 3 * H), torch.randint(0, V, (1, t)), torch.arange(t)[None]
    mask = torch.ones(t, t, dtype=torch.bool).tril()[None]
    one = Eagle3Head(CONFIG, head.embed, head.vocab)
    one.load_state_dict({k: v for k, v in head.state_dict().items() if not k.startswith("layers.")})
    first = one(features, tokens, positions, mask)  # [1, T, H]
    layer, c = head.layers["1"], CONFIG
    x = layer.input_layernorm(first)
    cos, sin = head.rotation(positions)
    q = rotate(layer.self_attn.q_proj(x).view(1, t, c.heads, c.head_dim).transpose(1, 2), cos, sin)
    k = rotate(layer.self_attn.k_proj(x).view(1, t, c.kv_heads, c.head_dim).transpose(1, 2), cos, sin)
    v = layer.self_attn.v_proj(x).view(1, t, c.kv_heads, c.head_dim).transpose(1, 2)
    k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)  # 4 query heads share 2 kv heads
    scores = (q @ k.transpose(-1, -2)) / c.head_dim**0.5 + torch.where(mask, 0.0, -torch.inf)[:, None]
    attended = (scores.softmax(-1) @ v).transpose(1, 2).reshape(1, t, -1)
    y = first + layer.self_attn.o_proj(attended)
    z = layer.post_attention_layernorm(y)
    expected = y + layer.mlp.down_proj(torch.nn.functional.silu(layer.mlp.gate_proj(z)) * layer.mlp.up_proj(z))
    torch.testing.assert_close(head(features, tokens, positions, mask), expected, atol=1e-5, rtol=1e-5)
    assert head.new_cache(8).layers == 2
    assert (
        Eagle3Config.from_dict({k: v for k, v in CONFIG.to_dict().items() if k != "layers"}).layers == 1
    )  # older heads
    with pytest.raises(QuickdraftError, match="at least one layer"):
        replace(CONFIG, layers=0)


# --- training and saving on a tiny target -----------------------------------------------------


def target_tables(target) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The target's LM head, final norm and embedding weights: what a head trains over."""
    return target.lm_head.weight.detach(), target.model.norm.weight.detach(), target.model.embed_tokens.weight.detach()


def fused_sequences() -> list[tuple[list[int], int]]:
    """40 examples of a repeating text, prompts 1 to 40 characters long: what `fused` extracts."""
    text = "abcdefgh ijk " * 10
    return [encode_example(IdTokenizer(), Example(text[:i], text[i:] + text[:i]), 256) for i in range(1, 41)]


@pytest.fixture(scope="module")
def fused(tiny_target, tmp_path_factory):
    """Features of a repeating text at the tiny target's layers (0, 1, 1), and the head's config."""
    config = Eagle3Config.from_target(tiny_target.config)
    sequences = fused_sequences()
    folder = tmp_path_factory.mktemp("fused")
    shards = load_features(
        extract_features(target_backend(tiny_target), sequences, folder, progress=False, layers=config.features)
    )
    assert shards[0]["hidden"].shape[1] == 3 * tiny_target.config.hidden_size
    return shards, config


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_training_improves_held_out_top1_at_every_depth_and_saves(tiny_target, fused, tmp_path, precision):
    shards, config = fused
    tables = target_tables(tiny_target)
    fresh = train_eagle3(
        shards, *tables, config, tmp_path / "fresh", TrainSettings(steps=1, lr=0.0, unroll=3), "tiny", progress=False
    )
    settings = TrainSettings(
        steps=80, sequences=4, window=64, lr=3e-3, unroll=3, eval_every=40, checkpoint_every=40, precision=precision
    )
    result = train_eagle3(shards, *tables, config, tmp_path / "eagle3", settings, "tiny", progress=False)
    assert result["settings"]["precision"] == precision
    assert len(result["held_out_top1"]) == 3  # one per unrolled step: depth 1, 2, 3 guesses
    for before, after in zip(fresh["held_out_top1"], result["held_out_top1"]):
        assert after > max(0.6, before + 0.2)
    saved = json.loads((tmp_path / "eagle3" / "config.json").read_text())
    assert saved["kind"] == "eagle" and saved["layer"]["features"] == list(config.features)
    head = load_eagle(tmp_path / "eagle3", tables[0], tables[2])
    assert isinstance(head, Eagle3Head)
    trained = Eagle3Head(config, tables[2], head.vocab)
    trained.load_state_dict(torch.load(tmp_path / "eagle3" / "checkpoint.pt")["model"])
    features, tokens = torch.randn(1, 5, 3 * config.hidden), torch.tensor([[1, 2, 3, 4, 5]])
    mask = torch.ones(5, 5, dtype=torch.bool).tril()[None]
    with torch.no_grad():
        out = head(features, tokens, torch.arange(5)[None], mask)
        assert torch.equal(out, trained(features, tokens, torch.arange(5)[None], mask))
        assert torch.equal(head.logits(out), trained.logits(out))
    # Resuming at the last step trains nothing more and saves the same head.
    again = train_eagle3(shards, *tables, config, tmp_path / "eagle3", settings, "tiny", progress=False)
    assert again["steps"] == 80 and again["held_out_top1"] == result["held_out_top1"]


def test_auto_precision_is_measured_once_per_run_folder_and_recorded(tiny_target, fused, tmp_path):
    shards, config = fused
    tables = target_tables(tiny_target)
    settings = TrainSettings(steps=2, sequences=2, window=32, unroll=2)  # precision "auto"
    result = train_eagle3(shards, *tables, config, tmp_path, settings, "tiny", progress=False)
    assert result["settings"]["precision"] in PRECISIONS
    measured = [json.loads(path.read_text()) for path in tmp_path.glob("*.json") if path.name != "config.json"]
    assert len(measured) == 1 and measured[0]["choice"] == result["settings"]["precision"]
    again = train_eagle3(shards, *tables, config, tmp_path, replace(settings, steps=4), "tiny", progress=False)
    assert again["steps"] == 4 and again["settings"]["precision"] == result["settings"]["precision"]
    assert len(list(tmp_path.glob("*.json"))) == 2  # resumed with more steps: the measurement was reused
    with pytest.raises(ValueError, match="training precision"):
        train_eagle3(
            shards, *tables, config, tmp_path / "bad", replace(settings, precision="fp16"), "tiny", progress=False
        )


def test_a_run_resumed_on_other_data_keeps_the_vocabulary_its_head_learned(tiny_target, fused, tmp_path):
    shards, config = fused
    tables = target_tables(tiny_target)
    settings = TrainSettings(steps=2, sequences=2, window=32, unroll=2, vocab=6, precision="fp32")
    train_eagle3(shards, *tables, config, tmp_path, settings, "tiny", progress=False)
    first = load_eagle(tmp_path, tables[0], tables[2])
    full = tables[0].shape[0]
    grown = [{**shard, "tokens": (shard["tokens"] + 7) % full} for shard in shards]  # other text, other vocabulary
    assert not torch.equal(draft_vocabulary(grown, 6, full), first.vocab)
    assert torch.equal(training_vocabulary(grown, settings, full, tmp_path), first.vocab)
    again = train_eagle3(grown, *tables, config, tmp_path, replace(settings, steps=4), "tiny", progress=False)
    resumed = load_eagle(tmp_path, tables[0], tables[2])
    assert torch.equal(resumed.vocab, first.vocab)  # its LM head rows still mean the tokens they learned
    assert again["draft_vocab_coverage"] == round(coverage(grown, first.vocab, full), 4)  # and labels used it


def test_a_run_can_fine_tune_a_saved_head(tiny_target, fused, tmp_path):
    """--init: the run starts from the head's weights and keeps its draft vocabulary, whatever data it reads."""
    shards, config = fused
    tables = target_tables(tiny_target)
    settings = TrainSettings(steps=40, sequences=4, window=64, lr=3e-3, unroll=2, vocab=6, precision="fp32")
    first = train_eagle3(shards, *tables, config, tmp_path / "first", settings, "tiny", progress=False)
    full = tables[0].shape[0]
    grown = [{**shard, "tokens": (shard["tokens"] + 7) % full} for shard in shards]
    still = replace(settings, steps=1, lr=0.0)  # a step that moves nothing: the run holds the head it started from
    tuned = train_eagle3(
        grown, *tables, config, tmp_path / "tuned", still, "tiny", progress=False, init=tmp_path / "first"
    )
    assert tuned["init"] == str(tmp_path / "first")
    before, after = load_eagle(tmp_path / "first", *tables[::2]), load_eagle(tmp_path / "tuned", *tables[::2])
    assert torch.equal(after.vocab, before.vocab)
    for name, value in before.state_dict().items():
        assert torch.equal(after.state_dict()[name], value), name
    fresh = train_eagle3(shards, *tables, config, tmp_path / "fresh", still, "tiny", progress=False)
    again = train_eagle3(
        shards, *tables, config, tmp_path / "again", still, "tiny", progress=False, init=tmp_path / "first"
    )
    assert again["held_out_top1"] == first["held_out_top1"] != fresh["held_out_top1"]  # it starts trained
    with pytest.raises(QuickdraftError, match="no quickdraft head"):
        train_eagle3(shards, *tables, config, tmp_path / "x", still, "tiny", progress=False, init=tmp_path / "none")
    other = replace(config, intermediate=config.intermediate * 2)
    with pytest.raises(QuickdraftError, match="another target"):
        train_eagle3(shards, *tables, other, tmp_path / "y", still, "tiny", progress=False, init=tmp_path / "first")


def test_a_saved_head_grows_layers_that_start_silent_then_learn(tiny_target, fused, tmp_path):
    """--init with --head-layers above the head's: the grown head guesses as the saved one did
    until trained; its new layer then learns, and a head cannot shrink."""
    shards, config = fused
    tables = target_tables(tiny_target)
    settings = TrainSettings(steps=20, sequences=4, window=64, lr=3e-3, unroll=2, vocab=6, precision="fp32")
    first = train_eagle3(shards, *tables, config, tmp_path / "first", settings, "tiny", progress=False)
    two = replace(config, layers=2)
    still = replace(settings, steps=1, lr=0.0)
    grown = train_eagle3(
        shards, *tables, two, tmp_path / "grown", still, "tiny", progress=False, init=tmp_path / "first"
    )
    assert grown["layer"]["layers"] == 2 and grown["held_out_top1"] == first["held_out_top1"]
    before, after = load_eagle(tmp_path / "first", *tables[::2]), load_eagle(tmp_path / "grown", *tables[::2])
    features, tokens = torch.randn(1, 5, 3 * config.hidden), torch.tensor([[1, 2, 3, 4, 5]])
    mask = torch.ones(5, 5, dtype=torch.bool).tril()[None]
    with torch.no_grad():
        torch.testing.assert_close(
            after(features, tokens, torch.arange(5)[None], mask), before(features, tokens, torch.arange(5)[None], mask)
        )
    trained = train_eagle3(
        shards, *tables, two, tmp_path / "trained", settings, "tiny", progress=False, init=tmp_path / "first"
    )
    layer = load_eagle(tmp_path / "trained", *tables[::2]).layers["1"]
    assert layer.self_attn.o_proj.weight.abs().sum() > 0 and layer.mlp.down_proj.weight.abs().sum() > 0
    with pytest.raises(QuickdraftError, match="cannot hold"):
        train_eagle3(shards, *tables, config, tmp_path / "z", still, "tiny", progress=False, init=tmp_path / "grown")
    assert trained["steps"] == 20


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_training_on_a_gpu_learns_and_saves_a_head_that_loads_on_the_cpu(tiny_target, fused, tmp_path):
    # `quickdraft train --device cuda`: batches drawn on the CPU, the head trained on the GPU.
    shards, config = fused
    tables = target_tables(tiny_target)
    fresh = train_eagle3(
        shards,
        *tables,
        config,
        tmp_path / "fresh",
        TrainSettings(steps=1, lr=0.0, unroll=3, device="cuda"),
        "tiny",
        progress=False,
    )
    settings = TrainSettings(steps=80, sequences=4, window=64, lr=3e-3, unroll=3, device="cuda", precision="fp32")
    result = train_eagle3(shards, *tables, config, tmp_path / "gpu", settings, "tiny", progress=False)
    for before, after in zip(fresh["held_out_top1"], result["held_out_top1"]):
        assert after > max(0.6, before + 0.2)
    head = load_eagle(tmp_path / "gpu", tables[0], tables[2])
    assert all(p.device.type == "cpu" for p in head.parameters())


def test_eagle3_heads_are_refused_where_they_cannot_run(tiny_target, fused, tmp_path):
    shards, config = fused
    tables = target_tables(tiny_target)
    train_eagle3(shards, *tables, config, tmp_path / "h", TrainSettings(steps=2, unroll=2), "t", progress=False)
    with pytest.raises(QuickdraftError, match="own LM head"):
        Decoder(loaded(tiny_target, "t"), None, "eagle", head=str(tmp_path / "h"), full_vocab=True)
    # (llama.cpp returns inner layers for some architectures only: tests/test_kinds.py, test_llama_cpp_backend.py)


# --- prompt rows ---------------------------------------------------------------------------------


def test_path_counts_the_inputs_that_were_the_targets_choices():
    """x_{j+1} == c(j) unbroken up to j: how many unrolled steps at j are a path drafting could have accepted."""
    tokens, choice = torch.tensor([5, 6, 7, 8, 9, 10]), torch.tensor([6, 7, 0, 9, 10, -1])
    data = Sequences([tokens], [choice], [torch.zeros(6, H)], [6])
    batch = eagle_batch(data, [0], 16, torch.arange(V), 0.0, torch.Generator())
    assert batch["path"].tolist() == [[1, 2, 0, 1, 2]]  # 8 was not the target's choice 0


def test_prompt_rows_count_where_asked_and_deep_steps_only_on_accepted_paths():
    head = tiny_head()
    torch.manual_seed(3)
    n = 12
    tokens = torch.randint(1, V // 2, (n,)) * 2  # in the draft vocabulary (the even tokens)
    choice = torch.cat([tokens[1:], torch.tensor([2])])  # the target chose each next token...
    choice[4] = 0  # ...but one: token 5 is a person's, a path through it is never accepted
    data = Sequences([tokens], [choice], [torch.randn(n, 3 * H)], [9])  # the response from token 9
    batch = eagle_batch(data, [0], 16, vocabulary_index(head.vocab, V), 0.0, torch.Generator())
    states = list(unrolled_states(head, batch["hidden"], batch["tokens"], batch["positions"], 2))
    labels = batch["labels"]

    def ce(step: int, rows: torch.Tensor, share: torch.Tensor) -> torch.Tensor:
        per_row = torch.nn.functional.cross_entropy(head.logits(states[step][rows]), labels[rows], reduction="none")
        return (per_row * share[rows]).sum() / share[rows].sum()

    with torch.no_grad():
        response = batch["response"] & (labels >= 0)
        alone, _ = unrolled_loss(head, batch, 1, "response")
        torch.testing.assert_close(alone, ce(0, response, torch.ones_like(labels, dtype=torch.float)))
        weighted, _ = unrolled_loss(head, batch, 2, "response", prompt_rows=0.25)
        share = torch.where(batch["response"], 1.0, 0.25)
        every = batch["weight"] & (labels >= 0)
        accepted = every & (batch["path"] >= 1) & (torch.arange(n - 1) >= 1)[None]  # row 0: no parent
        assert every.all() and not accepted[0, 4]  # row 4's input was not the target's choice
        expected = (ce(0, every, share) + 0.8 * ce(1, accepted, share)) / 1.8
        torch.testing.assert_close(weighted, expected)


def test_prompt_choices_are_the_targets_own(tiny_target, fused):
    """scripts/prompt_choices.py: the target's last layers from the last cached tap give the
    choices its full pass gives, on the prompt rows the extraction left without."""
    spec = importlib.util.spec_from_file_location("prompt_choices", SCRIPTS / "prompt_choices.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    shards, config = fused
    shard = shards[0]
    filled = script.fill_shard(tiny_target, shard, config.features[-1])
    offsets, starts = shard["offsets"].tolist(), shard["starts"].tolist()
    assert (shard["choice"] < 0).any() and (filled["choice"] >= 0).all()
    for begin, end, start in zip(offsets, offsets[1:], starts):
        with torch.no_grad():
            full = tiny_target(shard["tokens"][begin:end].long()[None]).logits[0].argmax(-1)  # [T]
        prompt = slice(begin, begin + max(start - 2, 0))
        assert torch.equal(filled["choice"][prompt].long(), full[: prompt.stop - begin])
        assert torch.equal(filled["choice"][prompt.stop : end], shard["choice"][prompt.stop : end])  # kept


def test_features_with_prompt_choices_choose_on_every_row(tiny_target, fused, tmp_path):
    """extract_features(prompt_choices=True) (what `train --prompt-rows` reads): the same
    features, the target's choice on every row, shards named apart from the responses-only ones."""
    shards, config = fused
    sequences = fused_sequences()
    backend = target_backend(tiny_target)
    folder = extract_features(backend, sequences, tmp_path, progress=False, layers=config.features, prompt_choices=True)
    names = json.loads((folder / "index.json").read_text())["shards"]
    assert names and all(name.endswith("-prompts.safetensors") for name in names)
    every = load_features(folder)
    for plain, full in zip(shards, every):
        assert torch.equal(plain["hidden"], full["hidden"]) and (full["choice"] >= 0).all()
        answered = plain["choice"] >= 0
        assert torch.equal(full["choice"][answered], plain["choice"][answered])
        offsets = full["offsets"].tolist()
        for begin, end in zip(offsets, offsets[1:]):
            with torch.no_grad():
                chosen = tiny_target(full["tokens"][begin:end].long()[None]).logits[0].argmax(-1)  # [T]
            assert torch.equal(full["choice"][begin:end].long(), chosen)


def test_a_saved_head_widens_its_vocabulary_to_the_datas_most_frequent_tokens(tiny_target, fused, tmp_path):
    """--init with --vocab above the head's: every token it had stays and scores as it did, the
    data's most frequent others join (their LM head rows the target's), and training then moves them."""
    shards, config = fused
    tables = target_tables(tiny_target)
    full = tables[0].shape[0]
    settings = TrainSettings(steps=20, sequences=4, window=64, lr=3e-3, unroll=2, vocab=4, precision="fp32")
    first = train_eagle3(shards, *tables, config, tmp_path / "first", settings, "tiny", progress=False)

    def tuned(name: str, run: TrainSettings) -> dict:  # the first head fine-tuned with `run`
        return train_eagle3(
            shards, *tables, config, tmp_path / name, run, "tiny", progress=False, init=tmp_path / "first"
        )

    still = replace(settings, steps=1, lr=0.0, vocab=8)
    wide = tuned("wide", still)
    before, after = load_eagle(tmp_path / "first", *tables[::2]), load_eagle(tmp_path / "wide", *tables[::2])
    assert len(after.vocab) == wide["draft_vocab"] == 8 and set(before.vocab.tolist()) < set(after.vocab.tolist())
    assert torch.equal(after.vocab, draft_vocabulary(shards, 8, full, keep=before.vocab))
    assert wide["draft_vocab_coverage"] > first["draft_vocab_coverage"]
    old = vocabulary_index(after.vocab, full)[before.vocab]  # the old tokens' rows in the wider head
    new = vocabulary_index(before.vocab, full)[after.vocab] < 0
    saved_rows = tables[0][after.vocab[new]].bfloat16().float()  # heads are saved in bf16
    assert torch.equal(after.lm_head.weight[new], saved_rows)
    features, tokens = torch.randn(1, 5, 3 * config.hidden), torch.tensor([[1, 2, 3, 4, 5]])
    mask = torch.ones(5, 5, dtype=torch.bool).tril()[None]
    with torch.no_grad():
        h = before(features, tokens, torch.arange(5)[None], mask)
        torch.testing.assert_close(after(features, tokens, torch.arange(5)[None], mask), h)
        torch.testing.assert_close(after.logits(h)[..., old], before.logits(h))
    assert tuned("trained", replace(settings, vocab=8))["draft_vocab"] == 8
    assert not torch.equal(load_eagle(tmp_path / "trained", *tables[::2]).lm_head.weight[new], saved_rows)
    assert tuned("narrow", replace(still, vocab=2))["draft_vocab"] == 4  # a smaller --vocab keeps the saved one
