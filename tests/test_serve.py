"""The OpenAI-compatible server on the embedded default target, driven by the official client."""

from __future__ import annotations

import asyncio
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


class Server(BackgroundServer):
    def client(self, **options) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, **options)


@pytest.fixture(scope="module")
def decoder():
    return quickdraft.load(method="prompt-lookup")


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
    server.client().completions.create(model=decoder.target.name, prompt="red green blue red green blue red green",
                                       max_tokens=4, temperature=0)
    metrics = httpx.get(server.url + "/metrics").text
    for name in ("quickdraft_requests_total", "quickdraft_target_passes_total", "quickdraft_drafted_tokens_total",
                 "quickdraft_accepted_tokens_total", "quickdraft_acceptance_rate",
                 "quickdraft_mean_accepted_length", "quickdraft_queue_length", "quickdraft_batch_size_bucket",
                 'quickdraft_drafted_at_position_total{position="1"}', "quickdraft_generated_tokens_total",
                 "quickdraft_request_latency_seconds_bucket", "quickdraft_time_to_first_token_seconds_bucket"):
        assert name in metrics


def test_completion_streamed_and_not_agree_with_the_library(server, decoder):
    client = server.client()
    name = decoder.target.name
    whole = client.completions.create(model=name, prompt="The capital of France is", max_tokens=24,
                                      temperature=0, extra_body={"quickdraft": {"method": "prompt-lookup", "k": 4}})
    expected = decoder.with_method("none").generate("The capital of France is", 24, chat=False)
    assert whole.choices[0].text == expected.text
    assert whole.usage.completion_tokens == len(expected.token_ids)
    assert whole.choices[0].finish_reason in ("stop", "length")
    stats = whole.model_extra["quickdraft"]
    assert stats["method"] == "prompt-lookup" and stats["k"] == 4 and stats["target_passes"] >= 1
    pieces = list(client.completions.create(model=name, prompt="The capital of France is", max_tokens=24,
                                            temperature=0, stream=True))
    assert "".join(p.choices[0].text for p in pieces) == expected.text
    assert pieces[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_chat_streamed_and_not_with_a_stop_string(server, decoder):
    client = server.client()
    messages = [{"role": "user", "content": PROMPT}]
    whole = client.chat.completions.create(model=decoder.target.name, messages=messages, max_tokens=60,
                                           temperature=0, stop=["return"])
    expected = decoder.with_method("none").generate(PROMPT, 60, stop=["return"])
    assert whole.choices[0].message.content == expected.text
    assert whole.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(model=decoder.target.name, messages=messages, max_tokens=60,
                                            temperature=0, stop=["return"], stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected.text
    assert chunks[-1].usage.completion_tokens == len(expected.token_ids)


@pytest.mark.parametrize("body, status, fragment", [
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
    ({"model": "M", "prompt": "hi", "quickdraft": {"method": "lookahead", "max_ngram": 3}}, 400,
     "does not apply to method 'lookahead'"),
    ({"model": "M", "prompt": "hi", "quickdraft": {"method": "prompt-lookup:k=2,k_max=999"}}, 400, "k_max must be"),
    ({"model": "M", "prompt": "hi", "quickdraft": {"precision": "int4"}}, 400, "set when the server starts"),
    ({"model": "M", "prompt": "word " * 9000, "max_tokens": 16}, 400, "context length"),
    ({"model": "M", "prompt": ""}, 400, "empty"),
])
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(server, decoder, body, status, fragment):
    body = {key: decoder.target.name if value == "M" else value for key, value in body.items()}
    response = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert response.status_code == status
    error = response.json()["error"]
    assert fragment in error["message"] and error["type"]
    if "quickdraft" in body:  # the error names the option at fault
        assert error["param"].startswith("quickdraft")
    assert httpx.get(server.url + "/health").json()["status"] == "ok"


def test_malformed_json_and_chat_without_messages(server, decoder):
    response = httpx.post(server.url + "/v1/chat/completions", content=b"{not json", timeout=30,
                          headers={"content-type": "application/json"})
    assert response.status_code == 400 and "JSON" in response.json()["error"]["message"]
    response = httpx.post(server.url + "/v1/chat/completions", json={"model": decoder.target.name, "messages": []})
    assert response.status_code == 400 and "messages" in response.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError):
        server.client().chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])


def test_sixteen_concurrent_streams_equal_each_request_alone(server, decoder):
    prompts = [f"{topic} Answer in two sentences." for topic in (
        "What is a prime number?", "Why is the sky blue?", "Name three fruits.", "What is Python?",
        "How do plants grow?", "What is rain?", "Who was Ada Lovelace?", "What is a CPU?",
        "Describe a cat.", "What is gravity?", "How does a bike work?", "What is music?",
        "Explain photosynthesis.", "What is the moon?", "Why do we sleep?", "What is a river?")]
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)

    async def one(prompt: str, method: str) -> tuple[str, str]:
        stream = await client.chat.completions.create(
            model=decoder.target.name, messages=[{"role": "user", "content": prompt}], max_tokens=40,
            temperature=0, stream=True, extra_body={"quickdraft": {"method": method}})
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


def test_a_client_leaving_mid_stream_frees_its_slot(server, decoder):
    body = {"model": decoder.target.name, "prompt": "Count from one to one thousand: one, two,", "max_tokens": 250,
            "temperature": 0, "stream": True}
    cancelled = server.app.state.metrics.cancelled._value.get()
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                break  # one chunk, then hang up
    deadline = time.monotonic() + 30
    while server.app.state.metrics.cancelled._value.get() == cancelled:
        assert time.monotonic() < deadline, "the abandoned sequence was not dropped"
        time.sleep(0.05)
    assert server.app.state.scheduler.running == 0


def test_a_full_queue_answers_429(decoder):
    small = Server(create_app(decoder, max_batch=1, max_queue=1, max_tokens_limit=256))
    try:
        body = {"model": decoder.target.name, "prompt": "Tell me a long story about a dragon.", "max_tokens": 120,
                "temperature": 0}

        async def burst():
            async with httpx.AsyncClient(timeout=120) as client:
                return await asyncio.gather(*(client.post(small.url + "/v1/completions", json=body)
                                              for _ in range(4)))

        statuses = sorted(r.status_code for r in asyncio.run(burst()))
        assert statuses.count(200) >= 2 and 429 in statuses
        limited = next(r for r in asyncio.run(burst()) if r.status_code == 429)
        assert limited.json()["error"]["type"] == "rate_limit_error"
    finally:
        small.stop()


def test_shutdown_finishes_the_requests_in_flight(decoder):
    server = Server(create_app(decoder, max_batch=4, max_queue=4, max_tokens_limit=256))
    body = {"model": decoder.target.name, "prompt": "Count from one to one hundred: one, two,", "max_tokens": 60,
            "temperature": 0}
    answers = []
    request = threading.Thread(target=lambda: answers.append(
        httpx.post(server.url + "/v1/completions", json=body, timeout=120)))
    request.start()
    deadline = time.monotonic() + 30
    while server.app.state.scheduler.running == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    server.stop()  # like Ctrl-C: stop listening, finish what is running, then stop the scheduler
    request.join(60)
    assert answers[0].status_code == 200
    assert answers[0].json()["usage"]["completion_tokens"] == 60
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/health")
