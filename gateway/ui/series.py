"""Per-second series of what the gateway did, kept for the live page over its last minutes.

Pure (../shared/DESIGN.md, principle 1): every event carries its time, a reading of the engine's
clock (time.perf_counter), and nothing here reads a clock. The engine feeds it from the events it
already handles (a request that ended, a batch that finished, a GPU's busy stretch, the queue
after each action of the dispatch core, a closed control period); ``snapshot`` turns the last
seconds into arrays, one value per second and None where a second saw nothing to measure.

Memory is bounded: a ring of ``SECONDS`` one-second buckets, each holding at most
``SAMPLES_PER_SECOND`` response times of a model (its p99 is read from them). A bucket is
reused when the clock comes round to its slot again, so nothing needs to be forgotten by a timer.
Prometheus' range vectors and Grafana's live panels show the same per-second view; here it is
kept in the gateway so that the page needs nothing else running.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from schedulers.profiles import percentile

# Ten minutes: the page shows the last few, and an operator who looks away for a while still
# sees what the control did meanwhile.
SECONDS = 600
# Enough for a stable 99th percentile of one second (the p99 of 2,048 samples rests on its top 20);
# a busier second keeps an evenly spaced subsample, so memory stays bounded at any load.
SAMPLES_PER_SECOND = 2048
# How the page names the outcomes it counts, and the engine's outcomes each one gathers.
REFUSED = frozenset({"queue_full", "refused_deadline", "unloaded"})  # turned away before any work: 429, 503
TIMEOUTS = frozenset({"timeout"})  # 504
FAILED = frozenset({"executor_failed", "internal_error", "model_error"})  # an executor's, the model's or the gateway's fault

B = TypeVar("B")


class SecondRing(Generic[B]):
    """One bucket per whole second of a clock: the current second and the ``seconds`` before it.

    Second ``s`` lives in slot ``s % (seconds + 1)``: a bucket whose slot a later second claims
    is replaced by a fresh one, so the ring forgets by itself and never grows.
    """

    def __init__(self, make: Callable[[], B], seconds: int = SECONDS):
        if seconds < 1:
            raise ValueError(f"a ring holds at least one second, got {seconds}")
        self.seconds = seconds
        self._make = make
        self._slots: list[tuple[int, B] | None] = [None] * (seconds + 1)
        self._latest = -math.inf  # the latest second opened

    def at(self, t: float) -> B | None:
        """The bucket of the second holding ``t``, opened if new; None when ``t`` is too old to keep."""
        second = math.floor(t)
        if second < self._latest - self.seconds:
            return None
        slot = second % len(self._slots)
        held = self._slots[slot]
        if held is not None and held[0] == second:
            return held[1]
        if held is not None and held[0] > second:
            return None  # a later second owns the slot
        bucket = self._make()
        self._slots[slot] = (second, bucket)
        self._latest = max(self._latest, second)
        return bucket

    def get(self, second: int) -> B | None:
        """The bucket of whole second ``second``, or None when nothing was recorded in it."""
        held = self._slots[second % len(self._slots)]
        return held[1] if held is not None and held[0] == second else None

    def last(self, now: float, seconds: int) -> list[tuple[int, B | None]]:
        """The ``seconds`` whole seconds before the one holding ``now`` (the current second is
        not over yet), oldest first, each with its bucket or None."""
        current = math.floor(now)
        count = min(seconds, self.seconds)
        return [(s, self.get(s)) for s in range(current - count, current)]


@dataclass
class ModelSecond:
    """What one model did in one second."""

    served: int = 0  # requests answered with a result
    total_ms: float = 0.0
    samples: list[float] = field(default_factory=list)  # response times, at most SAMPLES_PER_SECOND
    stride: int = 1  # every stride-th response time is kept once the samples are full
    violations: int = 0  # answered after the SLA
    refused: int = 0
    timeouts: int = 0
    failed: int = 0
    on_device: dict[str, int] = field(default_factory=dict)  # served, by device (cpu, gpu)
    batches: dict[int, int] = field(default_factory=dict)  # batches that finished, by rows
    queue_length: int | None = None  # the longest queue seen in the second
    sla_ms: float | None = None  # the SLA at the second's last event
    demanded_cores: float | None = None  # the control period that closed in the second
    granted_cores: float | None = None
    used_cores: float | None = None  # CPU time the executor used in that period, per second

    def observe(self, rt_ms: float) -> None:
        self.served += 1
        self.total_ms += rt_ms
        if (self.served - 1) % self.stride:
            return
        self.samples.append(rt_ms)
        if len(self.samples) >= SAMPLES_PER_SECOND:
            # Keep every other sample, and from now on every other one of those kept before.
            self.samples = self.samples[::2]
            self.stride *= 2

    @property
    def mean_ms(self) -> float | None:
        return self.total_ms / self.served if self.served else None

    @property
    def p99_ms(self) -> float | None:
        return percentile(self.samples, 99) if self.samples else None


@dataclass
class NodeSecond:
    """What the node and its GPUs did in one second."""

    granted_cores: float | None = None  # to every CPU executor, in the period that closed in it
    used_cores: float | None = None  # measured over that period
    gpu_busy_s: dict[str, float] = field(default_factory=dict)  # GPU executor -> seconds with a batch on it
    gpu_batches: dict[str, dict[int, int]] = field(default_factory=dict)  # GPU executor -> batches by rows
    bad_rate: float | None = None  # Symphony's signals as read at the period's close
    idle_fraction: float | None = None


@dataclass(frozen=True)
class PeriodOf:
    """One model's control period: the cores demanded and granted, and the CPU time used."""

    demanded: float
    granted: float
    cpu_s: float


class LiveSeries:
    """The gateway's per-second series, filled from the engine's events (every ``now`` from one clock)."""

    def __init__(self, seconds: int = SECONDS):
        self.seconds = seconds
        self.models: dict[str, SecondRing[ModelSecond]] = {}
        self.node: SecondRing[NodeSecond] = SecondRing(NodeSecond, seconds)

    def forget(self, model: str) -> None:
        """A model unloaded: its seconds go with it."""
        self.models.pop(model, None)

    def _model(self, model: str, now: float) -> ModelSecond | None:
        ring = self.models.get(model)
        if ring is None:
            ring = self.models[model] = SecondRing(ModelSecond, self.seconds)
        return ring.at(now)

    # -- events -----------------------------------------------------------------------------
    def request_ended(self, model: str, now: float, outcome: str, rt_ms: float | None, sla_ms: float, device: str) -> None:
        """A request ended with ``outcome``; ``rt_ms`` is its response time when it was answered."""
        second = self._model(model, now)
        if second is None:
            return
        second.sla_ms = sla_ms
        if rt_ms is not None:
            second.observe(rt_ms)
            second.violations += rt_ms > sla_ms
            second.on_device[device] = second.on_device.get(device, 0) + 1
        elif outcome in REFUSED:
            second.refused += 1
        elif outcome in TIMEOUTS:
            second.timeouts += 1
        elif outcome in FAILED:
            second.failed += 1

    def batch_done(self, model: str, executor: str, device: str, rows: int, now: float) -> None:
        """A batch of ``rows`` finished on ``executor`` (a GPU's batches are counted per GPU too)."""
        second = self._model(model, now)
        if second is not None:
            second.batches[rows] = second.batches.get(rows, 0) + 1
        if device != "cpu":
            node = self.node.at(now)
            if node is not None:
                per_gpu = node.gpu_batches.setdefault(executor, {})
                per_gpu[rows] = per_gpu.get(rows, 0) + 1

    def gpu_busy(self, executor: str, started: float, ended: float) -> None:
        """``executor`` held a batch from ``started`` to ``ended``: its busy time, split over the seconds it spans."""
        t = started
        while t < ended:
            boundary = min(ended, math.floor(t) + 1.0)
            node = self.node.at(t)
            if node is not None:
                node.gpu_busy_s[executor] = node.gpu_busy_s.get(executor, 0.0) + boundary - t
            t = boundary

    def queue(self, model: str, now: float, length: int, sla_ms: float) -> None:
        """The model's queue after an action of the dispatch core: the second keeps its longest."""
        second = self._model(model, now)
        if second is not None:
            second.queue_length = max(length, second.queue_length or 0)
            second.sla_ms = sla_ms

    def control_period(self, now: float, period_s: float, periods: Mapping[str, PeriodOf], sla_ms: Mapping[str, float]) -> None:
        """A control period of ``period_s`` closed at ``now`` with each controlled model's ``PeriodOf``."""
        for model, period in periods.items():
            second = self._model(model, now)
            if second is None:
                continue
            second.demanded_cores, second.granted_cores = period.demanded, period.granted
            second.used_cores = period.cpu_s / period_s if period_s > 0 else None
            second.sla_ms = sla_ms.get(model, second.sla_ms)
        node = self.node.at(now)
        if node is not None and periods:
            node.granted_cores = sum(p.granted for p in periods.values())
            node.used_cores = sum(p.cpu_s for p in periods.values()) / period_s if period_s > 0 else None

    def gpu_signals(self, now: float, bad_rate: float, idle_fraction: float) -> None:
        """Symphony's bad rate and idle fraction as read at ``now`` (Section 4.4; gateway/gpu_cluster.py)."""
        node = self.node.at(now)
        if node is not None:
            node.bad_rate, node.idle_fraction = bad_rate, idle_fraction

    # -- readings ---------------------------------------------------------------------------
    def snapshot(self, now: float, seconds: int, sla_ms: Mapping[str, float], gpus: Iterable[str] = ()) -> dict[str, Any]:
        """The last ``seconds`` whole seconds before ``now``: per model (those of ``sla_ms``), per
        GPU executor of ``gpus`` and for the node.

        ``sla_ms`` is each model's SLA now: the SLA line holds each second's last known SLA,
        carried forward over seconds that saw no event, and the current one before the first.
        """
        grid = self.node.last(now, seconds)
        t = [s - math.floor(now) for s, _ in grid]
        models = {}
        for name, current in sla_ms.items():
            ring = self.models.get(name)
            buckets = [ring.get(s) if ring is not None else None for s, _ in grid]
            models[name] = _model_series(buckets, current)
        nodes = [bucket for _, bucket in grid]
        per_gpu = {
            gpu: {
                "busy": [_round(min(1.0, n.gpu_busy_s[gpu])) if n is not None and gpu in n.gpu_busy_s else 0.0 for n in nodes],
                "batch_sizes": _merge(n.gpu_batches.get(gpu, {}) for n in nodes if n is not None),
            }
            for gpu in gpus
        }
        return {
            "t": t,
            "models": models,
            "gpus": per_gpu,
            "node": {
                "granted_cores": [_round(n.granted_cores) if n is not None else None for n in nodes],
                "used_cores": [_round(n.used_cores) if n is not None else None for n in nodes],
                "bad_rate": [_round(n.bad_rate) if n is not None else None for n in nodes],
                "idle_fraction": [_round(n.idle_fraction) if n is not None else None for n in nodes],
            },
        }


def _model_series(buckets: list[ModelSecond | None], current_sla_ms: float) -> dict[str, Any]:
    def each(read: Callable[[ModelSecond], Any], empty: Any = None) -> list[Any]:
        return [read(b) if b is not None else empty for b in buckets]

    known = [b.sla_ms if b is not None else None for b in buckets]
    first = next((s for s in known if s is not None), current_sla_ms)
    sla_line, last = [], first
    for s in known:
        last = s if s is not None else last
        sla_line.append(last)
    present = [b for b in buckets if b is not None]
    series = {
        "sla_ms": sla_line,
        "mean_rt_ms": each(lambda b: _round(b.mean_ms)),
        "p99_rt_ms": each(lambda b: _round(b.p99_ms)),
        "requests": each(lambda b: b.served, 0),
        "violations": each(lambda b: b.violations, 0),
        "refused": each(lambda b: b.refused, 0),
        "timeouts": each(lambda b: b.timeouts, 0),
        "failed": each(lambda b: b.failed, 0),
        "on_cpu": each(lambda b: b.on_device.get("cpu", 0), 0),
        "on_gpu": each(lambda b: sum(n for d, n in b.on_device.items() if d != "cpu"), 0),
        "queue_length": each(lambda b: b.queue_length),
        "demanded_cores": each(lambda b: _round(b.demanded_cores)),
        "granted_cores": each(lambda b: _round(b.granted_cores)),
        "used_cores": each(lambda b: _round(b.used_cores)),
    }
    return {"series": series, "batch_sizes": _merge(b.batches for b in present)}


def _merge(counts: Iterable[Mapping[int, int]]) -> dict[str, int]:
    """Counts by batch size, added up, as a JSON object in increasing size."""
    total: dict[int, int] = {}
    for each in counts:
        for rows, n in each.items():
            total[rows] = total.get(rows, 0) + n
    return {str(rows): total[rows] for rows in sorted(total)}


def _round(value: float | None) -> float | None:
    """Four significant decimals are all a chart shows, and keep the JSON short."""
    return None if value is None else round(value, 4)
