"""The serving engine: per-model queues, executors, and the carrying-out of scheduler decisions.

Requests wait in a FIFO queue per model (ROMA Section 2.1). Whenever a request arrives or an
executor becomes free, the CPU scheduler pairs free executors with queued work and the engine
sends each chosen executor one batch from the head of that queue. Every request ends with a
result or an explicit error.
"""

from __future__ import annotations

import asyncio
import logging
import random
import shutil
import tempfile
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from executors.connection import ExecutorFailed, ModelError
from executors.lifecycle import SupervisedExecutor
from executors.process import ProcessExecutor
from gateway.batching import batch_key, split_outputs, stack_inputs, take_batch
from gateway.config import GatewayConfig, ModelConfig
from gateway.control import ControlLoop
from gateway.metrics import GatewayMetrics
from gateway.protocol import InferRequest
from gateway.signature import ModelSignature
from gateway.stats import CoreMeter, ResponseTimes
from schedulers.round_robin import RandomRoundRobin
from supervisor.actuation import Actuator, make_actuator
from supervisor.node import Window

# Control periods kept for the admin API's history: an hour at ROMA's 1 s period.
HISTORY = 3600

log = logging.getLogger("gateway")


class RequestFailed(RuntimeError):
    """A request that was accepted but could not be served; ``status`` is its HTTP status."""

    def __init__(self, message: str, status: int, outcome: str):
        super().__init__(message)
        self.status, self.outcome = status, outcome


@dataclass
class Pending:
    request: InferRequest
    arrival: float
    future: asyncio.Future[Result]
    batch_key: tuple = ()
    dispatched: float = 0.0

    @property
    def inputs(self) -> dict[str, np.ndarray]:
        return self.request.inputs

    @property
    def rows(self) -> int:
        return self.request.rows


@dataclass
class Result:
    outputs: dict[str, np.ndarray]
    executed_on: str
    batch_size: int
    queue_ms: float
    compute_ms: float


@dataclass
class ModelRuntime:
    config: ModelConfig
    sla_ms: float
    executors: list[SupervisedExecutor]
    signature: ModelSignature | None = None
    queue: deque[Pending] = field(default_factory=deque)
    times: ResponseTimes = field(default_factory=ResponseTimes)
    core_meters: dict[str, CoreMeter] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)
    # Requests served since the last control period, and one entry per period closed.
    window: Window = field(default_factory=Window)
    windows: int = 0
    window_violations: int = 0
    history: deque[dict[str, float | int | None]] = field(default_factory=lambda: deque(maxlen=HISTORY))

    def close_window(self, now: float, served: Window, demanded: float, granted: float) -> None:
        """ROMA's violation (Section 5): the mean response time of a control window over the SLA."""
        mean = served.mean_ms
        self.windows += 1
        violated = mean is not None and mean > self.sla_ms
        self.window_violations += violated
        self.history.append(
            {
                "t": round(now, 3),
                "requests": served.count,
                "mean_rt_ms": mean,
                "sla_ms": self.sla_ms,
                "demanded_cores": round(demanded, 4),
                "cores": round(granted, 4),
                "violation": violated,
            }
        )

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def ready(self) -> bool:
        return any(e.ready for e in self.executors)

    @property
    def datatypes(self) -> dict[str, str]:
        assert self.signature is not None
        return {t.name: t.datatype for t in self.signature.outputs}


class Engine:
    def __init__(self, config: GatewayConfig, metrics: GatewayMetrics):
        self.config = config
        self.metrics = metrics
        self.scheduler = RandomRoundRobin(random.Random(config.policy.seed))
        self._socket_dir = Path(tempfile.mkdtemp(prefix="gateway-"))
        self._busy: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.actuator: Actuator = make_actuator(config.control.actuator, config.control.cfs_period_us)
        self.control: ControlLoop | None = None
        self.models: dict[str, ModelRuntime] = {}
        for name, model in config.models.items():
            executor = ProcessExecutor(
                f"cpu-{name}",
                {name: model.path},
                device="cpu",
                threads=model.cpu.threads,
                cores=model.cpu.cores,
                socket_dir=self._socket_dir,
                actuator=self.actuator,
                on_change=self._on_executor_change,
            )
            self.models[name] = ModelRuntime(config=model, sla_ms=model.sla_ms, executors=[executor])

    @property
    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def start(self) -> None:
        self.control = ControlLoop(self)
        for name, cores in self.control.initial_cores.items():
            for executor in self.models[name].executors:
                executor.cores = cores
        executors = [e for runtime in self.models.values() for e in runtime.executors]
        results = await asyncio.gather(*(e.start() for e in executors), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            await self.stop()
            raise failures[0]
        now = self.now
        for runtime in self.models.values():
            runtime.signature = ModelSignature.from_json(runtime.executors[0].signatures[runtime.name])
            self.metrics.sla_seconds.labels(runtime.name).set(runtime.sla_ms / 1000)
            for executor in runtime.executors:
                runtime.core_meters[executor.id] = CoreMeter(executor.cores, now)
                self.metrics.cores.labels(runtime.name, executor.id).set(executor.cores)
                log.info(
                    "model %s: executor %s (%s, pid %s, %.2f cores, %s threads, provider %s), batching %s",
                    runtime.name,
                    executor.id,
                    executor.backend,
                    executor.pid,
                    executor.cores,
                    executor.threads,
                    executor.provider,
                    f"up to {runtime.config.max_batch_size}" if runtime.signature.batchable else "off",
                )
        self.control.start()
        control = self.config.control
        log.info(
            "CPU control: policy %s, period %g s, cores enforced by %s", control.policy, control.period_s, self.actuator.name
        )

    async def stop(self) -> None:
        if self.control is not None:
            await self.control.stop()
        for runtime in self.models.values():
            while runtime.queue:
                self._fail(runtime, runtime.queue.popleft(), RequestFailed("the gateway is shutting down", 503, "shutdown"))
        await asyncio.gather(*(e.stop() for r in self.models.values() for e in r.executors), return_exceptions=True)
        self.actuator.close()
        shutil.rmtree(self._socket_dir, ignore_errors=True)

    # -- requests ---------------------------------------------------------------------------
    def submit(self, runtime: ModelRuntime, request: InferRequest, arrival: float) -> asyncio.Future[Result]:
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        pending = Pending(request, arrival, future)
        if runtime.signature is not None and runtime.signature.batchable:
            pending.batch_key = batch_key(request.inputs)
        runtime.queue.append(pending)
        self._pump()
        return future

    def record(self, runtime: ModelRuntime, outcome: str, arrival: float | None = None) -> None:
        """Account for a request that ended (``arrival`` given: it was served)."""
        runtime.outcomes[outcome] = runtime.outcomes.get(outcome, 0) + 1
        self.metrics.requests.labels(runtime.name, outcome).inc()
        if arrival is not None:
            rt_ms = (self.now - arrival) * 1000
            if rt_ms > runtime.sla_ms:
                self.metrics.violations.labels(runtime.name).inc()
            runtime.times.observe(rt_ms, runtime.sla_ms)
            runtime.window.add(rt_ms)
            self.metrics.request_seconds.labels(runtime.name).observe(rt_ms / 1000)

    def set_sla(self, runtime: ModelRuntime, sla_ms: float) -> None:
        runtime.sla_ms = sla_ms
        self.metrics.sla_seconds.labels(runtime.name).set(sla_ms / 1000)
        log.info("model %s: SLA set to %g ms", runtime.name, sla_ms)

    def set_cores(self, runtime: ModelRuntime, cores: float) -> None:
        now = self.now
        for executor in runtime.executors:
            if abs(executor.cores - cores) > 1e-6:
                executor.set_cores(cores)
            runtime.core_meters[executor.id].set(cores, now)
            self.metrics.cores.labels(runtime.name, executor.id).set(cores)

    def core_seconds(self, runtime: ModelRuntime) -> float:
        now = self.now
        return sum(meter.total(now) for meter in runtime.core_meters.values())

    # -- dispatch ---------------------------------------------------------------------------
    def _on_executor_change(self) -> None:
        self._pump()

    def _pump(self) -> None:
        waiting = {name: len(r.queue) for name, r in self.models.items() if r.queue}
        if not waiting:
            return
        free = {name: [e.id for e in self.models[name].executors if e.ready and e.id not in self._busy] for name in waiting}
        for decision in self.scheduler.assign(waiting, free):
            runtime = self.models[decision.model]
            if not runtime.queue:
                continue
            executor = next(e for e in runtime.executors if e.id == decision.executor_id)
            batch = take_batch(runtime.queue, runtime.config.max_batch_size, runtime.signature.batchable)
            self._busy.add(executor.id)
            task = asyncio.create_task(self._run_batch(runtime, executor, batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        for name, runtime in self.models.items():
            self.metrics.queue_length.labels(name).set(len(runtime.queue))

    async def _run_batch(self, runtime: ModelRuntime, executor: SupervisedExecutor, batch: list[Pending]) -> None:
        dispatched = self.now
        rows = sum(p.rows for p in batch)
        try:
            outputs, compute_ms = await executor.infer(runtime.name, stack_inputs(batch))
            parts = split_outputs(outputs, batch)
        except ExecutorFailed as error:
            for pending in batch:
                self._fail(runtime, pending, RequestFailed(f"executor {executor.id} failed: {error}", 503, "executor_failed"))
            return
        except (ModelError, ValueError) as error:
            for pending in batch:
                self._fail(
                    runtime, pending, RequestFailed(f"model '{runtime.name}' failed on this input: {error}", 400, "model_error")
                )
            return
        finally:
            self._busy.discard(executor.id)
            self._pump()
        self.metrics.batch_size.labels(runtime.name).observe(rows)
        self.metrics.compute_seconds.labels(runtime.name).observe(compute_ms / 1000)
        for pending, part in zip(batch, parts, strict=True):
            queue_ms = (dispatched - pending.arrival) * 1000
            self.metrics.queue_seconds.labels(runtime.name).observe(queue_ms / 1000)
            if not pending.future.done():
                pending.future.set_result(Result(part, executor.device, rows, queue_ms, compute_ms))

    def _fail(self, runtime: ModelRuntime, pending: Pending, error: RequestFailed) -> None:
        if not pending.future.done():
            pending.future.set_exception(error)

    def describe(self, runtime: ModelRuntime) -> dict[str, Any]:
        times = runtime.times
        return {
            "name": runtime.name,
            "sla_ms": runtime.sla_ms,
            "queue_length": len(runtime.queue),
            "max_batch_size": runtime.config.max_batch_size if runtime.signature and runtime.signature.batchable else 0,
            "ready": runtime.ready,
            "executors": [e.describe() for e in runtime.executors],
            "stats": {
                "requests": times.requests,
                "mean_rt_ms": times.mean_ms,
                "p99_rt_ms": times.p99_ms,
                "max_rt_ms": times.max_ms,
                "std_rt_ms": times.std_ms,
                "violations": times.violations,
                "window_violations": runtime.window_violations,
                "windows": runtime.windows,
                "core_seconds": self.core_seconds(runtime),
                "outcomes": dict(runtime.outcomes),
            },
        }
