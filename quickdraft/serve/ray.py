"""quickdraft's server as a Ray Serve application: each replica loads the model and serves the same app
as `quickdraft serve` (launch.server_app: one code path for the gate, bounds and endpoints), with its
own scheduler batching inside; Ray's proxy spreads requests over the replicas, holds back the excess
and restarts a replica that dies. Run it with `quickdraft serve --ray`, or from a Serve config file:

    applications:
      - name: quickdraft
        route_prefix: /
        import_path: quickdraft.serve.ray:app
        args: {target: /models/llama-3.2-1b, method: eagle, replicas: 2, threads: 4}
    controller_options:  # Ray's proxy ends a stream cut short with an error event (stream_guard.py)
      runtime_env:
        env_vars: {RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH: "quickdraft.serve.stream_guard:proxy_middlewares"}

Model files must be readable at the same path on every node."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import socket
import time
from dataclasses import dataclass
from typing import Any

import ray
from fastapi import FastAPI
from ray import serve
from ray.serve import Application
from ray.serve.exceptions import RayServeException

from quickdraft.errors import QuickdraftError
from quickdraft.serve.launch import ServerSettings, load_decoder, server_app
from quickdraft.serve.metrics import merged_page
from quickdraft.serve.stream_guard import PROXY_ENV

APP_NAME = "quickdraft"
PUSH_SECONDS = 1.0  # how stale another replica's numbers on /metrics may be
STALE_SECONDS = 60.0  # a replica silent this long is gone (restarted under another name)
RETRY_AFTER_SECONDS = 1  # what the single server's 429 says too
REPLICA_HEADER = "x-quickdraft-replica"


@dataclass(frozen=True)
class Scaling:
    """How many replicas: a fixed number, or Serve's autoscaling between MIN and MAX on ongoing requests."""

    replicas: int = 1
    autoscale: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise QuickdraftError(f"--replicas must be >= 1, got {self.replicas}")
        if self.autoscale is not None:
            low, high = self.autoscale
            if not 0 <= low <= high or high < 1:
                raise QuickdraftError(f"--autoscale MIN:MAX needs 0 <= MIN <= MAX and MAX >= 1, got {low}:{high}")

    @property
    def most(self) -> int:
        return self.autoscale[1] if self.autoscale else self.replicas


def parse_autoscale(text: str) -> tuple[int, int]:
    """'1:4' -> (1, 4)."""
    low, colon, high = text.partition(":")
    try:
        return int(low), int(high)
    except ValueError:
        raise QuickdraftError(f"--autoscale takes MIN:MAX (e.g. 1:4), got {text!r}") from None


def deployment_options(settings: ServerSettings, scaling: Scaling) -> dict[str, Any]:
    """Serve's options for the replicas: cores reserved per replica (replicas never share them),
    at most a batch plus a queue in each (Ray's router holds the rest and answers 429 with
    Retry-After when its own queue is full, as the single server does), and a drain at shutdown."""
    options: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": settings.threads or 1},
        "max_ongoing_requests": settings.max_batch + settings.max_queue,
        "max_queued_requests": settings.max_queue,
        "backpressure_config": {"status_code": 429, "retry_after_s": RETRY_AFTER_SECONDS},
        "graceful_shutdown_timeout_s": settings.drain_seconds + 5,
        "health_check_period_s": 5,
    }
    if scaling.autoscale:
        low, high = scaling.autoscale
        # A replica is busy enough once its batch is full: then another one starts.
        options["autoscaling_config"] = {
            "min_replicas": low,
            "initial_replicas": max(low, 1),
            "max_replicas": high,
            "target_ongoing_requests": settings.max_batch,
        }
    else:
        options["num_replicas"] = scaling.replicas
    return options


class ReplicaLoadError(RuntimeError):
    """A replica could not load its model: one line that names the node."""


@ray.remote(num_cpus=0)
class MetricsHub:
    """Every replica's latest metrics page, merged for /metrics (labelled by replica)."""

    def __init__(self) -> None:
        self.pages: dict[str, tuple[float, bytes]] = {}

    def push(self, replica: str, page: bytes) -> None:
        self.pages[replica] = (time.monotonic(), page)

    def page(self) -> bytes:
        now = time.monotonic()
        self.pages = {key: kept for key, kept in self.pages.items() if now - kept[0] < STALE_SECONDS}
        return merged_page({key: page for key, (_, page) in self.pages.items()})


def metrics_hub(app_name: str):
    """The application's hub (made by the first replica to ask; it outlives replica restarts)."""
    return MetricsHub.options(
        name=f"quickdraft-metrics-{app_name}", namespace="quickdraft", get_if_exists=True, lifetime="detached"
    ).remote()


@serve.ingress()
class QuickdraftReplica:
    """One replica: a loaded decoder and the app over it."""

    def __init__(self, settings: ServerSettings) -> None:
        import torch

        if settings.threads is not None:
            torch.set_num_threads(settings.threads)  # this replica's process, on its reserved cores
        context = serve.get_replica_context()
        self.replica, self.settings = context.replica_tag, settings
        try:
            self.decoder = load_decoder(settings)
        except (QuickdraftError, OSError) as error:
            where = f"{socket.gethostname()} ({ray.util.get_node_ip_address()})"
            raise ReplicaLoadError(f"quickdraft replica on {where} could not load its model: {error}") from None
        self.hub = metrics_hub(context.app_name or APP_NAME)
        self.served: FastAPI | None = None  # (Serve's wrapper owns `app`)

    async def __serve_build_asgi_app__(self) -> FastAPI:
        self.served = server_app(self.settings, self.decoder, self.metrics_page)
        self.served.add_middleware(ReplicaHeader, replica=self.replica)
        self.pushing = asyncio.get_running_loop().create_task(self._push_metrics())
        return self.served

    async def metrics_page(self) -> bytes:
        """Every replica's metrics; this one's as of now."""
        await self.hub.push.remote(self.replica, self.served.state.metrics.render())
        return await self.hub.page.remote()

    async def _push_metrics(self) -> None:
        while True:
            try:
                await self.hub.push.remote(self.replica, self.served.state.metrics.render())
            except ray.exceptions.RayError:
                pass  # the hub is being restarted with the cluster: the next push reaches it
            await asyncio.sleep(PUSH_SECONDS)

    def check_health(self) -> None:
        """Ray restarts a replica whose decoding loop has stopped."""
        if self.served is not None and not self.served.state.scheduler.alive:
            raise RuntimeError("the scheduler's decoding loop has stopped")


class ReplicaHeader:
    """ASGI middleware: every answer names the replica that gave it (`x-quickdraft-replica`, the id
    its metrics are labelled with), for a user's logs and for tests."""

    def __init__(self, app: Any, replica: str) -> None:
        self.app, self.name = app, (REPLICA_HEADER.encode(), replica.encode())

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def named(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.name]}
            await send(message)

        await self.app(scope, receive, named)


def quickdraft_application(settings: ServerSettings, scaling: Scaling) -> Application:
    """The Serve application: replicas of QuickdraftReplica with deployment_options."""
    deployment = serve.deployment(QuickdraftReplica, name="quickdraft", **deployment_options(settings, scaling))
    return deployment.bind(settings)


def app(args: dict[str, Any]) -> Application:
    """Serve's application builder (`import_path: quickdraft.serve.ray:app`): args are ServerSettings'
    fields (options: method options as a mapping) plus replicas or autoscale ("MIN:MAX")."""
    args = dict(args)
    scaling = Scaling(
        replicas=int(args.pop("replicas", 1)),
        autoscale=parse_autoscale(args.pop("autoscale")) if "autoscale" in args else None,
    )
    known = {f.name for f in dataclasses.fields(ServerSettings)}
    unknown = sorted(set(args) - known)
    if unknown:
        raise QuickdraftError(f"unknown args {unknown}; known: replicas, autoscale, {', '.join(sorted(known))}")
    if "allowed_hosts" in args and args["allowed_hosts"] is not None:
        args["allowed_hosts"] = tuple(args["allowed_hosts"])
    return quickdraft_application(ServerSettings(**args), scaling)


def check_cores(settings: ServerSettings, scaling: Scaling) -> None:
    """Refuse replicas that could never all start: their reserved cores exceed the cluster's."""
    cores = ray.cluster_resources().get("CPU", 0)
    wanted = scaling.most * (settings.threads or 1)
    if wanted > cores:
        raise QuickdraftError(
            f"{scaling.most} replica(s) x {settings.threads or 1} thread(s) reserve {wanted} cores; "
            f"the cluster has {cores:g}: lower --replicas/--autoscale or --threads, or add nodes"
        )


def deploy_failure(error: Exception, app_name: str = APP_NAME) -> str:
    """Why the application did not deploy, in one line: a replica's load failure from its
    deployment's status (Serve's own error says only that the deployment failed)."""
    texts = [str(error)]
    application = serve.status().applications.get(app_name)
    if application is not None:
        texts += [deployment.message for deployment in application.deployments.values()]
    return failure_line("\n".join(texts))


def failure_line(text: str) -> str:
    """The line a replica's ReplicaLoadError left in `text` (else its first line): the last one
    naming it (a traceback shows the raising source line before the message)."""
    marker = "ReplicaLoadError: "
    for line in reversed(text.splitlines()):
        if marker in line:
            return line[line.index(marker) + len(marker) :]
    return text.strip().splitlines()[0] if text.strip() else "the deployment failed"


def start(settings: ServerSettings, scaling: Scaling, host: str, port: int, address: str | None = None) -> str:
    """Join the cluster at `address` (None: start a local one), deploy, and return the base URL."""
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=True, namespace="quickdraft")
    check_cores(settings, scaling)
    serve.start(
        http_options={"host": host, "port": port},
        controller_options={"runtime_env": {"env_vars": PROXY_ENV}},  # a stream cut short ends with an error event
    )
    try:
        serve.run(quickdraft_application(settings, scaling), name=APP_NAME, route_prefix="/")
    except RuntimeError as error:
        raise QuickdraftError(deploy_failure(error)) from None
    return f"http://{host}:{port}"


def stop(owns_cluster: bool) -> None:
    """Drain and remove the application and its metrics hub; Serve and the cluster too when this
    process started them (a joined cluster keeps serving its other applications)."""
    if not ray.is_initialized():
        return  # the cluster never started
    try:
        serve.delete(APP_NAME)
    except RayServeException:
        pass  # Serve never started
    try:
        ray.kill(ray.get_actor(f"quickdraft-metrics-{APP_NAME}", namespace="quickdraft"))
    except ValueError:
        pass  # no replica ever started
    if owns_cluster:
        serve.shutdown()
    ray.shutdown()


def wait_for_signal() -> None:
    """Until Ctrl-C or SIGTERM (the CLI's foreground)."""
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
