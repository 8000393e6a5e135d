"""quickdraft's server on Ray Serve: a local cluster on loopback, two replicas of a small random model,
driven by the official client; the single server, in this process, is the reference."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import shutil
import socket
import tempfile
import threading
import time

import httpx
import openai
import pytest
import ray
from ray import serve

import quickdraft
from quickdraft.errors import QuickdraftError
from quickdraft.serve import ray as on_ray
from quickdraft.serve.background import BackgroundServer
from quickdraft.serve.launch import ServerSettings, server_app
from quickdraft.serve.metrics import ServerMetrics, merged_page
from quickdraft.serve.stream_guard import CUT_SHORT

KEY = "sesame"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPTS = [f"Fact {i}: red green blue red green blue" for i in range(8)]
STARTUP_SECONDS = 240  # a cold cluster and two model loads on 2 busy cores


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def settings(random_ggufs) -> ServerSettings:
    return ServerSettings(
        target=str(random_ggufs["llama", "F32"]),
        method="prompt-lookup",
        options={"backend": "native"},
        max_batch=4,
        max_queue=8,
        max_tokens_limit=900,
        drain_seconds=5,
        api_key=KEY,
        threads=1,
    )


@pytest.fixture(scope="module")
def decoder(settings):
    return quickdraft.load(settings.target, method=settings.method, **settings.options)


@pytest.fixture(scope="module")
def cluster(settings):
    """Two replicas on a local cluster of 3 logical cores (one left for a third replica), in a short
    temp folder (Ray's sockets live there), stopped with everything it started at the end."""
    folder = tempfile.mkdtemp(prefix="qd-ray-", dir="/tmp")
    try:
        ray.init(num_cpus=3, include_dashboard=False, _temp_dir=folder, namespace="quickdraft-tests")
        started = concurrent.futures.ThreadPoolExecutor(1).submit(
            on_ray.start, settings, on_ray.Scaling(replicas=2), "127.0.0.1", free_port()
        )
        yield started.result(timeout=STARTUP_SECONDS)
    finally:
        if ray.is_initialized():
            on_ray.stop(owns_cluster=True)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def single(settings, decoder):
    """The single server with the same settings: what the Ray app must answer alike."""
    running = BackgroundServer(server_app(settings, decoder))
    yield running.url
    running.stop()


def client(url: str, timeout: float = 120) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=timeout)


def expected(decoder, prompt: str, tokens: int) -> str:
    return decoder.with_method("none").generate(prompt, tokens, chat=False).text


def test_streamed_and_whole_text_equal_the_library(cluster, decoder):
    name = decoder.target.name
    for prompt in PROMPTS[:3]:
        whole = client(cluster).completions.create(model=name, prompt=prompt, max_tokens=24, temperature=0)
        stream = client(cluster).completions.create(
            model=name, prompt=prompt, max_tokens=24, temperature=0, stream=True
        )
        streamed = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
        assert whole.choices[0].text == streamed == expected(decoder, prompt, 24)
    chat = client(cluster).chat.completions.create(
        model=name, messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=16, temperature=0
    )
    assert chat.choices[0].message.content == decoder.with_method("none").generate(PROMPTS[0], 16).text


def replica_counts(url: str) -> dict[str, float]:
    """Answered completions per replica, from the one /metrics page."""
    counts: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", headers=AUTH, timeout=30).text.splitlines():
        if line.startswith("quickdraft_requests_total{") and 'endpoint="/v1/completions"' in line:
            replica = line.split('replica="')[1].split('"')[0]
            counts[replica] = counts.get(replica, 0) + float(line.split()[-1])
    return counts


def test_requests_land_on_both_replicas(cluster, decoder):
    name = decoder.target.name
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(
                lambda p: client(cluster).completions.create(model=name, prompt=p, max_tokens=64, temperature=0),
                PROMPTS,
            )
        )
    for prompt, answer in zip(PROMPTS, answers):
        assert answer.choices[0].text == expected(decoder, prompt, 64)
    deadline = time.monotonic() + 3 * on_ray.PUSH_SECONDS + 5
    while len(counts := replica_counts(cluster)) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)  # the replica not answering /metrics pushes its numbers every PUSH_SECONDS
    assert len(counts) == 2 and all(count > 0 for count in counts.values()), counts
    page = httpx.get(cluster + "/metrics", headers=AUTH).text
    assert "quickdraft_generated_tokens_total{replica=" in page and "quickdraft_memory_bytes{part=" in page


@pytest.mark.parametrize(
    "request_kwargs",
    [
        {"headers": {}},  # no API key: 401
        {"content": b"{not json", "headers": AUTH},  # 400 or 422, as the server says
        {"json": {"model": "x", "prompt": "hi", "max_tokens": -3}, "headers": AUTH},
        {"json": {"prompt": "hi"}, "headers": {"Authorization": f"Bearer {KEY}", "Host": "evil.example"}},
        {"content": b"x" * (3 << 20), "headers": AUTH},  # over the body limit: 413
    ],
)
def test_refusals_match_the_single_server(cluster, single, request_kwargs):
    answers = [httpx.post(url + "/v1/completions", timeout=60, **request_kwargs) for url in (single, cluster)]
    assert answers[0].status_code >= 400
    assert [a.status_code for a in answers[1:]] == [answers[0].status_code]
    assert answers[1].json() == answers[0].json()


def test_a_killed_replica_fails_its_requests_cleanly_and_comes_back(cluster, decoder):
    """8 streams over both replicas; the replica holding most is killed once every stream has begun:
    streams on the other finish with the library's text, those on the killed one end with the
    proxy's error event (no hang), and Serve starts a new replica that answers."""
    name, tokens = decoder.target.name, 800
    begun = [threading.Event() for _ in PROMPTS]
    replica_of: dict[int, str] = {}

    def stream(index: int) -> str | Exception:
        try:
            answer = client(cluster, timeout=90).completions.with_raw_response.create(
                model=name,
                prompt=PROMPTS[index],
                max_tokens=tokens,
                temperature=0,
                stream=True,
                extra_body={"quickdraft": {"method": "none"}},  # a token a pass: still running at the kill
            )
            replica_of[index] = answer.headers[on_ray.REPLICA_HEADER]
            text = ""
            for chunk in answer.parse():
                begun[index].set()
                text += chunk.choices[0].text if chunk.choices else ""
            return text
        except Exception as error:  # what the client saw: the point of the test
            return error
        finally:
            begun[index].set()

    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        outcomes = [pool.submit(stream, index) for index in range(len(PROMPTS))]
        assert all(event.wait(120) for event in begun)
        victim = max(set(replica_of.values()), key=list(replica_of.values()).count)
        ray.kill(ray.get_actor(f"SERVE_REPLICA::quickdraft#quickdraft#{victim}", namespace="serve"))
        results = [outcome.result(timeout=180) for outcome in outcomes]  # none hangs
    failed = [index for index, result in enumerate(results) if not isinstance(result, str)]
    assert failed and all(replica_of[index] == victim for index in failed), (replica_of, victim, results)
    for index in failed:  # the proxy's middleware (stream_guard.py) ended each stream with the error event
        error = results[index]
        assert isinstance(error, openai.APIError) and not isinstance(error, openai.APIConnectionError), repr(error)
        assert error.message == CUT_SHORT
    for index, result in enumerate(results):  # on the survivor all; on the victim, any done before the kill
        if index not in failed:
            assert result == expected(decoder, PROMPTS[index], tokens)
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        deployment = serve.status().applications[on_ray.APP_NAME].deployments["quickdraft"]
        if deployment.replica_states.get("RUNNING", 0) == 2:
            break
        time.sleep(1)
    else:
        raise AssertionError(f"no replacement replica: {deployment.replica_states}")
    answer = client(cluster).completions.create(model=name, prompt=PROMPTS[1], max_tokens=16, temperature=0)
    assert answer.choices[0].text == expected(decoder, PROMPTS[1], 16)


def test_a_replica_without_the_model_files_fails_with_one_line(cluster, settings):
    broken = dataclasses.replace(settings, target="/nonexistent/model.gguf")
    application = on_ray.quickdraft_application(broken, on_ray.Scaling(replicas=1))
    try:
        with pytest.raises(RuntimeError) as failure:
            serve.run(application, name="broken", route_prefix="/broken")
        line = on_ray.deploy_failure(failure.value, "broken")
    finally:
        serve.delete("broken")
    assert line.startswith("quickdraft replica on "), line
    assert line.endswith("could not load its model: model not found: no such file or folder /nonexistent/model.gguf")


def test_settings_and_scaling_are_checked():
    with pytest.raises(QuickdraftError, match="--max-batch must be >= 1"):
        ServerSettings(max_batch=0)
    with pytest.raises(QuickdraftError, match="--replicas must be >= 1"):
        on_ray.Scaling(replicas=0)
    with pytest.raises(QuickdraftError, match="MIN <= MAX"):
        on_ray.Scaling(autoscale=(3, 1))
    with pytest.raises(QuickdraftError, match="MIN:MAX"):
        on_ray.parse_autoscale("two")
    with pytest.raises(QuickdraftError, match="unknown args"):
        on_ray.app({"target": "x", "replica": 2})


def test_deployment_options_reserve_cores_and_bound_the_queue():
    settings = ServerSettings(max_batch=4, max_queue=8, threads=3, drain_seconds=10)
    fixed = on_ray.deployment_options(settings, on_ray.Scaling(replicas=2))
    assert fixed["num_replicas"] == 2 and fixed["ray_actor_options"] == {"num_cpus": 3}
    assert fixed["max_ongoing_requests"] == 12 and fixed["max_queued_requests"] == 8
    assert fixed["backpressure_config"] == {"status_code": 429, "retry_after_s": 1}
    scaled = on_ray.deployment_options(settings, on_ray.Scaling(autoscale=(1, 4)))
    assert "num_replicas" not in scaled
    assert scaled["autoscaling_config"]["max_replicas"] == 4
    assert scaled["autoscaling_config"]["target_ongoing_requests"] == 4


def test_merged_page_labels_every_replica():
    one, two = ServerMetrics(), ServerMetrics()
    one.generated_tokens.inc(3)
    two.generated_tokens.inc(5)
    page = merged_page({"a": one.render(), "b": two.render()}).decode()
    assert 'quickdraft_generated_tokens_total{replica="a"} 3.0' in page
    assert 'quickdraft_generated_tokens_total{replica="b"} 5.0' in page
    assert page.count("# TYPE quickdraft_generated_tokens_total counter") == 1


def test_failure_line_keeps_the_replica_line():
    text = (
        "Failed to update the deployments\nTraceback...\nReplicaLoadError: quickdraft replica on n1 (10.0.0.2) "
        "could not load its model: no such file /models/x"
    )
    assert on_ray.failure_line("Deploying application x failed") == "Deploying application x failed"
    assert on_ray.failure_line(text) == (
        "quickdraft replica on n1 (10.0.0.2) could not load its model: no such file /models/x"
    )


def test_the_cli_refuses_ray_flags_alone_and_bad_scaling(capsys):
    from quickdraft.cli import main

    for argv, message in (
        (["serve", "--replicas", "2"], "--replicas, --autoscale and --address need --ray"),
        (["serve", "--ray", "--autoscale", "two"], "--autoscale takes MIN:MAX"),
        (["serve", "--ray", "--replicas", "0"], "--replicas must be >= 1"),
        (["serve", "--ray", "--max-batch", "0"], "--max-batch must be >= 1"),
    ):
        assert main(argv) == 2
        assert message in capsys.readouterr().err
