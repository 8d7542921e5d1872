"""The serving engine: per-model queues, executors, and the carrying-out of scheduler decisions.

Requests wait in a FIFO queue per model (ROMA Section 2.1). Whenever a request arrives, an
executor becomes free or a deferred GPU batch falls due, the engine asks the schedulers what to
do and carries it out:

- the GPU scheduler (schedulers/gpu.py) decides what each free GPU executor runs next, may
  defer a small batch to let it grow (Symphony), and sets aside requests that can no longer
  meet their deadline;
- the CPU scheduler (ROMA's round-robin) pairs free CPU executors with queued work; where GPUs
  serve the node, a CPU executor takes from a queue only the requests that the GPUs' projected
  capacity cannot finish in time, so that it never starves a batch the GPU defers on purpose.

Every request ends with a result or an explicit error.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import math
import random
import shutil
import tempfile
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from executors.connection import ExecutorFailed, ModelError
from executors.container import DockerBackend, DockerExecutor
from executors.lifecycle import SupervisedExecutor
from executors.process import ProcessExecutor
from gateway.batching import batch_key, split_outputs, stack_inputs, take_batch
from gateway.config import GatewayConfig, ModelConfig
from gateway.control import ControlLoop
from gateway.metrics import GatewayMetrics
from gateway.profiling import profile_executor
from gateway.protocol import InferRequest
from gateway.signature import ModelSignature
from gateway.stats import CoreMeter, ResponseTimes
from schedulers.admission import admissible
from schedulers.candidate import QueuedRequest
from schedulers.gpu import Dispatch, GpuScheduler, Refuse, WaitUntil, gpu_can_finish
from schedulers.profiles import LatencyProfile
from schedulers.round_robin import RandomRoundRobin
from supervisor.actuation import Actuator, make_actuator
from supervisor.node import Window

# Control periods kept for the admin API's history: an hour at ROMA's 1 s period.
HISTORY = 3600

log = logging.getLogger("gateway")


class RequestFailed(RuntimeError):
    """A request that was accepted but could not be served; ``status`` is its HTTP status."""

    def __init__(self, message: str, status: int, outcome: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.outcome, self.headers = status, outcome, headers or {}


@dataclass
class Pending:
    id: int
    request: InferRequest
    arrival: float
    deadline: float
    future: asyncio.Future[Result]
    batch_key: tuple = ()
    timer: asyncio.TimerHandle | None = None

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
    # Batch latency of the model on its CPU executor and on the node's GPUs (schedulers/profiles.py).
    cpu_profile: LatencyProfile | None = None
    gpu_profile: LatencyProfile | None = None
    devices: dict[str, int] = field(default_factory=dict)  # requests served, by device
    received: int = 0  # infer requests received; each ends in exactly one of ``outcomes``

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
        # Process executors get their cores through a cgroup (or affinity); containers through Docker.
        self.actuator: Actuator | None = None
        self.control: ControlLoop | None = None
        self.models: dict[str, ModelRuntime] = {}
        self.docker: DockerBackend | None = None
        executor_class: Callable[..., SupervisedExecutor] = ProcessExecutor
        if config.node.executor_backend == "docker":
            self.docker = DockerBackend(config.docker.image, config.docker.host_runtime)
            executor_class = functools.partial(
                DockerExecutor, docker_backend=self.docker, cfs_period_us=config.control.cfs_period_us
            )
        else:
            self.actuator = make_actuator(config.control.actuator, config.control.cfs_period_us)
        for name, model in config.models.items():
            executor = executor_class(
                f"cpu-{name}",
                {name: model.path},
                device="cpu",
                threads=model.cpu.threads,
                cores=model.cpu.cores,
                memory_mb=model.cpu.memory_mb,
                socket_dir=self._socket_dir,
                actuator=self.actuator,
                on_change=self._on_executor_change,
            )
            self.models[name] = ModelRuntime(config=model, sla_ms=model.sla_ms, executors=[executor])
        self._ids = itertools.count(1)
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.gpu_executors: list[SupervisedExecutor] = []
        self.gpu_scheduler: GpuScheduler | None = None
        self._gpu_free_at: dict[str, float] = {}
        self._wake: asyncio.TimerHandle | None = None
        self._wake_at = float("inf")
        gpu = config.gpu
        for device_id in config.node.gpus:
            emulate = (
                {name: gpu.profiles[m.gpu_profile or name] for name, m in config.models.items()}
                if gpu.executor == "emulated"
                else None
            )
            self.gpu_executors.append(
                executor_class(
                    f"gpu-{device_id}",
                    {name: m.path for name, m in config.models.items()},
                    device=f"gpu:{device_id}",
                    threads=1,
                    cores=0.0,
                    socket_dir=self._socket_dir,
                    emulate=emulate,
                    emulate_zeros=gpu.emulated_outputs == "zeros",
                    on_change=self._on_executor_change,
                )
            )
        if self.gpu_executors:
            self.gpu_scheduler = GpuScheduler(gpu.policy, config.control.setpoint_ratio, gpu.queue_weight)

    @property
    def enforced_by(self) -> str:
        """How executors' cores are carried out."""
        return self.actuator.name if self.actuator is not None else "docker-cpu-quota"

    @property
    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def start(self) -> None:
        if self.docker is not None:
            await asyncio.to_thread(self.docker.connect)  # raises DockerUnavailable with the fix
        self.control = ControlLoop(self)
        for name, cores in self.control.initial_cores.items():
            for executor in self.models[name].executors:
                executor.cores = cores
        executors = [e for runtime in self.models.values() for e in runtime.executors] + self.gpu_executors
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
        await self._profile()
        self.control.start()
        control = self.config.control
        log.info("CPU control: policy %s, period %g s, cores enforced by %s", control.policy, control.period_s, self.enforced_by)

    async def _profile(self) -> None:
        """Seed each model's latency profiles with a short profiling run on each kind of device."""
        for runtime in self.models.values():
            assert runtime.signature is not None
            runtime.cpu_profile = await profile_executor(runtime.executors[0], runtime.name, runtime.signature, runtime.config)
            log.info(
                "model %s: CPU profile l(b) = %.3f b + %.3f ms",
                runtime.name,
                runtime.cpu_profile.per_item_ms,
                runtime.cpu_profile.fixed_ms,
            )
            if self.gpu_scheduler is not None:
                gpu = self.gpu_executors[0]
                if gpu.emulate:
                    per_item, fixed = gpu.emulate[runtime.name]
                    runtime.gpu_profile = LatencyProfile(per_item, fixed)
                else:
                    runtime.gpu_profile = await profile_executor(gpu, runtime.name, runtime.signature, runtime.config)
                log.info(
                    "model %s: GPU profile l(b) = %.3f b + %.3f ms%s",
                    runtime.name,
                    runtime.gpu_profile.per_item_ms,
                    runtime.gpu_profile.fixed_ms,
                    " (emulated)" if gpu.emulate else "",
                )
                max_batch = runtime.config.max_batch_size if runtime.signature.batchable else 1
                self.gpu_scheduler.add_model(
                    runtime.name, runtime.sla_ms, max_batch, runtime.gpu_profile, runtime.config.drop_late
                )
        for executor in self.gpu_executors:
            log.info(
                "GPU executor %s on %s (pid %s, provider %s%s)",
                executor.id,
                executor.device,
                executor.pid,
                executor.provider,
                ", emulated" if executor.emulate else "",
            )

    async def stop(self) -> None:
        if self._wake is not None:
            self._wake.cancel()
        if self.control is not None:
            await self.control.stop()
        for runtime in self.models.values():
            while runtime.queue:
                self._fail(runtime, runtime.queue.popleft(), RequestFailed("the gateway is shutting down", 503, "shutdown"))
        executors = [e for r in self.models.values() for e in r.executors] + self.gpu_executors
        await asyncio.gather(*(e.stop() for e in executors), return_exceptions=True)
        if self.docker is not None:
            self.docker.close()
        if self.actuator is not None:
            self.actuator.close()
        shutil.rmtree(self._socket_dir, ignore_errors=True)

    # -- requests ---------------------------------------------------------------------------
    def submit(self, runtime: ModelRuntime, request: InferRequest, arrival: float) -> asyncio.Future[Result]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        pending = Pending(next(self._ids), request, arrival, arrival + runtime.sla_ms / 1000, future)
        if len(runtime.queue) >= runtime.config.max_queue_size:
            retry_after = self._retry_after_s(runtime)
            future.set_exception(
                RequestFailed(
                    f"model '{runtime.name}' has {len(runtime.queue)} requests waiting, its limit (max_queue_size); "
                    f"refused before any work was done, retry in {retry_after} s",
                    429,
                    "queue_full",
                    {"Retry-After": str(retry_after)},
                )
            )
            return future
        if runtime.config.drop_late:
            profiles = [p for p in (runtime.cpu_profile, runtime.gpu_profile) if p is not None]
            if profiles and not admissible(self._queued(runtime.name, pending), self.now, profiles):
                fastest = min(p.latency_ms(request.rows) for p in profiles)
                future.set_exception(
                    RequestFailed(
                        f"model '{runtime.name}' cannot answer within its SLA of {runtime.sla_ms:g} ms: the fastest device "
                        f"needs {fastest:.1f} ms for this request; refused before any work was done",
                        503,
                        "refused_deadline",
                    )
                )
                return future
        if runtime.signature is not None and runtime.signature.batchable:
            pending.batch_key = batch_key(request.inputs)
        if self.gpu_scheduler is not None:
            self.gpu_scheduler.on_arrival(runtime.name, self.now)
        timeout_s = self.config.server.request_timeout_ms / 1000
        if request.timeout_us:  # Triton reads 0 as no timeout of the client's own
            timeout_s = min(timeout_s, request.timeout_us / 1e6)
        pending.timer = loop.call_at(arrival + timeout_s, self._expire, runtime, pending, timeout_s)
        self._active += 1
        self._idle.clear()
        future.add_done_callback(lambda _: self._ended(pending))
        runtime.queue.append(pending)
        self._pump()
        return future

    def _ended(self, pending: Pending) -> None:
        if pending.timer is not None:
            pending.timer.cancel()
        self._active -= 1
        if not self._active:
            self._idle.set()

    def _expire(self, runtime: ModelRuntime, pending: Pending, timeout_s: float) -> None:
        """The request's timeout passed: answer it now; queued, it is never run, running, its result is dropped."""
        if pending.future.done():
            return
        try:
            runtime.queue.remove(pending)
            where = "waiting in the queue; it was not run"
        except ValueError:
            where = "while its batch ran; the result is discarded"
        self._fail(runtime, pending, RequestFailed(f"timed out after {timeout_s * 1000:g} ms {where}", 504, "timeout"))
        self.metrics.queue_length.labels(runtime.name).set(len(runtime.queue))

    def _retry_after_s(self, runtime: ModelRuntime) -> int:
        """Whole seconds until the queue has drained at the model's measured speed (at least 1)."""
        profile = runtime.cpu_profile or runtime.gpu_profile
        rows = sum(p.rows for p in runtime.queue)
        servers = max(1, sum(e.ready for e in runtime.executors))
        drain_ms = profile.latency_ms(1) * rows / servers if profile is not None else 1000.0
        return max(1, math.ceil(drain_ms / 1000))

    @property
    def active(self) -> int:
        """Requests accepted into a queue that have not ended yet."""
        return self._active

    async def drain(self, timeout_s: float) -> bool:
        """Wait until every accepted request has ended, at most ``timeout_s``; whether they all did."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    @staticmethod
    def _queued(model: str, pending: Pending) -> QueuedRequest:
        return QueuedRequest(pending.id, model, pending.arrival, pending.deadline, pending.rows)

    def received(self, runtime: ModelRuntime) -> None:
        """Account for an infer request that reached the model; ``record`` ends it."""
        runtime.received += 1
        self.metrics.received.labels(runtime.name).inc()
        self.metrics.in_flight.labels(runtime.name).inc()

    def record(self, runtime: ModelRuntime, outcome: str, arrival: float | None = None, device: str = "cpu") -> None:
        """Account for a request that ended (``arrival`` given: it was served, on ``device``)."""
        runtime.outcomes[outcome] = runtime.outcomes.get(outcome, 0) + 1
        self.metrics.requests.labels(runtime.name, outcome).inc()
        self.metrics.in_flight.labels(runtime.name).dec()
        if arrival is not None:
            rt_ms = (self.now - arrival) * 1000
            if rt_ms > runtime.sla_ms:
                self.metrics.violations.labels(runtime.name).inc()
            runtime.times.observe(rt_ms, runtime.sla_ms)
            runtime.devices[device] = runtime.devices.get(device, 0) + 1
            # The CPU controllers regulate what their executor serves (ROMA Section 4).
            if device == "cpu":
                runtime.window.add(rt_ms)
            if self.gpu_scheduler is not None:
                self.gpu_scheduler.on_completed(runtime.name, rt_ms)
            self.metrics.request_seconds.labels(runtime.name).observe(rt_ms / 1000)

    def set_sla(self, runtime: ModelRuntime, sla_ms: float) -> None:
        runtime.sla_ms = sla_ms
        if self.gpu_scheduler is not None and runtime.name in self.gpu_scheduler.models:
            self.gpu_scheduler.models[runtime.name].sla_ms = sla_ms
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
        if self.gpu_scheduler is not None:
            self._pump_gpus()
        shares = {name: self._cpu_share(r) for name, r in self.models.items() if r.queue}
        waiting = {name: n for name, n in shares.items() if n}
        if waiting:
            free = {name: [e.id for e in self.models[name].executors if e.ready and e.id not in self._busy] for name in waiting}
            for decision in self.scheduler.assign(waiting, free):
                runtime = self.models[decision.model]
                share = self._cpu_share(runtime)
                if not share:
                    continue
                executor = next(e for e in runtime.executors if e.id == decision.executor_id)
                limit = min(runtime.config.max_batch_size, sum(p.rows for p in itertools.islice(runtime.queue, share)))
                batch = take_batch(runtime.queue, limit, runtime.signature.batchable)
                self._start_batch(runtime, executor, batch)
        for name, runtime in self.models.items():
            self.metrics.queue_length.labels(name).set(len(runtime.queue))

    def _cpu_share(self, runtime: ModelRuntime) -> int:
        """How many requests at the head of the queue the CPU may take.

        Without GPUs, all of them. With GPUs, as many as the GPUs' projected capacity cannot
        finish in time (``gpu_can_finish`` over the whole queue), taken from the head: the
        oldest go to the CPU, and the requests behind them move up to positions the GPUs can
        finish. A batch the GPU is deferring on purpose is never taken.
        """
        if self.gpu_scheduler is None or runtime.gpu_profile is None or self.config.gpu.cpu_sharing == "greedy":
            return len(runtime.queue)
        if not any(e.ready for e in self.gpu_executors):
            return len(runtime.queue)  # every GPU executor is down: the CPU serves alone
        now = self.now
        free_at = min((self._gpu_free_at.get(e.id, now) for e in self.gpu_executors if e.ready), default=now)
        max_batch = self.gpu_scheduler.models[runtime.name].max_batch
        return sum(
            not gpu_can_finish(self._queued(runtime.name, pending), position, now, free_at, runtime.gpu_profile, max_batch)
            for position, pending in enumerate(runtime.queue)
        )

    def _pump_gpus(self) -> None:
        assert self.gpu_scheduler is not None
        now = self.now
        for executor in self.gpu_executors:
            if not executor.ready or executor.id in self._busy:
                continue
            while True:
                queues = {name: [self._queued(name, p) for p in r.queue] for name, r in self.models.items() if r.queue}
                if not queues:
                    return
                decisions = self.gpu_scheduler.decide(now, executor.id, now, queues)
                for decision in decisions:
                    if isinstance(decision, Refuse):
                        self.gpu_scheduler.on_refused(decision.model, decision.requests, now)
                        self._refuse(self.models[decision.model], {r.id for r in decision.requests})
                    elif isinstance(decision, Dispatch):
                        runtime = self.models[decision.model]
                        batch = take_batch(runtime.queue, decision.rows, runtime.signature.batchable)
                        self._start_batch(runtime, executor, batch)
                    elif isinstance(decision, WaitUntil):
                        self._wake_up_at(decision.time)
                if any(isinstance(d, Dispatch) for d in decisions):
                    break  # this GPU is busy now; on to the next
                if not any(isinstance(d, Refuse) for d in decisions):
                    return  # nothing to run yet: no other GPU would get another answer

    def _refuse(self, runtime: ModelRuntime, ids: set[int]) -> None:
        while runtime.queue and runtime.queue[0].id in ids:
            pending = runtime.queue.popleft()
            self._fail(
                runtime,
                pending,
                RequestFailed(
                    f"model '{runtime.name}' could not serve this request within its SLA of {runtime.sla_ms:g} ms "
                    "(no device could finish it in time); refused before it ran",
                    503,
                    "refused_deadline",
                ),
            )

    def _wake_up_at(self, when: float) -> None:
        """Ask the schedulers again at ``when`` (a deferred batch falls due)."""
        if when >= self._wake_at and self._wake is not None:
            return
        if self._wake is not None:
            self._wake.cancel()
        self._wake_at = when

        def wake() -> None:
            self._wake, self._wake_at = None, float("inf")
            self._pump()

        self._wake = asyncio.get_running_loop().call_at(when, wake)

    def _start_batch(self, runtime: ModelRuntime, executor: SupervisedExecutor, batch: list[Pending]) -> None:
        self._busy.add(executor.id)
        task = asyncio.create_task(self._run_batch(runtime, executor, batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_batch(self, runtime: ModelRuntime, executor: SupervisedExecutor, batch: list[Pending]) -> None:
        dispatched = self.now
        rows = sum(p.rows for p in batch)
        on_gpu = executor.device.startswith("gpu")
        profile = runtime.gpu_profile if on_gpu else runtime.cpu_profile
        if on_gpu and profile is not None:
            self._gpu_free_at[executor.id] = dispatched + profile.latency_ms(rows) / 1000
        hang_s = runtime.config.hang_timeout_s
        try:
            try:
                outputs, compute_ms = await asyncio.wait_for(executor.infer(runtime.name, stack_inputs(batch)), hang_s)
            except TimeoutError:
                executor.kill_hung(f"no reply to a batch of {rows} within {hang_s:g} s (hang_timeout_ms)")
                raise ExecutorFailed(f"it did not answer within {hang_s:g} s and was killed (hung)") from None
            parts = split_outputs(outputs, batch)
            if on_gpu and self.gpu_scheduler is not None:
                self.gpu_scheduler.on_batch_done(runtime.name, rows, compute_ms)
            elif profile is not None:
                profile.observe(rows, compute_ms)
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
            self._gpu_free_at.pop(executor.id, None)
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
            "pinned_cores": self.control.pinned.get(runtime.name) if self.control is not None else None,
            "executors": [e.describe() for e in runtime.executors + self.gpu_executors],
            "drop_late": runtime.config.drop_late,
            "profiles": {
                device: {"per_item_ms": p.per_item_ms, "fixed_ms": p.fixed_ms}
                for device, p in (("cpu", runtime.cpu_profile), ("gpu", runtime.gpu_profile))
                if p is not None
            },
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
                "received": runtime.received,
                "in_flight": runtime.received - sum(runtime.outcomes.values()),
                "outcomes": dict(runtime.outcomes),
                "served_on": dict(runtime.devices),
            },
        }
