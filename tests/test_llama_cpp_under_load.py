"""Exact under load on the llama.cpp backend: a sequence's output is the same whatever shares its
passes and its pool of cells (real GGUF files: the default SmolLM2 Q4_1 and Gemma 3 270M Q4_K_M).

Two things made rows depend on their neighbours, each caught here: a sequence's next token could
land in a cell another sequence freed below its own (llama.cpp's cell search; fixed by
patches/llama-cpp-ordered-cells.patch), and a prompt of 64 tokens or more took flash attention's
tiled path, whose sums follow where the cells sit (prompts now decode in parts of 63 rows).
"""

from __future__ import annotations

import threading
from pathlib import Path

import openai
import pytest
import torch
from llama_cpp_util import gemma3_file, random_tokens

import quickdraft
from quickdraft import Decoder
from quickdraft.backends.backend import SeqPass
from quickdraft.backends.llama_cpp import LlamaCppBackend, NoRoom, llama_cpp_installed
from quickdraft.serve import create_app
from quickdraft.serve.background import BackgroundServer
from quickdraft.serve.scheduler import Job, Scheduler

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not llama_cpp_installed(), reason="llama-cpp-python is not installed (./setup.sh builds it)"),
]

PARAGRAPH = (
    "The committee reviewed the quarterly report, which showed that revenue grew by eight percent while "
    "costs rose by three. Most of the growth came from the new service contracts in the northern region, "
    "and the board asked for a breakdown by customer size before the next meeting. "
)
# Short, medium and long prompts: some over 63 tokens (a prompt decoded in parts), one over 256
# (flash attention's KV-split threshold for a lone row once the pool holds 256 cells or more).
PROMPTS = [
    "Hi!",
    "Write a Python function that checks whether a number is prime.",
    "Name three rivers in Europe and one fact about each.",
    "Summarize in one sentence: " + PARAGRAPH,
    "List the steps to make a cup of tea.",
    "Rewrite this more formally: " + PARAGRAPH * 2,
    "What is 17 times 23? Explain.",
    "Give a title to this text: " + PARAGRAPH * 6,
]
NEW_TOKENS = 12


def jobs(decoder: Decoder) -> list[tuple[list[int], dict]]:
    """16 requests: each prompt greedy and sampled with a seed of its own (T = 0.7)."""
    ids = [decoder.encode(prompt) for prompt in PROMPTS]
    assert max(len(p) for p in ids) > 256 and min(len(p) for p in ids) < 63
    greedy = [(p, {"temperature": 0.0}) for p in ids]
    sampled = [(p, {"temperature": 0.7, "seed": 100 + i}) for i, p in enumerate(ids)]
    return [request for pair in zip(greedy, sampled) for request in pair]


def served(decoder: Decoder, requests: list[tuple[list[int], dict]], max_batch: int) -> list[list[int]]:
    """Each request's new tokens when the scheduler runs them `max_batch` at a time (those beyond
    wait and join as others finish: prompts read while others decode)."""
    scheduler = Scheduler(decoder, max_batch=max_batch, max_queue=len(requests))
    outputs: list = [None] * len(requests)
    done = [threading.Event() for _ in requests]

    def finish(i: int):
        return lambda output, _decoder: (outputs.__setitem__(i, output.token_ids), done[i].set())

    def fail(i: int):
        return lambda message, _status: (outputs.__setitem__(i, message), done[i].set())

    for i, (prompt, options) in enumerate(requests):
        scheduler.submit(Job(prompt, NEW_TOKENS, options, on_finish=finish(i), on_error=fail(i)))
    scheduler.start()
    try:
        for event in done:
            assert event.wait(300)
    finally:
        scheduler.stop()
    return outputs


def alone(decoder: Decoder, requests: list[tuple[list[int], dict]]) -> list[list[int]]:
    return [decoder.generate(prompt, NEW_TOKENS, **options).token_ids for prompt, options in requests]


def assert_each_as_alone(decoder: Decoder, method: str, requests, expected, batches=(4, 16)) -> None:
    for max_batch in batches:
        got = served(decoder.with_method(method), requests, max_batch)
        differ = [i for i, (a, b) in enumerate(zip(got, expected)) if a != b]
        assert not differ, (
            f"{method}: {len(differ)} of {len(requests)} differ from alone at {max_batch} concurrent: {differ}"
        )


@pytest.fixture(scope="module")
def smollm2() -> Decoder:
    return quickdraft.load(method="none", backend="llama.cpp", measure_shapes=False)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory) -> Decoder:
    path = gemma3_file(tmp_path_factory.mktemp("gemma3"))
    if path is None:
        pytest.skip("the Gemma 3 270M packages are not installed (./setup.sh installs them)")
    return quickdraft.load(target=str(path), method="none", backend="llama.cpp", measure_shapes=False)


def test_every_request_equals_itself_alone_on_the_default_file(smollm2):
    """Alone: plain decoding, one request at a time. Then 4 and 16 at a time, plain, with prompt
    lookup, suffix decoding and the EAGLE-3 head (drafted rows beside other sequences' rows):
    greedy and seeded (sampler gumbel) outputs follow the target and the seed alone, so each must
    equal its plain output alone."""
    assert smollm2.batches_exactly and smollm2.target_backend.ordered_cells
    requests = jobs(smollm2)
    expected = alone(smollm2, requests)
    assert_each_as_alone(smollm2, "none", requests, expected, batches=(16,))
    assert_each_as_alone(smollm2, "prompt-lookup", requests, expected)
    # suffix decoding: trees drafted from the answers that finished before, beside others' rows
    assert_each_as_alone(smollm2, "suffix", requests, expected, batches=(16,))
    # the shipped EAGLE-3 head: trees drafted from the inputs of inner layers, recorded beside others' rows
    assert_each_as_alone(smollm2, "eagle", requests, expected, batches=(16,))


def test_every_request_equals_itself_alone_on_gemma3(gemma):
    """Gemma 3: sliding-window layers (their own cache), and a file whose exact decode is a few rows."""
    requests = jobs(gemma)
    assert_each_as_alone(gemma, "prompt-lookup", requests, alone(gemma, requests))


def rows_after(backend: LlamaCppBackend, cache, new: list[int]) -> torch.Tensor:
    return torch.cat([backend.forward([SeqPass(cache, [t])])[0].logits for t in new])


def test_a_sequence_stays_above_cells_freed_below_it(smollm2):
    """A sequence's next tokens after another sequence freed cells below its own: llama.cpp's own
    search starts again from the pool's first free cell and puts them there (out of position
    order); the patched search keeps them above. Its rows equal the same sequence alone."""
    backend = smollm2.target_backend
    generator = torch.Generator().manual_seed(3)
    first, second, new = random_tokens(generator, 90), random_tokens(generator, 40), random_tokens(generator, 8)
    expected = rows_after(backend, reference := backend.new_cache(), second + new)[-len(new) :]
    reference.truncate(0)
    below, cache = backend.new_cache(), backend.new_cache()
    backend.forward([SeqPass(below, first, logits="none")])
    backend.forward([SeqPass(cache, second, logits="none")])
    below.truncate(10)  # frees 80 cells under `cache`'s
    assert torch.equal(torch.cat([backend.forward([SeqPass(cache, [t])])[0].logits for t in new]), expected)
    below.truncate(0)
    cache.truncate(0)


def test_a_long_prompt_reads_the_same_wherever_its_cells_sit(smollm2):
    """A prompt of 300 tokens read after 37 cells are taken (not a whole tile of flash attention's
    tiled path) gives the next rows a prompt read into an empty pool gives."""
    backend = smollm2.target_backend
    generator = torch.Generator().manual_seed(4)
    prompt, new, other = random_tokens(generator, 300), random_tokens(generator, 4), random_tokens(generator, 37)
    fresh = backend.new_cache()
    backend.forward([SeqPass(fresh, prompt, logits="none")])
    expected = rows_after(backend, fresh, new)
    fresh.truncate(0)
    taken, cache = backend.new_cache(), backend.new_cache()
    backend.forward([SeqPass(taken, other, logits="none")])
    backend.forward([SeqPass(cache, prompt, logits="none")])
    assert torch.equal(rows_after(backend, cache, new), expected)
    taken.truncate(0)
    cache.truncate(0)


def test_a_full_top_of_the_pool_is_compacted_and_rows_stay_exact(smollm2):
    """With ordered cells a sequence needs free cells above its own: when only cells below are
    free, the pool is compacted (every sequence's cells moved down in order, bits kept) and the
    pass runs; when no cell is free at all it still raises NoRoom."""
    path = smollm2.target_backend.gguf
    small = LlamaCppBackend(path, "small", cells=256, threads=smollm2.target_backend.threads, max_sequences=8)
    small.exact_rows = 1
    generator = torch.Generator().manual_seed(6)
    a, b, c, new = (random_tokens(generator, n) for n in (100, 100, 50, 10))
    expected = rows_after(small, reference := small.new_cache(), c + new)[-len(new) :]
    reference.truncate(0)
    first, second, third = small.new_cache(), small.new_cache(), small.new_cache()
    for cache, tokens in ((first, a), (second, b), (third, c)):
        small.forward([SeqPass(cache, tokens, logits="none")])  # cells 0-99, 100-199, 200-249
    first.truncate(0)
    second.truncate(0)  # 200 cells free below `third`, 6 above it
    assert torch.equal(rows_after(small, third, new), expected)
    assert small.compactions == 1
    filler = small.new_cache()
    with pytest.raises(NoRoom):
        small.forward([SeqPass(filler, random_tokens(generator, 200), logits="none")])
    assert filler.length == 0 and third.length == 60  # nothing changed by the refused pass


def test_a_build_without_ordered_cells_serves_one_request_at_a_time(smollm2):
    """A stock llama-cpp-python cannot keep a sequence's cells in order: the server says so at start
    and decodes one request at a time, which is exact."""
    # A context no other test uses: the model keeps one backend per context.
    decoder = Decoder(smollm2.target, None, "none", backend="llama.cpp", context=704, measure_shapes=False)
    decoder.target_backend.ordered_cells = False  # what installed_patches() reads from a stock build
    assert not decoder.batches_exactly
    with pytest.warns(UserWarning, match="one at a time"):
        scheduler = Scheduler(decoder, max_batch=8)
    assert scheduler.max_batch == 1
    assert Scheduler(smollm2, max_batch=8).max_batch == 8


def test_the_server_answers_each_request_as_alone_under_load(smollm2):
    """The official openai client, 8 streamed chat requests at once (greedy and seeded) against
    `quickdraft serve`'s defaults on this backend (prompt lookup): each text equals its text alone."""
    decoder = smollm2.with_method("prompt-lookup")
    server = BackgroundServer(create_app(decoder, max_batch=8, max_queue=16, max_tokens_limit=64))
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        asks = [(prompt, {"temperature": 0.0}) for prompt in PROMPTS[:4]]
        asks += [(prompt, {"temperature": 0.7, "seed": 7 + i}) for i, prompt in enumerate(PROMPTS[4:])]

        def ask(i: int, results: dict) -> None:
            prompt, options = asks[i]
            pieces = client.chat.completions.create(
                model=decoder.target.name,
                max_tokens=NEW_TOKENS,
                messages=[{"role": "user", "content": prompt}],
                stream=True,
                **options,
            )
            results[i] = "".join(p.choices[0].delta.content or "" for p in pieces)

        one_by_one: dict[int, str] = {}
        for i in range(len(asks)):
            ask(i, one_by_one)
        together: dict[int, str] = {}
        threads = [threading.Thread(target=ask, args=(i, together)) for i in range(len(asks))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        differ = [i for i in range(len(asks)) if together.get(i) != one_by_one[i]]
        assert not differ, f"{len(differ)} of {len(asks)} answers differ from their answer alone: {differ}"
    finally:
        server.stop()


def test_the_installed_build_lists_its_patches():
    from quickdraft.backends.llama_cpp import ORDERED_CELLS, installed_patches

    listed = installed_patches()
    assert ORDERED_CELLS in listed and "llama-cpp-row-independent-attention.patch" in listed
    assert all((Path(__file__).parent.parent / "patches" / name).is_file() for name in listed)
