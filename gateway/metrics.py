"""Prometheus metrics of the gateway, in a registry of its own (one per server)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.triton_stats import ModelStatistics
from schedulers.autoscale import ScalingSignal

# Latency buckets from 1 ms to 10 s: the SLAs we serve sit between tens and hundreds of ms.
LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # The accounting invariant, at every moment: received = sum over outcomes of requests + in_flight.
        self.received = Counter("gateway_requests_received", "Infer requests received for the model", ["model"], registry=r)
        self.requests = Counter("gateway_requests", "Requests that ended, by outcome", ["model", "outcome"], registry=r)
        self.in_flight = Gauge("gateway_requests_in_flight", "Requests received that have not ended", ["model"], registry=r)
        self.queue_seconds = Histogram(
            "gateway_queue_seconds",
            "Time in the model's queue (from its body read to dispatch), of the requests answered",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.compute_seconds = Histogram(
            "gateway_compute_seconds", "Time the executor spent on the batch", ["model"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.request_seconds = Histogram(
            "gateway_request_seconds", "End-to-end response time", ["model"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.batch_size = Histogram(
            "gateway_batch_size", "Rows in each batch dispatched", ["model"], buckets=BATCH_BUCKETS, registry=r
        )
        self.queue_length = Gauge("gateway_queue_length", "Requests waiting in the model's queue", ["model"], registry=r)
        self.sla_seconds = Gauge("gateway_sla_seconds", "The model's response-time SLA", ["model"], registry=r)
        self.violations = Counter("gateway_sla_violations", "Requests answered after their SLA", ["model"], registry=r)
        self.cores = Gauge("gateway_executor_cores", "CPU cores granted to an executor", ["model", "executor"], registry=r)
        # What the quota really gives: at least the CFS floor (0.01 core), whole CPUs under affinity.
        self.enforced_cores = Gauge(
            "gateway_executor_enforced_cores", "CPU cores enforced on an executor", ["model", "executor"], registry=r
        )
        # Measured, not granted: the GPU executors' CPU too, which no quota caps and no core-seconds count.
        self.executor_cpu_seconds = Gauge(
            "gateway_executor_cpu_seconds", "CPU time used by the executor's current process", ["executor", "device"], registry=r
        )
        # Clockwork's late actions (Section 4.4): batches a GPU executor reached after their latest start.
        self.late_actions = Counter(
            "gateway_late_actions", "Batches an executor refused to begin after their latest start time", ["model"], registry=r
        )
        # Clockwork's LOAD and UNLOAD actions (Section 4) where GPU memory is a cache of models.
        self.gpu_model_loads = Counter(
            "gateway_gpu_model_loads", "Models loaded onto a GPU before a batch of theirs", ["gpu", "model"], registry=r
        )
        self.gpu_model_unloads = Counter(
            "gateway_gpu_model_unloads",
            "Models unloaded from a GPU: for room (least recently used), or lost with its executor",
            ["gpu", "model"],
            registry=r,
        )
        self._models: dict[str, ModelMetrics] = {}

    def export_totals(
        self, read: Callable[[], Iterable[ModelTotals]], gpu_restarts: Callable[[], Mapping[str, int]] = dict
    ) -> None:
        """Export the totals the engine keeps (core-seconds, restarts, violating windows), ``read``
        at each scrape, as counters: they only grow."""
        self.registry.register(TotalsCollector(read, gpu_restarts))

    def export_scaling_signal(self, read: Callable[[], ScalingSignal]) -> None:
        """Export Symphony's autoscaling signals of the node's GPUs, ``read`` at each scrape."""
        self.registry.register(ScalingSignalCollector(read))

    def forget(self, model: str, executors: Iterable[tuple[str, str]]) -> None:
        """Drop the series of a model unloaded at run time, and of its executors ((id, device)
        each), as Triton drops an unloaded model's metrics: its gauges went on showing the cores
        and SLA of a model that is gone, and a model loaded again starts its counters from 0, as
        its statistics (Triton's nv_inference_*) do."""
        cached = self._models.pop(model, None)
        outcomes = list(cached._outcomes) if cached is not None else []
        by_model = (self.received, self.in_flight, self.queue_seconds, self.compute_seconds, self.request_seconds)
        by_model += (self.batch_size, self.queue_length, self.sla_seconds, self.violations, self.late_actions)
        removals: list[tuple[Any, tuple[str, ...]]] = [(family, (model,)) for family in by_model]
        removals += [(self.requests, (model, outcome)) for outcome in outcomes]
        for executor, device in executors:
            removals += [(self.cores, (model, executor)), (self.enforced_cores, (model, executor))]
            removals.append((self.executor_cpu_seconds, (executor, device)))
        for family, labels in removals:
            with contextlib.suppress(KeyError):  # a series never written
                family.remove(*labels)

    def for_model(self, model: str) -> ModelMetrics:
        """The model's series on the per-request path, looked up once (``labels`` costs a few
        microseconds a call, about ten calls a request)."""
        if model not in self._models:
            self._models[model] = ModelMetrics(self, model)
        return self._models[model]


class ModelMetrics:
    """One model's labelled children of the per-request series."""

    def __init__(self, metrics: GatewayMetrics, model: str):
        self.received = metrics.received.labels(model)
        self.in_flight = metrics.in_flight.labels(model)
        self.queue_seconds = metrics.queue_seconds.labels(model)
        self.compute_seconds = metrics.compute_seconds.labels(model)
        self.request_seconds = metrics.request_seconds.labels(model)
        self.batch_size = metrics.batch_size.labels(model)
        self.queue_length = metrics.queue_length.labels(model)
        self.violations = metrics.violations.labels(model)
        self._requests, self._model = metrics.requests, model
        self._outcomes: dict[str, Any] = {}

    def outcome(self, outcome: str) -> Any:
        """The counter of requests that ended with ``outcome``."""
        if outcome not in self._outcomes:
            self._outcomes[outcome] = self._requests.labels(self._model, outcome)
        return self._outcomes[outcome]


@dataclass(frozen=True)
class ModelTotals:
    """What the engine has counted for one model since start."""

    model: str
    core_seconds: float
    window_violations: int
    restarts: Mapping[str, int]  # executor id -> times restarted


@dataclass(frozen=True)
class TritonTotals:
    """What Triton's per-model series read: a model's (or pipeline's) statistics, under the name
    and version clients use (a version of a repository model is its own runtime)."""

    model: str
    version: str
    statistics: ModelStatistics
    pending: int  # requests waiting in its queue


class TotalsCollector:
    def __init__(self, read: Callable[[], Iterable[ModelTotals]], gpu_restarts: Callable[[], Mapping[str, int]]):
        self._read, self._gpu_restarts = read, gpu_restarts

    def collect(self) -> Iterator[Metric]:
        core_seconds = CounterMetricFamily(
            "gateway_core_seconds", "Core-seconds enforced on the model's executors", labels=["model"]
        )
        violations = CounterMetricFamily(
            "gateway_window_violations", "Control windows whose mean response time was over the SLA", labels=["model"]
        )
        restarts = CounterMetricFamily(
            "gateway_executor_restarts", "Times the executor was restarted", labels=["model", "executor"]
        )
        for totals in self._read():
            core_seconds.add_metric([totals.model], totals.core_seconds)
            violations.add_metric([totals.model], totals.window_violations)
            for executor, count in totals.restarts.items():
                restarts.add_metric([totals.model, executor], count)
        for executor, count in self._gpu_restarts().items():  # a GPU executor holds every model: no model's
            restarts.add_metric(["", executor], count)
        yield from (core_seconds, violations, restarts)


# Triton's per-model metrics (its metrics.md, "Inference Request Metrics"): name, type, help,
# and what each reads off the statistics. Written as Triton writes them, without the "_total"
# suffix that prometheus_client adds to counters, so that dashboards made for Triton find them.
TRITON_METRICS: tuple[tuple[str, str, str, Callable[[TritonTotals], float]], ...] = (
    ("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes",
     lambda t: t.statistics.success.count),
    ("nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes",
     lambda t: t.statistics.fail.count),
    ("nv_inference_count", "counter", "Number of inferences performed (does not include cached requests)",
     lambda t: t.statistics.inference_count),
    ("nv_inference_exec_count", "counter", "Number of model executions performed (does not include cached requests)",
     lambda t: t.statistics.execution_count),
    # Successful requests only, as Triton's (a failure adds to nv_inference_request_failure alone),
    # so that a dashboard's mean latency, this over nv_inference_request_success, is the served one.
    ("nv_inference_request_duration_us", "counter", "Cumulative inference request duration in microseconds",
     lambda t: t.statistics.success.ns // 1000),
    ("nv_inference_queue_duration_us", "counter", "Cumulative inference queuing duration in microseconds",
     lambda t: t.statistics.queue.ns // 1000),
    ("nv_inference_compute_input_duration_us", "counter", "Cumulative compute input duration in microseconds",
     lambda t: t.statistics.compute_input.ns // 1000),
    ("nv_inference_compute_infer_duration_us", "counter", "Cumulative compute inference duration in microseconds",
     lambda t: t.statistics.compute_infer.ns // 1000),
    ("nv_inference_compute_output_duration_us", "counter", "Cumulative inference compute output duration in microseconds",
     lambda t: t.statistics.compute_output.ns // 1000),
    ("nv_inference_pending_request_count", "gauge", "Instantaneous number of pending requests awaiting execution per-model.",
     lambda t: t.pending),
)  # fmt: skip


def triton_exposition(models: Iterable[TritonTotals]) -> str:
    """Triton's metrics in the Prometheus text format, labelled as Triton labels them (model, version)."""
    models = list(models)
    lines = []
    for name, kind, text, read in TRITON_METRICS:
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        lines += [f'{name}{{model="{_escape(t.model)}",version="{_escape(t.version)}"}} {read(t)}' for t in models]
    return "\n".join(lines) + "\n"


def _escape(label: str) -> str:
    return label.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class ScalingSignalCollector:
    """The GPU cluster's autoscaling signals (schedulers/autoscale.py), computed once a scrape so
    that the four gauges describe the same period."""

    def __init__(self, read: Callable[[], ScalingSignal]):
        self._read = read

    def collect(self) -> Iterator[Metric]:
        signal = self._read()
        yield GaugeMetricFamily(
            "gateway_gpu_bad_rate", "Share of the GPU models' requests that ended out of their SLO, last period", signal.bad_rate
        )
        yield GaugeMetricFamily(
            "gateway_gpu_idle_fraction", "Share of the GPUs' time with no batch running, last period", signal.idle_fraction
        )
        yield GaugeMetricFamily(
            "gateway_gpus_to_add", "GPUs to allocate: N r / (1 - r) when the bad rate r is over its threshold", signal.gpus_to_add
        )
        yield GaugeMetricFamily("gateway_gpus_to_release", "GPUs to release: N f for the idle fraction f", signal.gpus_to_release)
