"""Continuous batching on tiny models: a sequence's output does not depend on its neighbours."""

import gc
import threading
import time

import pytest

from quickdraft.backends.hf import HFCache
from quickdraft.backends.kv_cache import KVCache
from quickdraft.decoder import Decoder
from quickdraft.serve.scheduler import DECODERS_KEPT, Job, QueueFull, Scheduler, ShuttingDown
from tests.conftest import loaded
from tests.faults import FaultyDrafter
from tests.spec_util import assert_speculated

PROMPTS = [[1, 2, 3, 4, 1, 2, 3], [5, 9, 2], [7, 7, 7, 7, 7, 7, 7, 7], [3, 1, 4, 1, 5, 9, 2, 6], [8, 8, 1]]


class Collector:
    """Job callbacks that record what the scheduler reports."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.steps, self.output, self.error = 0, None, None

    def job(self, prompt, max_new_tokens=20, method=None, k=None, **options) -> Job:
        settings = {"k": k} if k is not None else {}
        return Job(
            prompt,
            max_new_tokens,
            {"temperature": 0.0} | options,
            method,
            settings,
            on_step=self.step,
            on_finish=self.finish,
            on_error=self.fail,
        )

    def step(self, record, text):
        self.steps += 1
        self.text = getattr(self, "text", "") + text

    def finish(self, output, decoder):
        self.output = output
        self.done.set()

    def fail(self, message, status):
        self.error = (message, status)
        self.done.set()


@pytest.fixture()
def decoder(tiny_target, tiny_draft):
    return Decoder(loaded(tiny_target, "tiny"), loaded(tiny_draft, "tiny-draft"), "prompt-lookup")


@pytest.mark.speculation
@pytest.mark.parametrize(
    "backend, precision", [("native", "fp32"), ("hf", "fp32"), ("native", "int4"), ("native", "bf16")]
)
def test_batched_sequences_equal_each_alone(tiny_target, tiny_draft, backend, precision):
    """Below fp32 every row is computed independently, so batching is exact by construction;
    at fp32 shared matmuls could differ in the last bits (the tests have not seen it)."""
    decoder = Decoder(
        loaded(tiny_target, "tiny"),
        loaded(tiny_draft, "tiny-draft"),
        "prompt-lookup",
        backend=backend,
        precision=precision,
    )
    methods = [("none", None), ("draft", 3), ("prompt-lookup", None), ("lookahead", None), ("draft", 1)]
    scheduler = Scheduler(decoder, max_batch=3, max_queue=8)  # 5 jobs: some wait, join as others leave
    collectors = [Collector() for _ in PROMPTS]
    for collector, prompt, (method, k), length in zip(collectors, PROMPTS, methods, [20, 7, 25, 13, 30]):
        scheduler.submit(collector.job(prompt, length, method, k))
    scheduler.start()
    for collector in collectors:
        assert collector.done.wait(60)
    scheduler.stop()
    for collector, prompt, (method, k), length in zip(collectors, PROMPTS, methods, [20, 7, 25, 13, 30]):
        alone = decoder.with_method(method, k).generate(prompt, max_new_tokens=length)
        assert collector.error is None
        assert collector.output.token_ids == alone.token_ids, (method, k)
        assert collector.steps == collector.output.stats.target_passes
    assert scheduler.metrics.batch_size.collect()[0].samples  # batched passes were observed
    assert_speculated([c.output for c, (method, _) in zip(collectors, methods) if method != "none"])


@pytest.mark.speculation
@pytest.mark.parametrize("backend, precision", [("native", "fp32"), ("native", "int4"), ("hf", "fp32")])
def test_sixteen_requests_of_mixed_lengths_equal_each_alone_greedy_and_seeded(
    tiny_target, tiny_draft, backend, precision
):
    """16 requests, prompts of 3 to 150 tokens, half greedy and half sampled with seeds of their own,
    served 4 and 16 at a time with a draft model: each equals its plain decoding alone."""
    target, draft = loaded(tiny_target, "tiny"), loaded(tiny_draft, "tiny-draft")
    decoder = Decoder(target, draft, "draft", 3, backend=backend, precision=precision)
    prompts = [[(7 * i + 3 * j) % 32 for j in range(length)] for i, length in enumerate([3, 9, 40, 150] * 4)]
    options = [{"temperature": 0.0} if i % 2 == 0 else {"temperature": 0.7, "seed": i} for i in range(16)]
    plain = decoder.with_method("none")
    expected = [plain.generate(p, max_new_tokens=12, **o).token_ids for p, o in zip(prompts, options)]
    for max_batch in (4, 16):
        scheduler = Scheduler(decoder, max_batch=max_batch, max_queue=16)
        collectors = [Collector() for _ in prompts]
        for collector, prompt, option in zip(collectors, prompts, options):
            scheduler.submit(collector.job(prompt, 12, **option))
        scheduler.start()
        assert all(c.done.wait(120) for c in collectors)
        scheduler.stop()
        got = [c.output.token_ids for c in collectors]
        assert [i for i in range(16) if got[i] != expected[i]] == [], max_batch
    assert_speculated([c.output for c in collectors])


def test_sampled_sequences_follow_their_own_seed(decoder):
    # Served beside each other, with the cost model's draft length: each text is its seed's plain
    # text (sampler gumbel), and rejection sampling's is its seed's alone with the same drafts.
    scheduler = Scheduler(decoder, max_batch=4)
    collectors = [Collector() for _ in range(4)]
    for seed, collector in enumerate(collectors):
        settings = {"draft_length": "cost"} if seed < 3 else {"sampler": "rejection", "draft_length": "fixed"}
        job = collector.job(PROMPTS[seed], 15, "draft", 2, temperature=1.0, seed=seed)
        job.settings.update(settings)
        scheduler.submit(job)
    scheduler.start()
    assert all(c.done.wait(60) for c in collectors)
    scheduler.stop()
    for seed, collector in enumerate(collectors):
        if seed < 3:
            alone = decoder.with_method("none").generate(PROMPTS[seed], 15, temperature=1.0, seed=seed)
        else:
            alone = decoder.with_method("draft", 2, sampler="rejection", draft_length="fixed").generate(
                PROMPTS[seed], 15, temperature=1.0, seed=seed
            )
        assert collector.output.token_ids == alone.token_ids, seed


def test_a_cancelled_job_leaves_and_the_others_finish(decoder):
    scheduler = Scheduler(decoder, max_batch=2)
    leaving, staying = Collector(), Collector()
    job = leaving.job(PROMPTS[0], 200)
    original_step = leaving.step

    def cancel_after_three(record, new_tokens):
        original_step(record, new_tokens)
        if leaving.steps == 3:
            job.cancelled.set()

    job.on_step = cancel_after_three
    scheduler.submit(job)
    scheduler.submit(staying.job(PROMPTS[1], 30))
    scheduler.start()
    assert staying.done.wait(60)
    scheduler.stop()
    assert leaving.output is None and leaving.steps == 3
    assert scheduler.running == 0
    assert scheduler.metrics.cancelled._value.get() == 1


def test_bad_jobs_fail_alone_and_the_queue_is_bounded(decoder):
    scheduler = Scheduler(decoder, max_batch=1, max_queue=2)
    bad, good = Collector(), Collector()
    scheduler.submit(bad.job([1, 2], 10, temperature=-1.0))
    scheduler.submit(good.job([1, 2], 10))
    with pytest.raises(QueueFull):
        scheduler.submit(Collector().job([1], 5))
    scheduler.start()
    assert bad.done.wait(30) and good.done.wait(30)
    assert bad.error[1] == 400 and "temperature" in bad.error[0]
    assert good.output is not None
    scheduler.stop()
    with pytest.raises(ShuttingDown):
        scheduler.submit(Collector().job([1], 5))


def test_stopping_past_its_drain_time_tells_the_unfinished_jobs(decoder):
    scheduler = Scheduler(decoder, max_batch=1, max_queue=4)
    running, waiting = Collector(), Collector()
    scheduler.submit(running.job(PROMPTS[0], 200))
    scheduler.submit(waiting.job(PROMPTS[1], 200))
    scheduler.start()
    deadline = time.monotonic() + 30
    while running.steps == 0:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    scheduler.stop(timeout=0)
    assert running.error == ("the server shut down before this request finished", 503)
    assert waiting.error[1] == 503 and waiting.output is None
    assert not scheduler._thread.is_alive()


def test_a_job_with_an_unknown_method_fails_alone(decoder):
    scheduler = Scheduler(decoder, max_batch=2)
    bad, good = Collector(), Collector()
    scheduler.submit(bad.job([1, 2], 5, method="telepathy"))
    scheduler.submit(good.job([1, 2], 5))
    scheduler.start()
    assert bad.done.wait(30) and good.done.wait(30)
    scheduler.stop()
    assert bad.error[1] == 400 and "unknown method" in bad.error[0]
    assert good.output is not None


class FaultyDecoder(Decoder):
    """Prompt lookup whose drafter raises, once a step is verified, for prompts starting with `marked`."""

    def __init__(self, *args, marked: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.drafter = FaultyDrafter(self.drafter, marked, "update")


def test_a_fault_in_one_sequence_fails_that_request_alone(tiny_target):
    decoder = FaultyDecoder(loaded(tiny_target, "tiny"), None, "prompt-lookup", marked=PROMPTS[1][0])
    scheduler = Scheduler(decoder, max_batch=len(PROMPTS))
    collectors = [Collector() for _ in PROMPTS]
    for collector, prompt in zip(collectors, PROMPTS):
        scheduler.submit(collector.job(prompt, 15))
    scheduler.start()
    for collector in collectors:
        assert collector.done.wait(60)
    scheduler.stop()
    for collector, prompt in zip(collectors, PROMPTS):
        if prompt is PROMPTS[1]:
            assert collector.error[1] == 500 and "injected fault" in collector.error[0]
        else:
            alone = Decoder(loaded(tiny_target, "tiny"), None, "prompt-lookup").generate(prompt, 15)
            assert collector.error is None and collector.output.token_ids == alone.token_ids
    assert scheduler.metrics.failed._value.get() == 1


class BrokenDecoder(Decoder):
    """Raises an unexpected error (not a QuickdraftError) where `at` says, for prompts starting with
    `marked`: while choosing the request's decoder, in prepare, or out of prefill's own reach."""

    def __init__(self, *args, at: str, marked: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.at, self.marked = at, marked

    def with_method(self, method=None, k=None, **options):
        if self.at == "decoder":
            raise RuntimeError("injected fault")
        return super().with_method(method, k, **options)

    def prepare(self, prompt_ids, *args, **kwargs):
        generation = super().prepare(prompt_ids, *args, **kwargs)
        if prompt_ids[0] == self.marked and self.at == "prepare":
            raise RuntimeError("injected fault")
        if prompt_ids[0] == self.marked and self.at == "prefill":
            generation.prompt_length = None  # prefill's grouping compares it: a TypeError no sequence owns
        return generation


@pytest.mark.parametrize("at", ["decoder", "prepare", "prefill"])
def test_every_admitted_job_ends_whatever_is_raised_while_admitting_it(tiny_target, at):
    decoder = BrokenDecoder(loaded(tiny_target, "tiny"), None, "prompt-lookup", at=at, marked=PROMPTS[1][0])
    scheduler = Scheduler(decoder, max_batch=len(PROMPTS))
    collectors = [Collector() for _ in PROMPTS]
    for collector, prompt in zip(collectors, PROMPTS):  # k=2 asks for a decoder of its own
        scheduler.submit(collector.job(prompt, 8, k=2 if prompt is PROMPTS[1] and at == "decoder" else None))
    scheduler.start()
    for collector in collectors:
        assert collector.done.wait(60), "a client waits forever"
    assert scheduler.alive
    later = Collector()
    scheduler.submit(later.job(PROMPTS[0], 8))  # the server goes on serving
    assert later.done.wait(60) and later.output is not None
    scheduler.stop()
    failed = [c for c in collectors if c.error is not None]
    assert failed and all(
        c.error[1] == 500 and ("injected fault" in c.error[0] or "NoneType" in c.error[0]) for c in failed
    )
    assert collectors[1] in failed
    if at != "prefill":  # a fault in one request's preparation ends that request alone
        assert failed == [collectors[1]]
    assert scheduler.metrics.failed._value.get() == len(failed)


def test_memory_is_bounded_whatever_options_requests_ask_for(decoder):
    """Forty distinct k values: request decoders are kept up to a bound, and no KV cache outlives
    its sequence (the backends' weights are shared; a sequence owns only its caches)."""
    scheduler = Scheduler(decoder, max_batch=4, max_queue=64)
    collectors = [Collector() for _ in range(40)]
    for k, collector in enumerate(collectors, start=1):
        scheduler.submit(collector.job(PROMPTS[k % len(PROMPTS)] * 8, 6, "draft", k))
    scheduler.start()
    for collector in collectors:
        assert collector.done.wait(60) and collector.error is None
    scheduler.stop()
    assert scheduler.kept_decoders <= DECODERS_KEPT
    gc.collect()
    assert not [o for o in gc.get_objects() if type(o) in (KVCache, HFCache)]
