"""Prometheus metrics of one server (its own registry: two servers in a process never mix)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from quickdraft.stats import StepRecord

if TYPE_CHECKING:
    from starlette.requests import Request

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128)
MAX_POSITIONS = 32  # acceptance is tracked for draft positions 1..32


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        self.requests = Counter(
            "quickdraft_requests",
            "Requests answered, by endpoint and status code",
            ["endpoint", "status"],
            registry=registry,
        )
        self.prompt_tokens = Counter("quickdraft_prompt_tokens", "Prompt tokens prefilled", registry=registry)
        self.generated_tokens = Counter("quickdraft_generated_tokens", "New tokens generated", registry=registry)
        self.target_passes = Counter(
            "quickdraft_target_passes", "Target passes (steps) over all sequences", registry=registry
        )
        self.drafted = Counter("quickdraft_drafted_tokens", "Draft tokens proposed", registry=registry)
        self.accepted = Counter("quickdraft_accepted_tokens", "Draft tokens accepted", registry=registry)
        self.acceptance_rate = Gauge(
            "quickdraft_acceptance_rate", "Accepted / drafted tokens since start", registry=registry
        )
        self.mean_accepted_length = Gauge(
            "quickdraft_mean_accepted_length", "New tokens per target pass since start", registry=registry
        )
        self.drafted_at = Counter(
            "quickdraft_drafted_at_position",
            "Draft tokens proposed at each draft position",
            ["position"],
            registry=registry,
        )
        self.accepted_at = Counter(
            "quickdraft_accepted_at_position",
            "Draft tokens accepted at each draft position",
            ["position"],
            registry=registry,
        )
        self.queue_length = Gauge("quickdraft_queue_length", "Requests waiting for a batch slot", registry=registry)
        self.active = Gauge("quickdraft_active_sequences", "Sequences being decoded", registry=registry)
        self.cancelled = Counter(
            "quickdraft_cancelled", "Sequences dropped because their client left", registry=registry
        )
        self.failed = Counter(
            "quickdraft_failed", "Sequences ended alone by a fault in their own work", registry=registry
        )
        self.batch_size = Histogram(
            "quickdraft_batch_size",
            "Sequences per batched target pass",
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32),
            registry=registry,
        )
        self.latency = Histogram(
            "quickdraft_request_latency_seconds",
            "Time from arrival to the last token",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.first_token = Histogram(
            "quickdraft_time_to_first_token_seconds",
            "Time from arrival to the first token",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.memory = Gauge(
            "quickdraft_memory_bytes",
            "Memory by part (quickdraft.memory): weights counted from "
            "the loaded tensors; KV caches and buffers at --max-batch sequences of the context",
            ["part"],
            registry=registry,
        )
        self.suffix_pool = Gauge(
            "quickdraft_suffix_pool",
            "Suffix decoding's earlier outputs, all tenants together: tokens kept, their bytes, and tenants",
            ["measure"],
            registry=registry,
        )
        self._totals = [0, 0, 0, 0]  # generated, passes, drafted, accepted: for the two ratios

    def record_memory(self, report) -> None:
        """Set the memory gauges from a MemoryReport."""
        for part, value in report.gauges().items():
            self.memory.labels(part).set(value)

    def record_pools(self, pools: list) -> None:
        """Set the suffix pool gauges from the server's SuffixPools."""
        self.suffix_pool.labels("tokens").set(sum(p.tokens_held for p in pools))
        self.suffix_pool.labels("bytes").set(sum(p.nbytes for p in pools))
        self.suffix_pool.labels("tenants").set(sum(p.tenants for p in pools))

    def answered(self, request: Request, status: int) -> None:
        """Count an answer under its route template (never the raw path: labels stay bounded)."""
        route = request.scope.get("route")
        self.requests.labels(getattr(route, "path", "unmatched"), str(status)).inc()

    def record_step(self, record: StepRecord) -> None:
        """Count one sequence's target pass (called on the scheduler thread)."""
        drafted, accepted = len(record.draft_tokens), record.accepted
        positions = record.draft_positions
        self.target_passes.inc()
        self.generated_tokens.inc(len(record.emitted))
        self.drafted.inc(drafted)
        self.accepted.inc(accepted)
        for position in range(min(positions, MAX_POSITIONS)):
            self.drafted_at.labels(str(position + 1)).inc()
            if position < accepted:
                self.accepted_at.labels(str(position + 1)).inc()
        totals = self._totals
        totals[0] += len(record.emitted)
        totals[1] += 1
        totals[2] += drafted
        totals[3] += accepted
        self.mean_accepted_length.set(totals[0] / totals[1])
        if totals[2]:
            self.acceptance_rate.set(totals[3] / totals[2])

    def render(self) -> bytes:
        return generate_latest(self.registry)


def merged_page(pages: dict[str, bytes], label: str = "replica") -> bytes:
    """Several servers' /metrics pages as one, each sample labelled with its server's key: what one
    Prometheus scrape of a Ray Serve application shows for all of its replicas."""
    families: dict[str, Metric] = {}
    for key, page in sorted(pages.items()):
        for family in text_string_to_metric_families(page.decode()):
            merged = families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            for sample in family.samples:
                merged.add_sample(sample.name, {label: key, **sample.labels}, sample.value, sample.timestamp)
    registry = CollectorRegistry()
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)


class _Families:
    """A collector of metric families already made (prometheus_client's way to print them)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families
