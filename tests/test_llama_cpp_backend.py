"""The llama.cpp backend on the embedded default target (skipped where llama-cpp-python is absent).

Exact means bit for bit here: rows of a pass do not depend on the pass (patched build, see
patches/), so a lone sequence's speculative rows are plain decoding's rows.
"""

from __future__ import annotations

import threading

import httpx
import openai
import pytest
import torch
from heads_util import eagle1_head
from llama_cpp_util import gemma3_file, random_tokens
from spec_util import assert_speculated, real_vocab_rate

import quickdraft
from quickdraft import Decoder
from quickdraft.backends.backend import SeqPass
from quickdraft.backends.llama_cpp import (
    DEFAULT_CELLS,
    ROW_EXACT_MATMUL,
    LlamaCppBackend,
    installed_patches,
    llama_cpp_installed,
)
from quickdraft.backends.select import llama_cpp_signature, make_backend
from quickdraft.errors import QuickdraftError
from quickdraft.measured import read_choice
from quickdraft.models import default_gguf_path
from quickdraft.models.loading import load_model
from quickdraft.serve import create_app
from quickdraft.serve.background import BackgroundServer
from quickdraft.tree import pass_layout

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not llama_cpp_installed(), reason="llama-cpp-python is not installed (./setup.sh builds it)"),
]
PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Summarize in two sentences: The city council met on Tuesday to discuss the new park. Residents "
    "asked for more trees and a playground. The council agreed to plant forty trees and to build the "
    "playground next spring, paid for by the parks budget.",
]


@pytest.fixture(scope="module")
def decoder():
    return quickdraft.load(method="none", backend="llama.cpp", measure_shapes=False)


@pytest.fixture(scope="module")
def backend(decoder) -> LlamaCppBackend:
    return decoder.target_backend


def rows(backend: LlamaCppBackend, tokens: list[int], new: list[int]) -> torch.Tensor:
    """Logits [len(new), V] of `new` after `tokens`, one token per pass, in a fresh cache."""
    cache = backend.new_cache()
    backend.forward([SeqPass(cache, tokens, logits="none")])
    return torch.cat([backend.forward([SeqPass(cache, [t])])[0].logits for t in new])


def test_it_is_the_gguf_file_on_llama_cpp(decoder, backend):
    assert decoder.backend_kind == "llama.cpp" and decoder.precision == "gguf"
    assert backend.vocab_size == decoder.target.model.get_output_embeddings().weight.shape[0]
    # The trained context is 8192; the pool llama.cpp allocates up front is capped unless asked for.
    assert backend.max_length == DEFAULT_CELLS == 4096 and backend.hidden_size == 576


def test_the_context_option_sizes_the_pool_and_the_plan_counts_it(decoder):
    from quickdraft.memory import loaded_memory

    wide = Decoder(decoder.target, None, "none", backend="llama.cpp", context=8192, measure_shapes=False)
    assert wide.target_backend.max_length == wide.context_length == 8192
    narrow = Decoder(decoder.target, None, "none", backend="llama.cpp", context=256, measure_shapes=False)
    assert narrow.context_length == 256
    assert loaded_memory(wide).kv_total == 32 * loaded_memory(narrow).kv_total
    with pytest.raises(QuickdraftError, match="context"):
        Decoder(decoder.target, None, "none", backend="llama.cpp", context=0)


def test_plain_decoding_neither_checks_nor_times_passes_and_speculation_does_both_once(decoder, tmp_path):
    """The exactness check and the pass timing are one-time jobs of a new machine and file (a minute
    at 8B on 2 cores): they wait for the first pass that needs them, so plain decoding needs neither."""
    plain = Decoder(decoder.target, None, "none", backend="llama.cpp", context=1024, cache_dir=tmp_path)
    backend = plain.target_backend
    timing, timed = backend.time_passes, []
    backend.time_passes = lambda model: timed.append(model) or timing(model)
    record = {"check": "llama.cpp exact rows", **llama_cpp_signature(backend.gguf, backend.threads)}
    expected = plain.generate(PROMPTS[0], max_new_tokens=24).token_ids
    assert read_choice(tmp_path / "pass_shapes", record) is None and timed == []
    speculative = plain.with_method("prompt-lookup", k=4)
    assert speculative.target_backend is backend and speculative.draft_length == "cost"
    assert speculative.generate(PROMPTS[0], max_new_tokens=24).token_ids == expected
    assert read_choice(tmp_path / "pass_shapes", record) == backend.exact_rows and timed == [backend]
    speculative.generate(PROMPTS[1], max_new_tokens=8)
    assert timed == [backend]  # once


def test_warm_up_does_the_one_time_jobs_before_any_generation(decoder, tmp_path):
    """What a server calls before it takes requests: the first request then waits for neither job."""
    # A context no other test uses: the model keeps one backend per context, checked once.
    plain = Decoder(decoder.target, None, "none", backend="llama.cpp", context=960, cache_dir=tmp_path)
    backend = plain.target_backend
    assert backend._exact_rows is None  # not checked yet
    timing, timed = backend.time_passes, []
    backend.time_passes = lambda model: timed.append(model) or timing(model)
    record = {"check": "llama.cpp exact rows", **llama_cpp_signature(backend.gguf, backend.threads)}
    plain.warm_up()
    assert read_choice(tmp_path / "pass_shapes", record) == backend.exact_rows >= 1 and timed == [backend]
    plain.with_method("prompt-lookup", k=4).generate(PROMPTS[0], max_new_tokens=8)
    assert timed == [backend]


def test_a_pool_without_room_for_the_check_decodes_one_row_at_a_time_and_checks_later(backend):
    checks = []

    def check(model: LlamaCppBackend) -> int:
        checks.append(model.measure_exact_rows())  # raises NoRoom while the pool is full
        return checks[-1]

    small = LlamaCppBackend(backend.gguf, "small", cells=400, threads=backend.threads, check_exact_rows=check)
    generator = torch.Generator().manual_seed(5)
    prefix, new = random_tokens(generator, 380), random_tokens(generator, 6)
    one_by_one = rows(small, prefix, new)
    cache = small.new_cache()
    small.forward([SeqPass(cache, prefix, logits="none")])
    together = small.forward([SeqPass(cache, new)])[0].logits  # no room for the check's 300 + 32 cells
    assert torch.equal(together, one_by_one) and checks == []
    cache.truncate(20)
    small.forward([SeqPass(cache, new[:3])])  # room now: the check runs
    assert len(checks) == 1 and small.exact_rows == checks[0] >= 1


def test_logits_match_the_native_int4_backend(decoder, backend):
    """Same Q4_1 weights; llama.cpp also rounds activations to 8 bits, so: close, same top-1."""
    native = make_backend(decoder.target, "native", "int4", "cpu", measure=False)
    ids = decoder.encode(PROMPTS[0])
    ours = backend.forward([SeqPass(backend.new_cache(), ids)])[0].logits  # [n, V]
    theirs = native.forward([SeqPass(native.new_cache(), ids)])[0].logits
    agree = (ours.argmax(-1) == theirs.argmax(-1)).float().mean().item()
    kl = (
        torch.nn.functional.kl_div(ours.log_softmax(-1), theirs.log_softmax(-1), log_target=True, reduction="none")
        .sum(-1)
        .mean()
        .item()
    )
    assert agree >= 0.9 and kl < 0.05, (agree, kl)


@pytest.mark.parametrize("context", [40, 600])  # 600: past 512 cells, where a stock build splits a lone row's KV
def test_rows_do_not_depend_on_the_pass(backend, context):
    generator = torch.Generator().manual_seed(context)
    prefix, new = random_tokens(generator, context), random_tokens(generator, 70)
    one_by_one = rows(backend, prefix, new)
    cache = backend.new_cache()
    backend.forward([SeqPass(cache, prefix, logits="none")])
    for n in (2, 3, 5, 8, 12, 70):  # 70: past the 64 rows where ggml tiles attention (decoded in parts)
        cache.truncate(context)
        together = backend.forward([SeqPass(cache, new[:n])])[0].logits
        assert torch.equal(together, one_by_one[:n]), f"rows of a {n}-token pass differ: is the build patched?"


def test_rollback_equals_a_fresh_prefill(backend):
    generator = torch.Generator().manual_seed(3)
    prefix, draft, fix = random_tokens(generator, 30), random_tokens(generator, 6), random_tokens(generator, 3)
    cache = backend.new_cache()
    backend.forward([SeqPass(cache, prefix, logits="none")])
    backend.forward([SeqPass(cache, draft)])
    cache.truncate(32)  # two drafts accepted, the rest rolled back
    assert cache.length == 32
    after = backend.forward([SeqPass(cache, fix)])[0].logits
    assert torch.equal(after, rows(backend, prefix + draft[:2], fix))


def test_tree_rows_equal_chain_passes_and_a_kept_branch_stays_exact(decoder, backend):
    text = decoder.encode(PROMPTS[1])  # real text: random ids make activations chaotic
    # A prefix under 64 tokens: a longer prompt takes llama.cpp's tiled path, whose sums depend on
    # where its cells sit, and the references below are computed in other cells.
    prefix, tokens, after_branch = text[:50], text[50:57], text[57:58]
    parents = [-1, -1, 0, 0, 1, 2]  # two children of the root, then a level below each
    mask, offsets = pass_layout(parents, [], None)  # [7, 7] with the root
    cache = backend.new_cache()
    backend.forward([SeqPass(cache, prefix, logits="none")])
    full = torch.cat([torch.ones(len(tokens), len(prefix), dtype=torch.bool), mask], dim=1)
    tree = backend.forward([SeqPass(cache, tokens, [len(prefix) + o for o in offsets], full)])[0].logits
    for node in range(len(parents)):
        path = [node]
        while parents[path[-1]] != -1:
            path.append(parents[path[-1]])
        chain = [tokens[0], *(tokens[1 + i] for i in reversed(path))]
        assert torch.equal(tree[1 + node], rows(backend, prefix, chain)[-1]), node
    # Keep root, node 1, node 4: it leaves the pass's first chain (root, node 0, node 2) at node 1, so
    # nodes 1 and 4 are decoded again at the front of the next pass, into cells in position order.
    root = len(prefix)
    cache.keep([*range(root + 1), root + 1 + 1, root + 1 + 4])
    assert cache.length == root + 3 and not cache.views and cache.pending == [tokens[2], tokens[5]]
    after = backend.forward([SeqPass(cache, after_branch)])[0].logits
    assert torch.equal(after, rows(backend, prefix + [tokens[0], tokens[2], tokens[5]], after_branch))
    # Rolling back into pending tokens drops them; keeping the first chain leaves nothing pending.
    for kept, pending in (([1, 4], [tokens[2]]), ([0, 2], [])):
        cache.truncate(root)
        backend.forward([SeqPass(cache, tokens, [root + o for o in offsets], full)])
        cache.keep([*range(root + 1), *(root + 1 + i for i in kept)])
        cache.truncate(root + 2)
        assert cache.pending == pending
        after = backend.forward([SeqPass(cache, after_branch)])[0].logits
        assert torch.equal(after, rows(backend, prefix + [tokens[0], tokens[1 + kept[0]]], after_branch))


def test_two_sequences_batched_equal_each_alone(backend):
    generator = torch.Generator().manual_seed(5)
    a, b = random_tokens(generator, 20), random_tokens(generator, 33)
    a_new, b_new = random_tokens(generator, 4), random_tokens(generator, 1)
    first, second = backend.new_cache(), backend.new_cache()
    backend.forward([SeqPass(first, a, logits="none"), SeqPass(second, b, logits="none")])
    out = backend.forward([SeqPass(first, a_new), SeqPass(second, b_new, logits="last", hidden=True)])
    alone_a = backend.forward([SeqPass(c := backend.new_cache(), a + a_new)])[0].logits[-4:]
    c.truncate(0)
    alone_b = backend.forward([SeqPass(backend.new_cache(), b + b_new, logits="last", hidden=True)])[0]
    assert torch.equal(out[0].logits, alone_a)
    assert torch.equal(out[1].logits, alone_b.logits) and torch.equal(out[1].hidden, alone_b.hidden[-1:])


def test_hidden_states_are_the_final_norms_output(decoder, backend):
    """What EAGLE and Medusa heads read: close to the native int4 backend's last hidden states."""
    native = make_backend(decoder.target, "native", "int4", "cpu", measure=False)
    ids = decoder.encode(PROMPTS[1])
    ours = backend.forward([SeqPass(backend.new_cache(), ids, logits="none", hidden=True)])[0].hidden
    theirs = native.forward([SeqPass(native.new_cache(), ids, logits="none", hidden=True)])[0].hidden
    assert ours.shape == theirs.shape == (len(ids), backend.hidden_size)
    assert torch.nn.functional.cosine_similarity(ours, theirs, dim=-1).min() > 0.98


@pytest.mark.parametrize(
    "method",
    [
        "prompt-lookup",  # the cost model's K, which may be 0 throughout where passes are dear: exactness only
        *(
            pytest.param(m, marks=pytest.mark.speculation)
            for m in (
                "prompt-lookup:draft_length=fixed",
                "self-spec",
                "draft",
                "lookahead",
                "eagle-1",
                "eagle",  # the shipped EAGLE-3 head, on the inputs of layers 2, 15 and 27 from llama.cpp
                "medusa",
                "suffix",
            )
        ),
    ],
)
def test_greedy_speculation_equals_plain_decoding(decoder, method, tmp_path):
    """Exact by construction for one sequence: rows do not depend on the pass, and every kept token
    sits in cells in position order (a kept tree branch off the first chain is decoded again)."""
    draft = load_model(default_gguf_path()) if method == "draft" else None  # its own llama.cpp context
    options = {"head": str(eagle1_head(decoder.target, tmp_path))} if method == "eagle-1" else {}
    if method == "self-spec":  # 24 of 30 layers draft tokens that get accepted; the default quarter hardly any
        options = {"layers": 24}
    speculative = quickdraft.Decoder(
        decoder.target, draft, method.removesuffix("-1"), measure_shapes=False, backend="llama.cpp", **options
    )
    outputs = []
    for prompt in PROMPTS:
        plain = decoder.generate(prompt, max_new_tokens=40)
        outputs.append(speculative.generate(prompt, max_new_tokens=40))
        assert outputs[-1].token_ids == plain.token_ids, (method, prompt)
    if method != "prompt-lookup":  # drafts were accepted (eagle-1's untrained head: by its lookup branch)
        assert_speculated(outputs, real_vocab_rate(method))  # eagle-1: an untrained head, chains rate


TAPS = (2, 15, 27)  # the shipped EAGLE-3 head's


def test_layer_inputs_do_not_depend_on_the_pass(backend):
    """EAGLE-3's features: each row's inputs of the tapped layers, bit for bit the same in one-token
    passes, in one pass of many rows and beside another sequence; side by side in the order asked."""
    generator = torch.Generator().manual_seed(5)
    prefix, new = random_tokens(generator, 50), random_tokens(generator, 8)
    cache = backend.new_cache()
    backend.forward([SeqPass(cache, prefix, logits="none")])
    one_by_one = torch.cat([backend.forward([SeqPass(cache, [t], hidden=True, taps=TAPS)])[0].hidden for t in new])
    assert one_by_one.shape == (len(new), len(TAPS) * backend.hidden_size)
    cache.truncate(len(prefix))
    other = backend.new_cache()
    together = backend.forward(
        [SeqPass(other, random_tokens(generator, 5)), SeqPass(cache, new, logits="last", hidden=True, taps=TAPS)]
    )[1]
    assert torch.equal(together.hidden, one_by_one)
    cache.truncate(len(prefix))
    reordered = backend.forward([SeqPass(cache, new, hidden=True, taps=TAPS[::-1])])[0].hidden
    width = backend.hidden_size
    assert torch.equal(reordered[:, :width], one_by_one[:, -width:])  # layer 27's first when asked first


def test_layer_inputs_are_the_native_backends_within_llama_cpps_rounding(decoder, backend):
    """Same Q4_1 weights, other arithmetic (llama.cpp rounds activations to 8 bits for its
    products): every row of every tapped layer within 0.1 of native fp32's, relative, cosine
    above 0.995 (measured on this prompt: at most 0.052 and at least 0.9987)."""
    native = make_backend(decoder.target, "native", "fp32", "cpu", measure=False)
    ids = decoder.encode(PROMPTS[1])
    ours = backend.forward([SeqPass(backend.new_cache(), ids, logits="none", hidden=True, taps=TAPS)])[0].hidden
    theirs = native.forward([SeqPass(native.new_cache(), ids, logits="none", hidden=True, taps=TAPS)])[0].hidden
    for a, b in zip(ours.split(backend.hidden_size, -1), theirs.split(backend.hidden_size, -1)):
        assert ((a - b).norm(dim=-1) / b.norm(dim=-1)).max() < 0.1
        assert torch.nn.functional.cosine_similarity(a, b, dim=-1).min() > 0.995


def test_layer_inputs_a_file_does_not_record_are_refused_before_any_state_changes(backend, gemma3):
    for runs, taps, message in [(backend, (30,), "layers \\[30\\]"), (gemma3, (1,), "layers for this 'gemma3' file")]:
        cache = runs.new_cache()
        with pytest.raises(ValueError, match=message):
            runs.forward([SeqPass(cache, [5, 6, 7], hidden=True, taps=taps)])
        assert cache.length == 0
        runs.forward([SeqPass(cache, [5, 6, 7])])  # and the backend runs on


def test_bad_settings_are_refused(decoder, tiny_target):
    with pytest.raises(QuickdraftError, match="runs GGUF files"):
        quickdraft.load(tiny_target, method="none", backend="llama.cpp", measure_shapes=False)
    with pytest.raises(QuickdraftError, match="GGUF file's own types"):
        quickdraft.Decoder(decoder.target, method="none", backend="llama.cpp", precision="int4")
    with pytest.raises(QuickdraftError, match="llama.cpp backend's"):
        quickdraft.Decoder(decoder.target, method="none", backend="native", precision="gguf")
    backend = decoder.target_backend
    cache = backend.new_cache()
    backend.forward([SeqPass(cache, [1, 2, 3], logits="none")])
    with pytest.raises(ValueError, match="not a prefix"):
        cache.keep([0, 2])  # no masked pass to keep a branch of
    assert cache.length == 3


def test_the_server_runs_on_this_backend(decoder):
    """The official openai client against `quickdraft serve` on llama.cpp: text, streams, batching."""
    server = BackgroundServer(create_app(decoder, max_batch=4, max_queue=8, max_tokens_limit=64))
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        expected = decoder.generate(PROMPTS[0], 24, chat=False)
        whole = client.completions.create(
            model=decoder.target.name,
            prompt=PROMPTS[0],
            max_tokens=24,
            temperature=0,
            extra_body={"quickdraft": {"method": "prompt-lookup"}},
        )
        assert whole.choices[0].text == expected.text
        results: dict[int, str] = {}

        def stream(index: int) -> None:
            pieces = client.chat.completions.create(
                model=decoder.target.name,
                max_tokens=16,
                temperature=0,
                messages=[{"role": "user", "content": PROMPTS[index % 2]}],
                stream=True,
            )
            results[index] = "".join(p.choices[0].delta.content or "" for p in pieces)

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(results) == 3 and all(results.values())
        # They were decoded in batched passes (several sequences in one llama.cpp context); that
        # each text equals its text alone is test_llama_cpp_under_load.py's.
        metrics = dict(
            line.rsplit(" ", 1)
            for line in httpx.get(server.url + "/metrics").text.splitlines()
            if line.startswith("quickdraft_batch_size_")
        )
        assert float(metrics["quickdraft_batch_size_sum"]) > float(metrics["quickdraft_batch_size_count"])
    finally:
        server.stop()


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory) -> LlamaCppBackend:
    path = gemma3_file(tmp_path_factory.mktemp("gemma3"))
    if path is None:
        pytest.skip("the Gemma 3 270M packages are not installed (./setup.sh installs them)")
    return LlamaCppBackend(path, "gemma-3-270m", threads=torch.get_num_threads())


def test_each_files_exact_decode_size_is_measured_and_keeps_rows_exact(backend, gemma3):
    """Gemma 3's file: a stock build takes its Q4_K weights 4 rows at a time (repacked) and its
    Q5_0/Q8_0 ones in sgemm blocks, so rows of a 4-token decode differ from one-token rows (by up to
    1.8 in a logit, measured); setup.sh's row-exact kernels cover all its types. Decoded in parts of
    the measured exact size, every pass's rows are one-token rows. Which size is exact depends on the
    build and the machine's kernels; that rows are exact at the measured size does not."""
    generator = torch.Generator().manual_seed(11)
    for model in (backend, gemma3):
        exact = model.measure_exact_rows()
        model.exact_rows = exact
        for context in (40, 300):
            prefix, new = random_tokens(generator, context), random_tokens(generator, 20)
            one_by_one = rows(model, prefix, new)
            cache = model.new_cache()
            model.forward([SeqPass(cache, prefix, logits="none")])
            for n in (2, 4, 8, 20):
                cache.truncate(context)
                together = model.forward([SeqPass(cache, new[:n])])[0].logits
                assert torch.equal(together, one_by_one[:n]), (model.name, exact, context, n)
            cache.truncate(0)


def test_the_copies_llama_cpp_repacks_beside_the_file_are_counted_as_it_logs_them(random_ggufs):
    # quickdraft plan predicts the repacked copies from the tensor table (read_shape, through
    # llama_cpp.repacked_bytes); the loaded backend reads their size from llama.cpp's log. The two
    # agree for every file type. (One header read per file: a Llama file's 49,152-token vocabulary
    # takes gguf's reader seconds.)
    from quickdraft.memory import read_shape

    counted = {}
    for (arch, kind), path in random_ggufs.items():
        backend = LlamaCppBackend(path, "r")
        predicted = read_shape(path).repacked_bytes
        assert abs(backend.extra_weight_bytes - predicted) <= 0.02 * predicted + (64 << 10), (arch, kind)
        counted[arch, kind] = predicted
    if ROW_EXACT_MATMUL in installed_patches():  # setup.sh's build repacks nothing (its kernels read ggml's layout)
        assert not any(counted.values())
    elif torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        assert counted["llama", "Q4_0"] > 0  # this CPU repacks: the comparison above was not of zeros
    assert counted["llama", "F32"] == 0


def test_a_pool_of_fewer_cells_than_sequences_loads_and_decodes():
    # llama.cpp aborts the process where n_seq_max exceeds the batch; the backend holds no more
    # sequences than cells.
    backend = LlamaCppBackend(default_gguf_path(), "small", cells=64)
    assert backend.max_sequences <= 64 and backend.cells >= 64  # llama.cpp may round its pool up
    cache = backend.new_cache()
    out = backend.forward([SeqPass(cache, [1, 2, 3, 4])])[0]
    assert out.logits.shape == (4, backend.vocab_size)


def test_passes_run_on_fewer_threads_when_asked(backend):
    generator = torch.Generator().manual_seed(11)
    tokens, new = random_tokens(generator, 20), random_tokens(generator, 3)
    before, threads = rows(backend, tokens, new), backend.threads
    try:
        backend.set_threads(1)
        assert backend.threads == 1
        torch.testing.assert_close(rows(backend, tokens, new), before, rtol=1e-4, atol=1e-3)
        with pytest.raises(ValueError, match="threads must be >= 1"):
            backend.set_threads(0)
        assert backend.threads == 1
    finally:
        backend.set_threads(threads)


def test_bench_all_runs_every_shipped_head_on_this_backend(decoder, capsys):
    # The shipped EAGLE-3 head drafts from inner layers, which llama.cpp returns for this file.
    from quickdraft.bench.contenders import method_contenders

    names = [c.name for c in method_contenders(decoder, ["all"])]
    assert {"none", "prompt-lookup", "medusa", "eagle"} <= set(names)
    assert "left out" not in capsys.readouterr().err
