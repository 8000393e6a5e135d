"""The OpenAI-compatible server on the embedded default target, driven by the official client."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

import quickdraft
from quickdraft.serve import create_app
from quickdraft.serve.background import BackgroundServer

pytestmark = pytest.mark.integration
PROMPT = "Write a Python function that checks whether a number is prime."


def post_json(url: str, body: dict) -> httpx.Response:
    """POST body as ASCII JSON: unpaired surrogates travel as \\ud800 escapes, as a client might send."""
    return httpx.post(url, content=json.dumps(body), headers={"content-type": "application/json"}, timeout=30)


class Server(BackgroundServer):
    def client(self, **options) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, **options)


@pytest.fixture(scope="module")
def decoder():
    # The native backend: batched rows equal each request's rows alone bit for bit there, which
    # the concurrency tests below check. (On llama.cpp, sequences sharing one pool of cells are
    # equal up to rounding: docs/llama-cpp.md; tests/test_llama_cpp_backend.py serves on it.)
    loaded = quickdraft.load(method="prompt-lookup", backend="native")
    loaded.warm_up()  # as `quickdraft serve` does: no request below waits for the pass timing
    return loaded


@pytest.fixture(scope="module")
def server(decoder):
    running = Server(create_app(decoder, max_batch=16, max_queue=32, max_tokens_limit=256))
    yield running
    running.stop()


def test_models_health_and_metrics(server, decoder):
    models = server.client().models.list()
    assert [m.id for m in models.data] == [decoder.target.name]
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    # The prompt repeats itself, so prompt lookup finds a match and drafts at once.
    server.client().completions.create(
        model=decoder.target.name, prompt="red green blue red green blue red green", max_tokens=4, temperature=0
    )
    metrics = httpx.get(server.url + "/metrics").text
    for name in (
        "quickdraft_requests_total",
        "quickdraft_target_passes_total",
        "quickdraft_drafted_tokens_total",
        "quickdraft_accepted_tokens_total",
        "quickdraft_acceptance_rate",
        "quickdraft_mean_accepted_length",
        "quickdraft_queue_length",
        "quickdraft_batch_size_bucket",
        'quickdraft_drafted_at_position_total{position="1"}',
        "quickdraft_generated_tokens_total",
        "quickdraft_request_latency_seconds_bucket",
        "quickdraft_time_to_first_token_seconds_bucket",
    ):
        assert name in metrics
    # The memory report as gauges: weights counted from the loaded tensors, caches at --max-batch.
    gauges = {
        line.split('"')[1]: float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("quickdraft_memory_bytes{")
    }
    assert gauges["target_weights"] + gauges["transformers_copy"] > 0 and gauges["kv_per_token"] > 0
    assert gauges["total"] >= gauges["kv_total"] >= gauges["kv_per_sequence"] > 0


def test_completion_streamed_and_not_agree_with_the_library(server, decoder):
    client = server.client()
    name = decoder.target.name
    whole = client.completions.create(
        model=name,
        prompt="The capital of France is",
        max_tokens=24,
        temperature=0,
        extra_body={"quickdraft": {"method": "prompt-lookup", "k": 4}},
    )
    expected = decoder.with_method("none").generate("The capital of France is", 24, chat=False)
    assert whole.choices[0].text == expected.text
    assert whole.usage.completion_tokens == len(expected.token_ids)
    assert whole.choices[0].finish_reason in ("stop", "length")
    stats = whole.model_extra["quickdraft"]
    assert stats["method"] == "prompt-lookup" and stats["k"] == 4 and stats["target_passes"] >= 1
    pieces = list(
        client.completions.create(
            model=name, prompt="The capital of France is", max_tokens=24, temperature=0, stream=True
        )
    )
    assert "".join(p.choices[0].text for p in pieces) == expected.text
    assert pieces[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_chat_streamed_and_not_with_a_stop_string(server, decoder):
    client = server.client()
    messages = [{"role": "user", "content": PROMPT}]
    whole = client.chat.completions.create(
        model=decoder.target.name, messages=messages, max_tokens=60, temperature=0, stop=["return"]
    )
    expected = decoder.with_method("none").generate(PROMPT, 60, stop=["return"])
    assert whole.choices[0].message.content == expected.text
    assert whole.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(
        model=decoder.target.name,
        messages=messages,
        max_tokens=60,
        temperature=0,
        stop=["return"],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected.text
    assert chunks[-1].usage.completion_tokens == len(expected.token_ids)


@pytest.mark.parametrize(
    "body, status, fragment",
    [
        ({"model": "nope", "prompt": "hi"}, 404, "does not exist"),
        ({"prompt": "hi"}, 400, "model"),
        ({"model": "M", "prompt": "hi", "max_tokens": 0}, 400, "max_tokens must be >= 1"),
        ({"model": "M", "prompt": "hi", "max_tokens": 100000}, 400, "over this server's limit"),
        ({"model": "M", "prompt": "hi", "max_tokens": "many"}, 400, "max_tokens"),
        ({"model": "M", "prompt": "hi", "temperature": "hot"}, 400, "temperature"),
        ({"model": "M", "prompt": "hi", "n": 2}, 400, "n=1"),
        ({"model": "M", "prompt": "hi", "quickdraft": {"method": "telepathy"}}, 400, "unknown method"),
        ({"model": "M", "prompt": "hi", "quickdraft": {"method": "draft"}}, 400, "needs a draft model"),
        ({"model": "M", "prompt": "hi", "quickdraft": {"k": 0}}, 400, "k must be in 1..64, got 0"),
        ({"model": "M", "prompt": "hi", "quickdraft": {"k": 1180591620717411303424}}, 400, "k must be in 1..64"),
        ({"model": "M", "prompt": "hi", "quickdraft": {"k": "four"}}, 400, "k must be an integer"),
        ({"model": "M", "prompt": "hi", "quickdraft": {"colour": 3}}, 400, "unknown option 'colour'"),
        (
            {"model": "M", "prompt": "hi", "quickdraft": {"method": "lookahead", "max_ngram": 3}},
            400,
            "does not apply to method 'lookahead'",
        ),
        ({"model": "M", "prompt": "hi", "quickdraft": {"method": "prompt-lookup:k=2,k_max=999"}}, 400, "k_max must be"),
        ({"model": "M", "prompt": "hi", "quickdraft": {"precision": "int4"}}, 400, "set when the server starts"),
        ({"model": "M", "prompt": "word " * 9000, "max_tokens": 16}, 400, "context length"),
        ({"model": "M", "prompt": ""}, 400, "empty"),
        ({"model": "M", "prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, 400, "at most 4"),
        ({"model": "M", "prompt": "hi", "stop": "x" * 300}, 400, "at most 256"),
        ({"model": "M", "prompt": "hi", "seed": 2**70}, 400, "seed"),
        ({"model": "M", "prompt": "a\ud800b"}, 400, "unpaired surrogate"),
        ({"model": "M", "prompt": ["a", "b"]}, 400, "one prompt"),
        ({"model": "M", "prompt": "hi", "logprobs": 50}, 400, "logprobs"),
        ({"model": "M", "prompt": "hi", "logit_bias": {"5": 10}}, 400, "logit_bias is not supported"),
        ({"model": "M", "prompt": "hi", "presence_penalty": 0.5}, 400, "presence_penalty is not supported"),
        ({"model": "M", "prompt": "hi", "echo": True}, 400, "echo is not supported"),
        ({"model": "M", "prompt": "hi", "best_of": 3}, 400, "best_of is not supported"),
        ({"model": "M", "prompt": "hi", "suffix": "end"}, 400, "suffix is not supported"),
        ({"model": "M", "prompt": "hi", "response_format": {"type": "json_object"}}, 400, "response_format"),
        ({"model": "M", "prompt": "word " * 300000}, 400, "longer than the context length"),
    ],
)
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(server, decoder, body, status, fragment):
    body = {key: decoder.target.name if value == "M" else value for key, value in body.items()}
    response = post_json(server.url + "/v1/completions", body)
    assert response.status_code == status
    error = response.json()["error"]
    assert fragment in error["message"] and error["type"]
    if "quickdraft" in body:  # the error names the option at fault
        assert error["param"].startswith("quickdraft")
    assert httpx.get(server.url + "/health").json()["status"] == "ok"


@pytest.mark.parametrize(
    "messages, fragment",
    [
        ([{"role": "user", "content": [{"type": "text", "text": 5}]}], "valid string"),
        ([{"role": "user", "content": [{"type": "text", "text": None}]}], "needs a 'text' string"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "'image_url' are not"),
        ([{"role": "user", "content": "a\ud800b"}], "unpaired surrogate"),
        ([{"role": "user", "content": [{"type": "text", "text": "a\udfffb"}]}], "unpaired surrogate"),
        ([{"role": "user", "content": "word " * 9000}], "the prompt"),  # no max_tokens: the prompt is at fault
    ],
)
def test_bad_chat_content_gets_a_400_never_a_500(server, decoder, messages, fragment):
    response = post_json(server.url + "/v1/chat/completions", {"model": decoder.target.name, "messages": messages})
    assert response.status_code == 400, response.text
    assert fragment in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "extra",
    [
        {"tools": [{"type": "function", "function": {"name": "f"}}]},
        {"tool_choice": "required"},
        {"frequency_penalty": 1.0},
        {"top_logprobs": 2},
    ],
)
def test_unsupported_chat_fields_are_refused_by_name(server, decoder, extra):
    response = httpx.post(
        server.url + "/v1/chat/completions",
        timeout=30,
        json={"model": decoder.target.name, "messages": [{"role": "user", "content": "hi"}]} | extra,
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == next(iter(extra))


def test_fields_that_ask_for_nothing_are_accepted(server, decoder):
    whole = server.client().chat.completions.create(
        model=decoder.target.name,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=2,
        temperature=0,
        presence_penalty=0,
        frequency_penalty=0,
        logit_bias={},
        response_format={"type": "text"},
        user="me",
    )
    assert whole.usage.completion_tokens == 2


def test_logprobs_are_the_targets(server, decoder):
    client, name = server.client(), decoder.target.name
    expected = decoder.with_method("none").generate(PROMPT, 12, logprobs=2)
    whole = client.chat.completions.create(
        model=name,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=12,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = whole.choices[0].logprobs.content
    assert len(content) == 12 and [e.logprob for e in content] == pytest.approx(
        [e.logprob for e in expected.logprobs], abs=1e-4
    )
    for entry in content:  # greedy: each token is the most likely one
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
        assert entry.logprob <= 0 and bytes(entry.bytes) == entry.token.encode()
    stream = client.chat.completions.create(
        model=name,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=12,
        temperature=0,
        logprobs=True,
        stream=True,
    )
    streamed = [e for c in stream if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]
    legacy = client.completions.create(
        model=name, prompt="The capital of France is", max_tokens=6, temperature=0, logprobs=1
    )
    assert len(legacy.choices[0].logprobs.token_logprobs) == 6
    assert "".join(legacy.choices[0].logprobs.tokens) == legacy.choices[0].text


def test_extreme_sampling_values_answer_and_spare_their_batch(server, decoder):
    """temperature 1e-38 and top_p 1e-300 underflowed to NaN and failed every stream batched with them."""
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    name = decoder.target.name

    async def healthy(prompt: str) -> str:
        stream = await client.completions.create(model=name, prompt=prompt, max_tokens=20, temperature=0, stream=True)
        return "".join([c.choices[0].text async for c in stream if c.choices])

    async def everything():
        hostile = [
            client.completions.create(model=name, prompt="Once upon a time", max_tokens=20, **options)
            for options in ({"temperature": 1e-38}, {"temperature": 1, "top_p": 1e-300})
        ]
        return await asyncio.gather(*hostile, *(healthy(f"Fact {i}: the sun") for i in range(4)))

    tiny, narrow, *texts = asyncio.run(everything())
    greedy = decoder.with_method("none").generate("Once upon a time", 20, chat=False).text
    assert tiny.choices[0].text == greedy and narrow.choices[0].text == greedy  # both keep only the top token
    for i, text in enumerate(texts):
        assert text == decoder.with_method("none").generate(f"Fact {i}: the sun", 20, chat=False).text


def test_large_bodies_get_a_413_without_blocking_others(server, decoder):
    huge = b'{"model": "m", "prompt": "' + b"x" * (3 << 20) + b'"}'
    response = httpx.post(
        server.url + "/v1/completions", content=huge, timeout=30, headers={"content-type": "application/json"}
    )
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
    chunked = httpx.post(
        server.url + "/v1/completions",
        content=iter([b"x" * (1 << 20)] * 3),
        timeout=30,
        headers={"content-type": "application/json"},
    )  # no Content-Length: counted as it comes
    assert chunked.status_code == 413
    assert httpx.get(server.url + "/health").status_code == 200


def test_a_non_streaming_client_that_leaves_frees_its_slot(server, decoder):
    body = {
        "model": decoder.target.name,
        "prompt": "Count from one to one thousand: one, two,",
        "max_tokens": 250,
        "temperature": 0,
    }
    cancelled = server.app.state.metrics.cancelled._value.get()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, timeout=1.0)
    assert_dropped(server, cancelled, within=10)


def test_metrics_labels_stay_bounded_and_405_says_allow(server):
    before = len(httpx.get(server.url + "/metrics").text.splitlines())
    for i in range(50):
        response = httpx.get(f"{server.url}/no/such/path/{i}")
        assert response.status_code == 404 and response.json()["error"]["type"] == "not_found_error"
    after = len(httpx.get(server.url + "/metrics").text.splitlines())
    assert after - before <= 2  # one "unmatched" series at most, not one per path
    response = httpx.get(server.url + "/v1/completions")
    assert response.status_code == 405 and response.headers["allow"] == "POST" and "error" in response.json()


def test_api_key_and_host_header(decoder):
    guarded = Server(create_app(decoder, max_tokens_limit=8, api_key="sesame"))
    try:
        assert httpx.get(guarded.url + "/health").status_code == 200  # probes need no key
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Basic sesame"}):
            response = httpx.get(guarded.url + "/v1/models", headers=headers)
            assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            guarded.client().models.list()
        client = openai.OpenAI(base_url=guarded.url + "/v1", api_key="sesame", max_retries=0)
        assert [m.id for m in client.models.list().data] == [decoder.target.name]
        rebound = httpx.get(guarded.url + "/health", headers={"host": "attacker.example:8000"})
        assert rebound.status_code == 400 and rebound.json()["error"]["code"] == "invalid_host"
        assert httpx.get(guarded.url.replace("127.0.0.1", "localhost") + "/health").status_code == 200
        # HTTP/1.0 with no Host header cannot be a rebinding attack: answered; with a foreign Host it is not.
        assert raw_status(guarded.url, b"GET /health HTTP/1.0\r\n\r\n") == 200
        assert raw_status(guarded.url, b"GET /health HTTP/1.0\r\nHost: attacker.example\r\n\r\n") == 400
        assert raw_status(guarded.url, b"GET /health HTTP/1.0\r\nHost:\r\n\r\n") == 400  # there, but empty
    finally:
        guarded.stop()


def raw_status(url: str, request: bytes) -> int:
    """The status line's code of a request written byte for byte (what httpx would not send)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(request)
        return int(connection.makefile("rb").readline().split()[1])


def test_malformed_json_and_chat_without_messages(server, decoder):
    response = httpx.post(
        server.url + "/v1/chat/completions",
        content=b"{not json",
        timeout=30,
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400 and "JSON" in response.json()["error"]["message"]
    response = httpx.post(server.url + "/v1/chat/completions", json={"model": decoder.target.name, "messages": []})
    assert response.status_code == 400 and "messages" in response.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError):
        server.client().chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])


def test_sixteen_concurrent_streams_equal_each_request_alone(server, decoder):
    prompts = [
        f"{topic} Answer in two sentences."
        for topic in (
            "What is a prime number?",
            "Why is the sky blue?",
            "Name three fruits.",
            "What is Python?",
            "How do plants grow?",
            "What is rain?",
            "Who was Ada Lovelace?",
            "What is a CPU?",
            "Describe a cat.",
            "What is gravity?",
            "How does a bike work?",
            "What is music?",
            "Explain photosynthesis.",
            "What is the moon?",
            "Why do we sleep?",
            "What is a river?",
        )
    ]
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)

    async def one(prompt: str, method: str) -> tuple[str, str]:
        stream = await client.chat.completions.create(
            model=decoder.target.name,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=40,
            temperature=0,
            stream=True,
            extra_body={"quickdraft": {"method": method}},
        )
        text, finish = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        return text, finish

    async def everything():
        methods = ["prompt-lookup", "none", "lookahead", "prompt-lookup"] * 4
        together = await asyncio.gather(*(one(p, m) for p, m in zip(prompts, methods)))
        alone = [await one(p, m) for p, m in zip(prompts[:4], methods[:4])]  # the server, one at a time
        return together, alone

    together, alone = asyncio.run(everything())
    assert together[:4] == alone
    for prompt, (text, finish) in zip(prompts, together):
        expected = decoder.with_method("none").generate(prompt, 40)
        assert finish in ("stop", "length")
        assert text == expected.text, prompt


def assert_dropped(server: Server, cancelled_before: float, within: float) -> None:
    """The scheduler drops an abandoned sequence within `within` seconds and runs nothing after it."""
    deadline = time.monotonic() + within
    while server.app.state.metrics.cancelled._value.get() == cancelled_before:
        assert time.monotonic() < deadline, "the abandoned sequence kept its slot"
        time.sleep(0.05)
    assert server.app.state.scheduler.running == 0


def test_a_client_leaving_mid_stream_frees_its_slot(server, decoder):
    body = {
        "model": decoder.target.name,
        "prompt": "Count from one to one thousand: one, two,",
        "max_tokens": 250,
        "temperature": 0,
        "stream": True,
    }
    cancelled = server.app.state.metrics.cancelled._value.get()
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                break  # one chunk, then hang up
    assert_dropped(server, cancelled, within=30)


def test_a_full_queue_answers_429(decoder):
    small = Server(create_app(decoder, max_batch=1, max_queue=1, max_tokens_limit=256))
    try:
        body = {
            "model": decoder.target.name,
            "prompt": "Tell me a long story about a dragon.",
            "max_tokens": 120,
            "temperature": 0,
        }

        async def burst():
            async with httpx.AsyncClient(timeout=120) as client:
                return await asyncio.gather(*(client.post(small.url + "/v1/completions", json=body) for _ in range(4)))

        # One request decoding first, so the burst meets a busy slot: one waits, the rest are refused
        # (a burst on an idle server could fill the queue before the scheduler admitted anything).
        request, answers = running_request(small, body)
        statuses = sorted(r.status_code for r in asyncio.run(burst()))
        request.join(120)
        assert [a.status_code for a in answers] == [200]
        assert statuses.count(200) >= 1 and 429 in statuses  # with the running one: at least 2 answered
        request, _ = running_request(small, body)
        limited = next(r for r in asyncio.run(burst()) if r.status_code == 429)
        request.join(120)
        assert limited.json()["error"]["type"] == "rate_limit_error" and limited.headers["retry-after"] == "1"
    finally:
        small.stop()


def running_request(server: Server, body: dict) -> tuple[threading.Thread, list[httpx.Response]]:
    """Post `body` from a thread; return once the scheduler is decoding it."""
    answers = []
    request = threading.Thread(
        target=lambda: answers.append(httpx.post(server.url + "/v1/completions", json=body, timeout=120))
    )
    request.start()
    deadline = time.monotonic() + 30
    while server.app.state.scheduler.running == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return request, answers


def test_shutdown_finishes_the_requests_in_flight(decoder):
    server = Server(create_app(decoder, max_batch=4, max_queue=4, max_tokens_limit=256))
    body = {
        "model": decoder.target.name,
        "prompt": "Count from one to one hundred: one, two,",
        "max_tokens": 60,
        "temperature": 0,
    }
    request, answers = running_request(server, body)
    server.stop()  # like Ctrl-C: stop listening, finish what is running, then stop the scheduler
    request.join(60)
    assert answers[0].status_code == 200
    assert answers[0].json()["usage"]["completion_tokens"] == 60
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/health")


def test_shutdown_ends_what_outlives_the_drain_with_a_clean_error(decoder):
    server = Server(create_app(decoder, max_batch=4, max_queue=4, max_tokens_limit=400, drain_seconds=0.5))
    body = {
        "model": decoder.target.name,
        "prompt": "Count from one to one thousand: one, two,",
        "max_tokens": 400,
        "temperature": 0,
    }
    request, answers = running_request(server, body)
    started = time.monotonic()
    server.stop()
    request.join(30)
    assert time.monotonic() - started < 10  # 400 tokens would take far longer
    assert answers[0].status_code == 503 and "shut down" in answers[0].json()["error"]["message"]
    assert not server.thread.is_alive()


def test_sigterm_drains_for_the_given_time_and_the_process_exits(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "quickdraft.cli",
            "serve",
            "--port",
            str(port),
            "--drain-seconds",
            "1",
            "--max-tokens-limit",
            "400",
            "--threads",
            "1",
        ]
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None and time.monotonic() < deadline, "the server did not start"
            try:
                name = httpx.get(url + "/health", timeout=1).json()["model"]
                break
            except httpx.HTTPError:
                time.sleep(0.3)
        answers = []
        body = {
            "model": name,
            "prompt": "Count from one to one thousand: one, two,",
            "max_tokens": 400,
            "temperature": 0,
            "stream": True,
        }

        def stream() -> None:
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
                answers.extend(response.iter_lines())

        reader = threading.Thread(target=stream)
        reader.start()
        time.sleep(2)
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it caught
        reader.join(30)
        lines = [line for line in answers if line]
        assert any("shut down" in line for line in lines) and lines[-1] == "data: [DONE]"
    finally:
        if process.poll() is None:
            process.kill()


class BrokenDecoder(quickdraft.Decoder):
    """The default target whose chat encoding raises something no handler expects."""

    def encode_chat(self, messages):
        raise RuntimeError("a bug")


def test_an_unexpected_error_is_an_openai_shaped_500(decoder):
    broken = Server(create_app(BrokenDecoder(decoder.target, None, "none"), max_tokens_limit=8))
    try:
        response = httpx.post(
            broken.url + "/v1/chat/completions",
            timeout=30,
            json={"model": decoder.target.name, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert response.status_code == 500
        assert response.json()["error"] == {
            "message": "internal server error: RuntimeError",
            "type": "server_error",
            "param": None,
            "code": None,
        }
        assert httpx.get(broken.url + "/health").status_code == 200
    finally:
        broken.stop()


def test_the_steps_endpoint_streams_step_records_then_done_and_the_playground_is_served(server, decoder):
    body = {
        "model": decoder.target.name,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 12,
        "temperature": 0,
        "quickdraft": {"method": "lookahead"},
    }
    with httpx.stream("POST", server.url + "/v1/quickdraft/steps", json=body, timeout=120) as response:
        events = [block for block in response.read().decode().split("\n\n") if block]
    kinds = [block.split("\n")[0] for block in events]
    assert set(kinds[:-1]) == {"event: step"} and kinds[-1] == "event: done"
    bad = httpx.post(server.url + "/v1/quickdraft/steps", json=body | {"quickdraft": {"method": "nope"}})
    assert bad.status_code == 400 and "unknown method" in bad.json()["error"]["message"]
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and "quickdraft playground" in page.text
    assert httpx.get(server.url + "/playground/playground.js").headers["content-type"].startswith("text/javascript")
    assert httpx.get(server.url + "/playground/nope.js").status_code == 404
    info = httpx.get(server.url + "/v1/quickdraft/info").json()
    assert info["model"] == decoder.target.name and "lookahead" in info["methods"] and info["backend"] == "native"


def test_suffix_decoding_drafts_from_the_same_keys_outputs_only(decoder):
    """Each API key's requests draft from that key's earlier answers alone (speed would tell one
    key what another was sent), unless the operator shares them across keys."""

    def ask(server: Server, key: str) -> dict:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)
        messages = [{"role": "user", "content": PROMPT}]
        answer = client.chat.completions.create(
            model=decoder.target.name, messages=messages, max_tokens=32, temperature=0
        )
        return answer.model_extra["quickdraft"]

    def counts(stats: dict) -> tuple:
        return stats["target_passes"], stats["drafted_tokens"], stats["accepted_tokens"]

    kept = Server(create_app(decoder.with_method("suffix"), max_tokens_limit=32, api_key=("alpha", "beta")))
    try:
        first, again, other = ask(kept, "alpha"), ask(kept, "alpha"), ask(kept, "beta")
        assert counts(again)[0] < counts(first)[0]  # alpha's second answer drafts from its first
        assert counts(other) == counts(first)  # beta drafts as if nothing had been answered before
        metrics = httpx.get(kept.url + "/metrics", headers={"authorization": "Bearer beta"}).text
        assert 'quickdraft_suffix_pool{measure="tenants"} 2.0' in metrics
    finally:
        kept.stop()
    shared = Server(
        create_app(
            decoder.with_method("suffix"), max_tokens_limit=32, api_key=("alpha", "beta"), share_across_keys=True
        )
    )
    try:
        first, other = ask(shared, "alpha"), ask(shared, "beta")
        assert counts(other)[0] < counts(first)[0]  # shared: beta drafts from alpha's answer
    finally:
        shared.stop()
