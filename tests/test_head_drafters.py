"""EAGLE (1 and 3) and Medusa drafters on tiny models with heads trained in the test: greedy
output equals plain decoding, sampled output follows the target, heads are found and refused
clearly. "eagle3" below is method "eagle" with an EAGLE-3 head."""

import pytest
import torch
from conftest import DEVICES, loaded, tiny_llama
from spec_util import assert_speculated
from stats_util import chi_square_p_value, decode_together, sample_batched

from quickdraft import Decoder
from quickdraft.drafters.tree_record import TreeRecord
from quickdraft.errors import QuickdraftError
from quickdraft.heads.config import Eagle3Config
from quickdraft.sampling import SamplingParams, logits_to_probs
from quickdraft.training.distill import regenerate
from quickdraft.training.features import extract_features, load_features
from quickdraft.training.loop import TrainSettings
from quickdraft.training.train_command import feature_decoder
from quickdraft.training.train_eagle import train_eagle
from quickdraft.training.train_eagle3 import train_eagle3
from quickdraft.training.train_medusa import train_medusa


def train_heads(model, folder, vocab):
    """Medusa and EAGLE heads trained for a few seconds on the model's own greedy continuations."""
    torch.manual_seed(0)  # test-only: the heads' initial weights, whatever ran before
    generator = torch.Generator().manual_seed(0)
    prompts = [(torch.randint(vocab, (6,), generator=generator).tolist(), 6) for _ in range(48)]
    decoder = feature_decoder(loaded(model, "t"))
    sequences = regenerate(decoder, prompts, 40, batch_size=16, progress=False)
    shards = load_features(extract_features(decoder.target_backend, sequences, folder / "features", progress=False))
    lm_head, embed = model.lm_head.weight.detach(), model.model.embed_tokens.weight.detach()
    # A draft vocabulary of 24 tokens: smaller than the 32 of the tiny target, not than the 8 of the small one.
    # fp32, not "auto": the same heads on every machine, whichever precision it measures faster.
    train_medusa(
        shards,
        lm_head,
        3,
        folder / "medusa",
        TrainSettings(steps=150, lr=3e-3, vocab=24, precision="fp32"),
        "t",
        progress=False,
    )
    settings = TrainSettings(steps=200, sequences=8, window=64, lr=3e-3, vocab=24, precision="fp32")
    train_eagle(shards, lm_head, embed, model.config, folder / "eagle", settings, "t", progress=False)
    config = Eagle3Config.from_target(model.config)
    fused = load_features(
        extract_features(decoder.target_backend, sequences, folder / "fused", progress=False, layers=config.features)
    )
    train_eagle3(
        fused,
        lm_head,
        model.model.norm.weight.detach(),
        embed,
        config,
        folder / "eagle3",
        TrainSettings(steps=150, sequences=8, window=64, lr=3e-3, vocab=24, unroll=3, precision="fp32"),
        "t",
        progress=False,
    )
    return folder


def head_decoder(model, folder, head: str, k: int | None = None, **options) -> Decoder:
    """A decoder drafting with the head kind `head` trained in `folder`."""
    return Decoder(loaded(model, "t"), None, method_of(head), k, head=str(folder / head), **options)


def method_of(head: str) -> str:
    """The method that drafts with a head kind ("eagle3": an EAGLE-3 head, method "eagle")."""
    return "eagle" if head == "eagle3" else head


@pytest.fixture(scope="module")
def heads(tiny_target, tmp_path_factory):
    return train_heads(tiny_target, tmp_path_factory.mktemp("heads"), 32)


@pytest.mark.chance
@pytest.mark.speculation
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", ["medusa", "eagle", "eagle3"])
@pytest.mark.parametrize("k,top_k,nodes", [(1, 1, 1), (3, 2, 6), (5, 4, 16)])
def test_head_drafters_greedy_equal_plain(tiny_target, heads, method, k, top_k, nodes, device):
    # The lookup branch (on by default) may reach past the head's depth, up to k_max.
    depth = k if k < 3 else 16
    plain = Decoder(loaded(tiny_target, "t"), None, "none", device=device)
    spec = head_decoder(tiny_target, heads, method, k, tree_top_k=top_k, tree_nodes=nodes, device=device, lookup=k >= 3)
    outputs = []
    for prompt in ([1, 2, 3], [5, 9, 9, 2, 7, 1, 5, 9], [4]):
        out = spec.generate(prompt, max_new_tokens=40)
        assert out.token_ids == plain.generate(prompt, max_new_tokens=40).token_ids
        outputs.append(out)
        assert all(len(step.draft_tokens) <= nodes for step in out.steps)
        assert all((step.tree_depth or 0) <= depth for step in out.steps)
    assert_speculated(outputs)  # trained heads must get drafts accepted


@pytest.mark.chance
@pytest.mark.speculation
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("method", ["medusa", "eagle", "eagle3"])
def test_head_drafters_on_the_static_backend_greedy_equal_plain(tiny_target, heads, method, precision):
    """Fixed-shape passes (the CUDA-graph path, run here without graphs): trees of 16 nodes past
    the 64-token window, whose deeper nodes the engine cuts there, stay exact."""
    options = dict(backend="static", precision=precision, measure_shapes=False)
    plain = Decoder(loaded(tiny_target, "t"), None, "none", **options)
    spec = Decoder(
        loaded(tiny_target, "t"), None, method_of(method), 4, head=str(heads / method), tree_nodes=16, **options
    )
    outputs = []
    for prompt in ([1, 2, 3], [5, 9, 9, 2, 7, 1, 5, 9]):
        outputs.append(spec.generate(prompt, max_new_tokens=100))
        assert outputs[-1].token_ids == plain.generate(prompt, max_new_tokens=100).token_ids
    assert_speculated(outputs)


@pytest.mark.speculation
def test_a_fixed_eagle_tree_grows_wider_and_deeper_with_its_size_and_stays_exact(tiny_target, heads):
    """Unless the user names them, EAGLE's children per node and depth follow tree_nodes
    (tree_shape_for); Medusa keeps 4 children and its heads' depth; the user's settings win."""
    wide = head_decoder(tiny_target, heads, "eagle3", tree_nodes=64, lookup=False)
    assert (wide.k, wide.drafter.top_k) == (8, 16)
    named = head_decoder(tiny_target, heads, "eagle3", 3, tree_nodes=64, tree_top_k=2)
    assert (named.k, named.drafter.top_k) == (3, 2)
    medusa = head_decoder(tiny_target, heads, "medusa", tree_nodes=64)
    assert (medusa.k, medusa.drafter.top_k) == (3, 4)
    plain = Decoder(loaded(tiny_target, "t"), None, "none")
    for prompt in ([1, 2, 3], [5, 9, 9, 2, 7, 1, 5, 9]):
        out = wide.generate(prompt, max_new_tokens=40)
        assert out.token_ids == plain.generate(prompt, max_new_tokens=40).token_ids
        assert all(len(step.draft_tokens) <= 64 and (step.tree_depth or 0) <= 8 for step in out.steps)


def test_eagle_drafts_deeper_than_one_level_get_accepted(tiny_target, heads):
    """Bound by what the test can guarantee on any machine's kernels, not by the trained head's
    quality: pooled over prompts, the same head drafting four levels deep (lookup off, so every
    draft is the head's) has steps that accept two or more, and yields more tokens per pass than
    drafting one level. Greedy output is the same either way, so the comparison is like for like.
    Both trees have 8 nodes: the machine's budget comes from each decoder's own timed passes, and a
    noisy timing had given the deep tree fewer nodes (1.49 tokens per pass against 1.50 on a full run)."""
    prompts = ([1, 2, 3], [5, 9, 9, 2, 7, 1, 5, 9], [4], [2, 8, 6])

    def pooled(k: int) -> tuple[float, int]:
        spec = Decoder(
            loaded(tiny_target, "t"), None, "eagle", k, head=str(heads / "eagle"), lookup=False, tree_nodes=8
        )
        outs = [spec.generate(prompt, 60) for prompt in prompts]
        per_pass = sum(out.stats.new_tokens for out in outs) / sum(out.stats.target_passes for out in outs)
        return per_pass, max(step.accepted for out in outs for step in out.steps)

    (deep, deepest), (shallow, _) = pooled(4), pooled(1)
    assert deepest >= 2
    assert deep > shallow, (deep, shallow)


@pytest.mark.speculation
def test_head_drafters_through_the_transformers_backend(tiny_target, heads):
    plain = Decoder(loaded(tiny_target, "t"), None, "none", backend="hf").generate([3, 1, 4, 1, 5], 30)
    for method in ("medusa", "eagle", "eagle3"):
        out = Decoder(
            loaded(tiny_target, "t"), None, method_of(method), 3, head=str(heads / method), backend="hf"
        ).generate([3, 1, 4, 1, 5], 30)
        assert out.token_ids == plain.token_ids
        assert_speculated([out], label=method)


def test_missing_or_mismatched_heads_are_refused(tiny_target, heads, tmp_path):
    with pytest.raises(QuickdraftError, match="no eagle head is shipped for 't'"):
        Decoder(loaded(tiny_target, "t"), None, "eagle")
    with pytest.raises(QuickdraftError, match="no medusa head in"):
        Decoder(loaded(tiny_target, "t"), None, "medusa", head=str(tmp_path))
    with pytest.raises(QuickdraftError, match="holds a 'eagle' head"):
        Decoder(loaded(tiny_target, "t"), None, "medusa", head=str(heads / "eagle"))
    other = tiny_llama(seed=5, vocab=40)
    with pytest.raises(QuickdraftError, match="was trained for 't'"):
        Decoder(loaded(other, "other"), None, "eagle", head=str(heads / "eagle"))
    with pytest.raises(QuickdraftError, match="tree_nodes must be in 1..256, got 0"):
        Decoder(loaded(tiny_target, "t"), None, "eagle", head=str(heads / "eagle"), tree_nodes=0)


@pytest.mark.speculation
@pytest.mark.parametrize("method", ["medusa", "eagle", "eagle3"])
def test_seeded_sampling_with_heads_equals_plain_seeded_decoding(tiny_target, heads, method):
    # Trees of every size, sized by the head or fixed, alone and batched: the text is the plain text of the seed.
    sampled = dict(temperature=0.6, top_k=12, seed=11)
    plain = Decoder(loaded(tiny_target, "t"), None, "none")
    prompts = [[2, 7, 1, 8], [29, 14, 21, 2, 8, 19], [5, 5, 3]]
    expected = [plain.generate(p, 30, **sampled).token_ids for p in prompts]
    outputs = []
    for k, top_k, nodes, tree in ((1, 1, 1, "dynamic"), (3, 2, 6, "dynamic"), (5, 4, 16, "static")):
        spec = head_decoder(tiny_target, heads, method, k, tree_top_k=top_k, tree_nodes=nodes, tree=tree)
        for prompt, want in zip(prompts, expected):
            outputs.append(spec.generate(prompt, 30, **sampled))
            assert outputs[-1].token_ids == want, (k, nodes, tree, prompt)
        gens = [spec.prepare(p, 30, **sampled) for p in prompts]
        decode_together(gens)
        assert [g.new_tokens for g in gens] == expected
    assert_speculated(outputs)


# --- distribution: sampled output follows the target ----------------------------------------

VOCAB, RUNS = 8, 2000


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    model = tiny_llama(seed=3, vocab=VOCAB, init_range=0.25)
    return model, train_heads(model, tmp_path_factory.mktemp("small"), VOCAB)


@pytest.mark.chance
@pytest.mark.speculation
@pytest.mark.parametrize(
    "method,params,lookup",
    [
        ("medusa", SamplingParams(temperature=1.0), False),
        ("eagle", SamplingParams(temperature=1.0), False),
        ("eagle", SamplingParams(temperature=0.7, top_k=5, top_p=0.9), False),
        ("eagle3", SamplingParams(temperature=1.0), False),
        ("eagle3", SamplingParams(temperature=1.0), True),  # a lookup branch (2, 3, 1) beside the head's guesses
    ],
)
def test_sampled_output_follows_the_target(small, method, params, lookup):
    model, folder = small
    prompt = [1, 2, 3, 1, 2, 3, 1]
    with torch.no_grad():
        first = logits_to_probs(model(torch.tensor([prompt])).logits[0, -1], params)  # [V]
        second = logits_to_probs(model(torch.tensor([[*prompt, t] for t in range(VOCAB)])).logits[:, -1], params)
    expected = first[:, None] * second  # [V, V]: the first two tokens
    decoder = head_decoder(model, folder, method, 3, tree_top_k=2, tree_nodes=5, lookup=lookup)
    counts = torch.zeros(VOCAB, VOCAB)
    trees = 0
    outputs = sample_batched(
        decoder, prompt, RUNS, 3, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p
    )
    for out in outputs:
        counts[out.token_ids[0], out.token_ids[1]] += 1
        trees += out.steps[0].accepted >= 1
    assert trees > RUNS // 10, "the first pass must accept tree nodes for the test to bite"
    assert_speculated(outputs)
    assert chi_square_p_value(counts, expected) > 1e-3


@pytest.mark.chance
@pytest.mark.speculation
@pytest.mark.parametrize("method", ["medusa", "eagle", "eagle3"])
@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_batched_head_drafters_equal_each_alone(tiny_target, heads, method, precision):
    # In a batched pass every sequence's drafter gets its own rows of hidden states.
    from test_scheduler import PROMPTS, Collector

    from quickdraft.serve.scheduler import Scheduler

    decoder = Decoder(
        loaded(tiny_target, "t"), None, method_of(method), 3, head=str(heads / method), precision=precision
    )
    name = method_of(method)
    jobs = [(name, 3), ("none", None), (name, 2), ("prompt-lookup", None), (name, 4)]
    lengths = [20, 7, 25, 13, 30]
    scheduler = Scheduler(decoder, max_batch=3, max_queue=8)
    collectors = [Collector() for _ in PROMPTS]
    for collector, prompt, (name, k), length in zip(collectors, PROMPTS, jobs, lengths):
        scheduler.submit(collector.job(prompt, length, name, k=k))
    scheduler.start()
    for collector in collectors:
        assert collector.done.wait(300)  # a stall, not a speed: 60 s failed on 2 busy cores
    scheduler.stop()
    for collector, prompt, (name, k), length in zip(collectors, PROMPTS, jobs, lengths):
        alone = decoder.with_method(name, k).generate(prompt, max_new_tokens=length)
        assert collector.output.token_ids == alone.token_ids, (name, k)
    assert_speculated([c.output for c, (name, _) in zip(collectors, jobs) if name == method_of(method)])


@pytest.mark.speculation
def test_full_vocabulary_drafting_stays_exact(tiny_target, heads):
    plain = Decoder(loaded(tiny_target, "t"), None, "none").generate([2, 7, 1, 8], 30)
    for method in ("medusa", "eagle"):
        for full, size in ((False, 24), (True, 32)):
            decoder = Decoder(loaded(tiny_target, "t"), None, method, 3, head=str(heads / method), full_vocab=full)
            head = decoder.drafter.heads if method == "medusa" else decoder.drafter.head
            assert head.vocab.numel() == size and head.logits_layer.inner.out_features == size
            out = decoder.generate([2, 7, 1, 8], 30)
            assert out.token_ids == plain.token_ids
            assert_speculated([out], label=(method, size))


@pytest.mark.chance
@pytest.mark.speculation
@pytest.mark.parametrize("method", ["medusa", "eagle"])
def test_static_trees_greedy_equal_plain(tiny_target, heads, method):
    plain = Decoder(loaded(tiny_target, "t"), None, "none")
    spec = Decoder(loaded(tiny_target, "t"), None, method, 3, head=str(heads / method), tree="static", tree_nodes=8)
    outputs = []
    for prompt in ([1, 2, 3], [5, 9, 9, 2, 7, 1, 5, 9]):
        out = spec.generate(prompt, max_new_tokens=40)
        assert out.token_ids == plain.generate(prompt, max_new_tokens=40).token_ids
        # The fixed shape, whole, except where the output's end leaves room for fewer levels.
        assert sum(len(step.draft_tokens) != 8 for step in out.steps) <= 3
        outputs.append(out)
    assert_speculated(outputs)


def test_the_tree_size_follows_the_targets_measured_pass_costs(tiny_target, heads, tmp_path):
    # Flat costs up to 64 tokens (a GPU; the static backend pads every pass to 64 rows): 63 nodes.
    # Without measurements (or where each row costs): the CPU's 4. A given size wins and is fixed;
    # the budget is a cap, and each step keeps the nodes worth their rows.
    from quickdraft.analysis import tree_budget
    from quickdraft.backends.select import make_backend

    target = loaded(tiny_target, "t")
    backend = make_backend(target, "static", "fp32", "cpu", measure=False)
    backend.pass_ms = {n: 1.0 for n in (1, 2, 4, 8, 16, 32, 64)}
    options = dict(head=str(heads / "eagle"), backend="static", measure_shapes=False)
    budget = Decoder(target, None, "eagle", **options).drafter
    assert budget.nodes == 63 and dict(budget.pass_ms) == backend.pass_ms  # a cap: each step keeps what pays
    fixed = Decoder(target, None, "eagle", tree_nodes=7, **options).drafter
    assert fixed.nodes == 7 and fixed.pass_ms == ()  # the user's size, every step
    native = Decoder(loaded(tiny_target, "t"), None, "medusa", head=str(heads / "medusa"), measure_shapes=False)
    assert native.drafter.nodes == 4 and native.drafter.pass_ms == ()
    for kind in ("static", "native"):  # both measure their passes at load
        measured = Decoder(
            loaded(tiny_target, "t"), None, "eagle", head=str(heads / "eagle"), backend=kind, cache_dir=tmp_path
        )
        costs = measured.target_backend.pass_ms
        assert costs and measured.drafter.nodes == tree_budget(costs) and dict(measured.drafter.pass_ms) == costs


@pytest.mark.speculation
@pytest.mark.parametrize("lookup", [False, True])
@pytest.mark.parametrize("method", ["medusa", "eagle", "eagle3"])
def test_trees_sized_each_step_by_measured_cost_greedy_equal_plain(tiny_target, heads, method, lookup):
    # Rows that cost in steps (int4's four at a time): each step keeps 0..4 head nodes by the head's
    # confidence (with a lookup branch, its nodes as well).
    from quickdraft.backends.select import make_backend

    target = loaded(tiny_target, "t")
    make_backend(target, "native", "fp32", "cpu", measure=False).pass_ms = {
        1: 10.0,
        2: 11.0,
        3: 12.5,
        4: 12.5,
        5: 20.0,
        8: 21.0,
    }
    spec = Decoder(target, None, method_of(method), head=str(heads / method), measure_shapes=False, lookup=lookup)
    plain = Decoder(loaded(tiny_target, "t"), None, "none", measure_shapes=False)
    sizes, outputs = set(), []
    for prompt in ([1, 2, 3], [5, 9, 9, 2, 7, 1, 5, 9], [4]):
        out = spec.generate(prompt, max_new_tokens=40)
        assert out.token_ids == plain.generate(prompt, max_new_tokens=40).token_ids
        sizes |= {len(step.draft_tokens) for step in out.steps}
        outputs.append(out)
    assert len(sizes) > 1 and (max(sizes) <= 4 or lookup), sizes
    assert_speculated(outputs)


@pytest.mark.speculation
@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_an_eagle_head_rests_where_none_of_its_nodes_could_pay(tiny_target, heads, method):
    # A sequence whose record says its head gets 5% of what it expects: no head node can pay for
    # its row, so the head skips drafting (a plain pass, or the lookup branch alone), and still
    # drafts now and then (every RECHECK_EVERY steps, then twice as far apart after each check that
    # found it still does not pay, at most MOST_REST: its record may recover); the output stays exact.
    from quickdraft.backends.select import make_backend
    from quickdraft.drafters.tree_record import MOST_REST

    target = loaded(tiny_target, "t")
    make_backend(target, "native", "fp32", "cpu", measure=False).pass_ms = {
        1: 10.0,
        2: 11.0,
        3: 12.5,
        4: 12.5,
        5: 20.0,
        8: 21.0,
    }
    spec = Decoder(target, None, "eagle", head=str(heads / method), measure_shapes=False, lookup=True)
    plain = Decoder(loaded(tiny_target, "t"), None, "none", measure_shapes=False)
    rested = drafted = 0
    generations = []
    for prompt in ([1, 2, 3], [5, 9, 9, 2, 7, 1, 5, 9]):
        generations.append(generation := spec.start(prompt, max_new_tokens=60))
        record = generation.draft_state.record
        record.head_expected, record.head_accepted = 1000.0, 50.0
        while not generation.done:
            generation.step()
            idle = generation.draft_state.record.idle
            assert idle < MOST_REST
            rested, drafted = rested + (idle > 0), drafted + (idle == 0)
        assert generation.new_tokens == plain.generate(prompt, max_new_tokens=60).token_ids
    assert rested > drafted > 0, (rested, drafted)
    assert_speculated(generations, min_rate=0.1)  # the head rests most steps: few passes verify a draft


@pytest.mark.chance
@pytest.mark.speculation
@pytest.mark.parametrize("method", ["medusa", "eagle", "eagle3"])
def test_a_lookup_branch_stays_exact_and_gets_accepted(tiny_target, heads, method):
    # The tiny target's greedy text repeats itself in places (17 17 17, 1 1 1 1): there prompt
    # lookup's copies are right, and the branch's tokens get accepted.
    plain = Decoder(loaded(tiny_target, "t"), None, "none")
    branched = Decoder(
        loaded(tiny_target, "t"), None, method_of(method), 4, lookup=True, head=str(heads / method), tree_nodes=4
    )
    from_branch, generations = 0, []
    for prompt in ([1, 2, 3], [5, 9, 9, 2, 7, 1, 5, 9], [4]):
        generations.append(generation := branched.start(prompt, max_new_tokens=60))
        while not generation.done:
            assert len(generation.step().draft_tokens) <= 4
        assert generation.new_tokens == plain.generate(prompt, max_new_tokens=60).token_ids
        record, start = generation.draft_state.record, TreeRecord()
        from_branch += record.first.accepted - start.first.accepted + record.next.accepted - start.next.accepted
        assert record.first.accepted < record.first.tried and record.next.accepted < record.next.tried
    assert from_branch > 0
    assert_speculated(generations)


@pytest.mark.chance
@pytest.mark.speculation
@pytest.mark.parametrize("method", ["medusa", "eagle", "eagle3"])
def test_under_gumbel_max_a_head_guesses_the_seeds_pick(small, method):
    # One guess a pass, the first pass of 400 seeds at temperature 1: a head that always drafted
    # its likeliest token would be accepted with the target's chance of that token, p(d0), over
    # the seeds; drafting the target's own noise's pick of its q, it guesses other tokens where
    # the noise says so and is accepted far more often.
    model, folder = small
    prompt, runs = [1, 2, 3, 1, 2, 3, 1], 400
    decoder = head_decoder(model, folder, method, 1, tree_top_k=1, tree_nodes=1, lookup=False)
    d0 = decoder.generate(prompt, 2).steps[0].draft_tokens[0]  # greedy: the head's likeliest first token
    with torch.no_grad():
        p = logits_to_probs(model(torch.tensor([prompt])).logits[0, -1], SamplingParams(temperature=1.0))  # [V]
    firsts = [out.steps[0] for out in sample_batched(decoder, prompt, runs, 2, temperature=1.0)]
    guessed = {step.draft_tokens[0] for step in firsts}
    accepted = sum(step.accepted for step in firsts) / runs
    assert len(guessed) > 1 and p[d0] < 0.8  # the noise moves the guess, and the target is not sure of d0
    assert accepted > p[d0] + 0.05, (accepted, float(p[d0]))
