"""The serving engine: the asyncio shell around the dispatch core.

Every per-request decision (queues, admission, timeouts, CPU or GPU, batches, deferral) is made
by the pure dispatch core (schedulers/dispatch.py), the very code ``gateway simulate`` runs on a
virtual clock. This module feeds it events, timestamped with time.perf_counter (uvloop's
loop.time() has 1 ms grain and stands still within a loop iteration), and carries out its
actions: it runs batches on executor processes or containers, answers the HTTP handlers'
futures, and keeps the one timer the core asks for. It also starts the executors, profiles them,
keeps the per-model accounting and wires the control loop.

GPU batches carry Clockwork's latest start (Section 4.4) to their executor; one that reaches a
batch too late answers so without running it, and the core reschedules or refuses its requests.
What the GPUs did over the last period (gateway/gpu_cluster.py) gives Symphony's autoscaling
signals on /metrics (Section 4.4; schedulers/autoscale.py).

A model with ``cpu_executor = false`` gets no CPU executor: the node's GPU executors alone
serve it, and the core admits, refuses and schedules it on its GPU profile alone.

Every request ends with a result or an explicit error.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import math
import shutil
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from executors.connection import BatchLate, ExecutorFailed, ModelError
from executors.container import DockerBackend
from executors.lifecycle import ExecutorStartError, SupervisedExecutor, cpu_seconds_since
from executors.limits import Actuator
from executors.sockets import socket_folder
from executors.tensors import first_non_text
from gateway.batching import batch_key, split_outputs, stack_inputs
from gateway.cluster.dispatcher import Cluster
from gateway.cluster.link import RemoteExecutor
from gateway.config import GatewayConfig, ModelConfig
from gateway.control import ControlLoop
from gateway.dispatch_setup import batch_limit, dispatch_core_of, gpu_scheduler_of
from gateway.gpu_cluster import GpuClusterWindow, ended_out_of_slo
from gateway.metrics import GatewayMetrics, ModelMetrics, ModelTotals, TritonTotals
from gateway.node import NodeExecutors, build_node_executors
from gateway.pipeline.runner import PipelineRuntime, StepFailed
from gateway.profiling import profile_executor
from gateway.protocol import InferRequest, InvalidRequest
from gateway.signature import ModelSignature
from gateway.stacking_check import file_signature, why_stacking_changes_results, why_stacking_changes_results_here
from gateway.stats import CoreMeter, ResponseTimes
from gateway.triton_stats import BatchTiming, ModelStatistics
from gateway.ui.series import LiveSeries, PeriodOf
from schedulers.autoscale import ScalingSignal, scaling_signal
from schedulers.dispatch import CPU, EXECUTOR_FAILED, GPU, Action, Batch, Fail, Finish, Start, WakeAt, cpu_executor_id
from schedulers.gpu_memory import Load
from schedulers.profiles import LatencyProfile
from schedulers.request import Request
from supervisor.node import Allocation, Window

# Control periods kept for the admin API's history: an hour at ROMA's 1 s period.
HISTORY = 3600
# A pipeline is its config's: loaded with the gateway, never at run time (its models may be).
PIPELINE_FIXED = "'{name}' is a pipeline of the config: pipelines are not loaded or unloaded at run time"

log = logging.getLogger("gateway")
T = TypeVar("T")

# An executor of this node, or one of a worker's (a dispatcher of a cluster).
Executor = SupervisedExecutor | RemoteExecutor


class RequestFailed(RuntimeError):
    """A request that was accepted but could not be served; ``status`` is its HTTP status."""

    def __init__(
        self, message: str, status: int, outcome: str, headers: dict[str, str] | None = None, dispatched: float | None = None
    ):
        super().__init__(message)
        self.status, self.outcome, self.headers = status, outcome, headers or {}
        self.dispatched = dispatched  # the dispatch core began the request's batch (None: it never did)


@dataclass
class Result:
    outputs: dict[str, np.ndarray]
    executed_on: str
    batch_size: int
    queue_ms: float
    compute_ms: float
    executor: str = ""  # its id: "cpu-NAME", "gpu-N", or "HOST:PORT/..." on a worker
    timing: BatchTiming | None = None  # its batch's parts, for Triton's statistics
    rows: int = 1  # the request's own rows (Triton's inference count)
    started: float = 0.0  # the dispatch core started its batch (time.perf_counter)
    ended: float = 0.0  # the batch's outputs came back

    def parameters(self) -> dict[str, Any]:
        """What a response says of where and how its request ran (HTTP and gRPC alike)."""
        return {
            "executed_on": self.executed_on,
            "executor": self.executor,
            "batch_size": self.batch_size,
            "queue_ms": round(self.queue_ms, 3),
            "compute_ms": round(self.compute_ms, 3),
        }


def _servable(name: str, signature: dict[str, Any]) -> ModelSignature:
    """A model's signature as its executor read it; a model no client could use stops its start."""
    read = ModelSignature.from_json(signature)
    problem = read.problem()
    if problem is not None:
        raise ExecutorStartError(f"model '{name}' cannot be served: {problem}")
    return read


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Take a task's exception, so that asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


def _sizes(batches: list[int]) -> str:
    """Batch sizes for a log line: 1-32 where every size up to 32, else each ([1, 2, 4, ... 32])."""
    return f"batch 1-{batches[-1]}" if batches == list(range(1, len(batches) + 1)) and len(batches) > 2 else f"batch {batches}"


@dataclass
class ModelRuntime:
    config: ModelConfig
    sla_ms: float  # the config's, until the admin API changes it
    executors: list[SupervisedExecutor]  # its own, on the CPU: none for a GPU-only model
    gpu_executors: list[SupervisedExecutor] = field(default_factory=list)  # the node's, shared by every model
    signature: ModelSignature | None = None
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
    statistics: ModelStatistics = field(default_factory=ModelStatistics)  # Triton's, since start
    dispatch_batch: int = 0  # a planned CPU batch size; 0 until set: the config's
    # A version of a repository model: the name clients use and its version (None: the config's
    # name, version 1).
    served_as: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        self.dispatch_batch = self.dispatch_batch or self.config.dispatch_batch

    def close_window(self, now: float, served: Window, demanded: float, granted: float) -> None:
        """ROMA's violation (Section 5): the mean response time of a control window over the SLA,
        or the model's own measure of it (``sla_measure``: a percentile, every deadline)."""
        mean = served.mean_ms
        self.windows += 1
        violated = self.config.measure.violated(served, self.sla_ms)
        self.window_violations += violated
        self.history.append(
            {
                "t": round(now, 3),
                "requests": served.count,
                "mean_rt_ms": mean,
                "sla_ms": self.sla_ms,
                "demanded_cores": round(demanded, 4),
                "cores": round(granted, 4),
                "cpu_s": round(served.cpu_s, 4),  # CPU time its executors used in the period
                "violation": violated,
            }
        )

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def served_name(self) -> str:
        return self.served_as[0] if self.served_as else self.config.name

    @property
    def version(self) -> str:
        return self.served_as[1] if self.served_as else "1"

    @property
    def ready(self) -> bool:
        """A model with a CPU executor is ready when it is (the GPUs only take what they can
        finish in time); a GPU-only model when one of the GPU executors is."""
        return any(e.ready for e in self.executors or self.gpu_executors)

    @property
    def serving_executors(self) -> list[SupervisedExecutor]:
        """Every executor that may run the model: its CPU executor, if any, then the GPUs."""
        return self.executors + self.gpu_executors

    @property
    def datatypes(self) -> dict[str, str]:
        assert self.signature is not None
        return {t.name: t.datatype for t in self.signature.outputs}


class Engine:
    def __init__(self, config: GatewayConfig, metrics: GatewayMetrics, clock: Callable[[], float] = time.perf_counter):
        self.config = config
        # The config file's own models, kept when one is unloaded (config.models holds those served)
        # so that it can be loaded again.
        self.file_models = dict(config.models)
        # Models of the repository whose last load failed, and why (its index's reason).
        self.load_failures: dict[str, str] = {}
        self.metrics = metrics
        self.clock = clock
        # Triton's last_inference is wall-clock milliseconds: the engine's clock shifted once.
        self._epoch_offset_s = time.time() - clock()
        self._socket_dir = socket_folder("gateway")
        self._tasks: set[asyncio.Task[None]] = set()
        # Process executors get their cores through a cgroup (or affinity); containers through Docker.
        self.actuator: Actuator | None = None
        self.control: ControlLoop | None = None
        self.docker: DockerBackend | None = None
        self.executors: dict[str, SupervisedExecutor] = {}
        self.gpu_executors: list[SupervisedExecutor] = []
        self.gpu_scheduler = gpu_scheduler_of(config)
        self.core = dispatch_core_of(config, self.gpu_scheduler)
        self.models = {
            # Every model shares the list of the node's GPU executors, filled below.
            name: ModelRuntime(config=model, sla_ms=model.sla_ms, executors=[], gpu_executors=self.gpu_executors)
            for name, model in config.models.items()
        }
        self.cluster: Cluster | None = None
        self.node: NodeExecutors | None = None  # this node's executors (None on a dispatcher)
        # Models being unloaded (the repository extension): no longer served, their queues draining.
        self.unloading: dict[str, ModelRuntime] = {}
        # Executors of models being loaded: started and profiled before the dispatch core has them.
        self._starting: dict[str, SupervisedExecutor] = {}
        # Models whose reload is swapping the model it replaces for its successor: set when done.
        self._swaps: dict[str, asyncio.Event] = {}
        # A versioned model's own names (NAME.vN) while its versions load or unload: served under
        # NAME only, they are no client's names meanwhile either.
        self._changing_version_keys: set[str] = set()
        # Set once stop() begins: a model load it cuts short is answered 503, not loaded after it.
        self.stopping = False
        self._repository_lock = asyncio.Lock()  # one load or unload at a time
        # Repository models served in several versions: name -> version -> the runtime's key.
        self.versions: dict[str, dict[str, str]] = {}
        self.pipelines: dict[str, PipelineRuntime] = {}  # built at start, once the models' signatures are known
        if config.cluster is not None:
            # A dispatcher: the executors are its workers', handed over as they connect.
            self.cluster = Cluster(
                config,
                on_executor=self._add_executor,
                on_ready_change=lambda e: self._on_executor_change(e.id),
                has_batch=self._has_batch,
                on_executor_gone=self._remove_executor,
                signature_differs=self._signature_differs,
            )
        else:
            node = build_node_executors(config, self._socket_dir, self._on_executor_change)
            self.actuator, self.docker = node.actuator, node.docker
            self.node = node
            for executor in node.by_id.values():
                self._add_executor(executor)
        self.gpu_cluster: GpuClusterWindow | None = None
        metrics.export_totals(self.totals, lambda: {gpu.id: gpu.restarts for gpu in self.gpu_executors})
        self._ids = itertools.count(1)
        self._futures: dict[int, asyncio.Future[Result]] = {}
        # Per batch: its requests' outputs (or own errors), and its runs on the executor: one, the
        # batch's, or one per request where they ran one at a time (_run_each_alone; None: not run).
        self._outputs: dict[int, tuple[list[dict[str, np.ndarray] | RequestFailed], list[BatchTiming | None]]] = {}
        # Per GPU executor, up to when the live page has its busy time: a batch sent before the
        # one ahead of it ended (the default's pipelining) counts only from that end on.
        self._gpu_busy_shown: dict[str, float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._cpu_seen: dict[str, tuple[int | None, float]] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        # Work drain waits for beside the core's requests: pipelines' requests, repository changes.
        self._running_outside_core = 0
        # Per-second series for the live page (/ui), filled from the events below.
        self.live = LiveSeries()
        # Set once start() has profiled every model: a GPU ready after that (a worker with GPUs
        # that joined a dispatcher later) is profiled for the models that have no GPU profile.
        self._profiled = False
        self._gpu_profiling: set[str] = set()  # models being profiled on such a GPU

    def _add_executor(self, executor: Executor) -> None:
        """An executor of this node, or of a worker that connected: the dispatch core may use it
        once it is ready. A worker's CPU executor of a model this gateway does not serve is left out."""
        model = next(iter(executor.models)) if executor.device == "cpu" else None
        if model is not None and model not in self.models:
            return
        self.executors[executor.id] = executor
        if model is None:
            self.gpu_executors.append(executor)
            self.core.add_executor(executor.id, GPU)
        else:
            self.models[model].executors.append(executor)
            self.core.add_executor(executor.id, CPU, model)

    def _signature_differs(self, executor: Executor) -> str | None:
        """A model served here that ``executor`` (a worker's) holds with other inputs or outputs
        than the one served (a worker whose config points the name at another file): half the
        requests went to it and were refused 400 by its model. None before serving begins: the
        first executor ready gives each model its signature."""
        for name, signature in getattr(executor, "signatures", {}).items():
            runtime = self.models.get(name)
            if runtime is not None and runtime.signature is not None and ModelSignature.from_json(signature) != runtime.signature:
                return name
        return None

    def _remove_executor(self, executor: Executor) -> None:
        """An executor of a worker let go for good: forgotten, once the core has no batch of it
        left (a worker whose pod came back at another address left its executors behind, never
        ready, one set more at each such return)."""
        if executor.id not in self.executors:
            return
        if not self.core.remove_executor(executor.id):
            asyncio.get_running_loop().call_later(1.0, self._remove_executor, executor)
            return
        del self.executors[executor.id]
        self._cpu_seen.pop(executor.id, None)
        if executor in self.gpu_executors:
            self.gpu_executors.remove(executor)
        for runtime in self.models.values():
            if executor in runtime.executors:
                runtime.executors.remove(executor)
        self._gpu_busy_shown.pop(executor.id, None)

    @property
    def enforced_by(self) -> str:
        """How executors' cores are carried out."""
        if self.cluster is not None:
            return "workers"
        return self.actuator.name if self.actuator is not None else "docker-cpu-quota"

    @property
    def now(self) -> float:
        return self.clock()

    async def start(self) -> None:
        if self.cluster is not None:
            await self._start_cluster()
        else:
            await self._start_node()
        now = self.now
        for runtime in self.models.values():
            if runtime.signature is None:  # a dispatcher has its own file's (_start_cluster)
                first = next(e for e in runtime.serving_executors if e.ready)
                runtime.signature = _servable(runtime.name, first.signatures[runtime.name])
            self.metrics.sla_seconds.labels(runtime.name).set(runtime.sla_ms / 1000)
            for executor in runtime.executors:
                if self.cluster is None:  # a worker counts its own executors' cores
                    runtime.core_meters[executor.id] = CoreMeter(executor.enforced_cores, now)
                    self.metrics.cores.labels(runtime.name, executor.id).set(executor.cores)
                    self.metrics.enforced_cores.labels(runtime.name, executor.id).set(executor.enforced_cores)
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
            if not runtime.executors:
                log.info("model %s: no CPU executor (cpu_executor = false), served on the GPUs only", runtime.name)
        if self.cluster is not None:
            self.cluster.check_signatures()  # every model's is known now: the executors ready before
        if self.gpu_executors:
            self.gpu_cluster = GpuClusterWindow(self.now)
            self.metrics.export_scaling_signal(self.gpu_scaling_signal)
        # Pipelines once their models' signatures are known (their steps' outputs are checked).
        base = self.config.source.resolve().parent
        for name, table in self.config.pipelines.items():
            self.pipelines[name] = PipelineRuntime.build(name, table, self.models, base)
            log.info("pipeline %s: steps %s, SLA %g ms", name, " -> ".join(self.pipelines[name].graph.order), table.sla_ms)
        await self._profile()
        self._profiled = True
        # Every model's and pipeline's series on /metrics from the start, at 0, as Triton shows a
        # loaded model's counters: one of the config had none until its first request, where a
        # model loaded at run time had them from its load.
        for name in [*self.models, *self.pipelines]:
            self.metrics.for_model(name)
        for gpu in self.gpu_executors:  # one that came up while the models were being profiled
            if gpu.ready:
                self._profile_late_gpu(gpu)
        if self.control is not None:
            self.control.start()
            control = self.config.control
            log.info(
                "CPU control: policy %s, period %g s, cores enforced by %s", control.policy, control.period_s, self.enforced_by
            )

    async def _start_cluster(self) -> None:
        """Find the workers and wait until each model has a ready executor among theirs."""
        assert self.cluster is not None
        await self.cluster.start()
        # What is served is the dispatcher's own file: a worker whose config points the name at
        # another file is refused from its first hello. Taken from the first worker to answer,
        # such a worker set what was served, and the workers holding the dispatcher's file were
        # refused. A file this process cannot open: the first worker's, as before.
        for runtime in self.models.values():
            try:
                runtime.signature = _servable(runtime.name, await asyncio.to_thread(file_signature, runtime.config.path))
            except Exception as error:
                log.warning(
                    "model %s: %s cannot be opened here (%s): served as its first worker has it",
                    runtime.name,
                    runtime.config.path,
                    error,
                )
        self.cluster.check_signatures()

        def serving(name: str) -> bool:
            return any(e.ready for e in self.models[name].serving_executors)

        try:
            await self.cluster.wait_until_serving(list(self.models), serving)
        except BaseException:
            await self.cluster.stop()
            raise

    async def _start_node(self) -> None:
        """Start this node's executors under the control loop."""
        if self.docker is not None:
            await asyncio.to_thread(self.docker.connect)  # raises DockerUnavailable with the fix
        self.control = ControlLoop(
            self.config,
            measure=self._measure,
            set_cores=lambda name, cores: self.set_cores(self.models[name], cores),
            on_period=self._on_period,
            sla_ms=lambda name: self.models[name].sla_ms,
            clock=self.clock,
        )
        for name, cores in self.control.initial_cores.items():
            for executor in self.models[name].executors:
                executor.cores = cores
        executors = list(self.executors.values())
        results = await asyncio.gather(*(e.start() for e in executors), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            await self.stop()
            raise failures[0]

    async def _profile(self) -> None:
        """Seed each model's latency profiles with a short profiling run on each kind of device,
        then hand the model to the dispatch core."""
        for runtime in self.models.values():
            await self._profile_model(runtime)
            self._join_core(runtime)
        for executor in self.gpu_executors:
            warmed = [f"{n} {_sizes(w['batches'])} in {w['ms']:.0f} ms" for n, w in executor.warmed.items() if w.get("batches")]
            log.info(
                "GPU executor %s on %s (pid %s, provider %s%s%s)",
                executor.id,
                executor.device,
                executor.pid,
                executor.provider,
                ", emulated" if executor.emulate else "",
                f", warmed up: {', '.join(warmed)}" if warmed else "",
            )

    async def _profile_model(self, runtime: ModelRuntime) -> None:
        """Seed the model's latency profiles with a short profiling run on each kind of device that
        serves it."""
        assert runtime.signature is not None
        if runtime.signature.batchable and runtime.config.max_batch_size > 1:
            checker = next((e for e in runtime.executors if e.ready), None)
            if checker is not None:
                hang_s = runtime.config.hang_timeout_s
                reason = await why_stacking_changes_results(checker, runtime.name, runtime.signature, hang_s)
            else:  # served by GPUs alone: checked here, not where the dispatch core counts what a GPU holds
                hang_s = runtime.config.hang_timeout_s
                reason = await why_stacking_changes_results_here(runtime.name, runtime.config.path, runtime.signature, hang_s)
            if reason is not None:
                log.warning("model %s: served one request at a time: batching changes results (%s)", runtime.name, reason)
                runtime.signature = runtime.signature.unstacked()
                runtime.dispatch_batch = 1  # a planned batch of more would only hold requests back
        if runtime.executors:
            cpu = next((e for e in runtime.executors if e.ready), runtime.executors[0])
            runtime.cpu_profile = await profile_executor(cpu, runtime.name, runtime.signature, runtime.config)
            log.info(
                "model %s: CPU profile l(b) = %.3f b + %.3f ms",
                runtime.name,
                runtime.cpu_profile.per_item_ms,
                runtime.cpu_profile.fixed_ms,
            )
        if runtime.gpu_executors:
            gpu = next((g for g in runtime.gpu_executors if g.ready), runtime.gpu_executors[0])
            runtime.gpu_profile = await self._gpu_profile(runtime, gpu)
            log.info(
                "model %s: GPU profile l(b) = %.3f b + %.3f ms%s",
                runtime.name,
                runtime.gpu_profile.per_item_ms,
                runtime.gpu_profile.fixed_ms,
                " (emulated)" if gpu.emulate else "",
            )

    def _join_core(self, runtime: ModelRuntime) -> None:
        """Hand the profiled model to the dispatch core."""
        self.core.add_model(
            runtime.name,
            sla_ms=runtime.sla_ms,
            max_batch=batch_limit(runtime.config, runtime.signature.batchable),
            max_queue_size=runtime.config.max_queue_size,
            drop_late=runtime.config.drop_late,
            cpu_profile=runtime.cpu_profile,
            gpu_profile=runtime.gpu_profile,
            dispatch_batch=runtime.dispatch_batch,
            priority_levels=runtime.config.priority_levels,
            priority_bound_ms=runtime.config.priority_bound,
        )

    # -- models loaded and unloaded at run time (the repository extension) ----------------------
    async def load_versions(self, name: str, models: dict[str, ModelConfig]) -> None:
        """A repository model's versions (version -> its config, keyed ``NAME.vN``), served side by
        side under ``name``: ``/versions/N`` chooses one, the highest by default."""
        await self._repository_change(self._load_versions(name, models))

    async def load_model(self, model: ModelConfig) -> ModelRuntime:
        """Start ``model``'s CPU executor, profile it, and serve it: in the dispatch core, and in
        the node supervisor's arithmetic of cores. A model served already is unloaded first (a
        reload). The model is served only once it is ready; until then its requests get 404."""
        return await self._repository_change(self._load_named_model(model))

    async def unload_model(self, name: str, timeout_s: float = 30.0) -> None:
        """Stop serving ``name``: new requests get 404 at once; those accepted finish (for at most
        ``timeout_s``, then the queued ones are answered 503); its executor stops and its cores go
        back to the other models."""
        await self._repository_change(self._unload_named_model(name, timeout_s))

    def _version_keys(self) -> set[str]:
        """The runtimes' own names of repository models' versions (``NAME.vN``): no client's name."""
        return {key for keys in self.versions.values() for key in keys.values()} | self._changing_version_keys

    async def _repository_change(self, change: Coroutine[Any, Any, T]) -> T:
        """Carry out one load or unload at a time, each to its end even when its client leaves:
        two loads of one model at once started two executors of the same id on one socket, and an
        unload whose handler was cancelled half-way left its model neither served nor removable."""
        task = asyncio.ensure_future(self._one_change_at_a_time(change))
        task.add_done_callback(_retrieve)  # where its client left, no one else awaits it
        # Drained as a request is: SIGTERM waits for a load in progress, as for an inference.
        self._running_outside_core += 1
        self._idle.clear()
        task.add_done_callback(self._change_ended)
        return await asyncio.shield(task)

    def _change_ended(self, task: asyncio.Task[Any]) -> None:
        self._running_outside_core -= 1
        self._settle_idle()

    async def _one_change_at_a_time(self, change: Coroutine[Any, Any, T]) -> T:
        async with self._repository_lock:
            return await change

    async def _load_named_model(self, model: ModelConfig) -> ModelRuntime:
        # A repository model's version is served as NAME.vN, a name a model may have too: loaded
        # under it, one would replace the other.
        if model.name in self._version_keys():
            owner = next((n for n, keys in self.versions.items() if model.name in keys.values()), "being loaded")
            raise InvalidRequest(f"'{model.name}' is the name of a version of model '{owner}': rename the model")
        if model.name in self.versions:
            # Served in versions until now (its folder has a config.toml now, say): they are
            # unloaded first, as before versions load. Left, they went on serving its name beside
            # a runtime of that name that no request reached.
            await self._unload_model(model.name)
        return await self._load_model(model)

    async def _unload_named_model(self, name: str, timeout_s: float) -> None:
        if name in self._version_keys():  # unloaded with its model, not by the name it runs under
            raise InvalidRequest(self.not_served(name, None), status=404)
        if name in self.pipelines:  # was "unknown model 'p'; served models: ..., p"
            raise InvalidRequest(PIPELINE_FIXED.format(name=name))
        await self._unload_model(name, timeout_s)

    async def _load_versions(self, name: str, models: dict[str, ModelConfig]) -> None:
        if name in self.pipelines:  # its versions would be served under the pipeline's name
            raise InvalidRequest(PIPELINE_FIXED.format(name=name))
        own = set(self.versions.get(name, {}).values())
        taken = sorted(m.name for m in models.values() if m.name in self.models and m.name not in own)
        if taken:
            raise InvalidRequest(f"model '{taken[0]}' is served: a version of '{name}' would take its name; rename one")
        if name in self.models or name in self.versions:
            await self._unload_model(name)
        loaded: dict[str, str] = {}
        keys = {model.name for model in models.values()}
        self._changing_version_keys |= keys
        try:
            for version, model in sorted(models.items(), key=lambda item: int(item[0])):
                runtime = await self._load_model(model)
                runtime.served_as = (name, version)
                loaded[version] = model.name
        except BaseException:
            for key in loaded.values():
                await self._unload_model(key)
            raise
        else:
            self.versions[name] = loaded
        finally:
            self._changing_version_keys -= keys

    def served_names(self) -> list[str]:
        """The names clients use: models (a versioned one once) and pipelines."""
        versioned = self._version_keys()
        models = {n for n in self.models if n not in versioned and n not in self.unloading}
        return sorted({*models, *self.versions, *self.pipelines})

    def versions_of(self, runtime: ModelRuntime | PipelineRuntime) -> list[str]:
        served_as = getattr(runtime, "served_as", None)
        return sorted(self.versions[served_as[0]], key=int) if served_as else ["1"]

    def not_served(self, name: str, version: str | None) -> str:
        """Why ``resolve(name, version)`` found nothing, for the 404: a version the model does not
        have (naming the versions it has), or a name not served (naming those that are)."""
        served = self.served(name, None)
        if version and served is not None:
            return f"model '{name}' has no version '{version}'; served versions: {', '.join(self.versions_of(served))}"
        return f"unknown model '{name}'; served models: {', '.join(self.served_names())}"

    def served(self, name: str, version: str | None) -> ModelRuntime | PipelineRuntime | None:
        """What a client's ``name`` at ``version`` (None: the default) reaches: a model, or a
        pipeline (served as a model of the one version "1"); None when nothing is served so."""
        runtime = self.resolve(name, version)
        return runtime if runtime is not None or version not in (None, "1") else self.pipelines.get(name)

    def listed_models(self) -> dict[str, ModelRuntime]:
        """Every model ``listed`` reaches, by key (GET /admin/models and the live data)."""
        return {key: runtime for key, runtime in self.models.items() if self.listed(key) is not None}

    def listed(self, key: str) -> ModelRuntime | None:
        """The model that GET /admin/models lists under ``key``, a version's own ``NAME.vN``
        among them (the admin API's one way to each version), or None: unknown, or being
        loaded or unloaded."""
        runtime = self.models.get(key)
        changing = key in self.unloading or key in self._changing_version_keys
        return runtime if runtime is not None and not changing else None

    def resolve(self, name: str, version: str | None) -> ModelRuntime | None:
        """The runtime that serves ``name`` at ``version`` (None: the default), or None."""
        versions = self.versions.get(name)
        if versions is not None:
            key = versions.get(version) if version else versions[max(versions, key=int)]
        elif version in (None, "1") and not ((self.versions or self._changing_version_keys) and name in self._version_keys()):
            key = name
        else:
            return None
        runtime = self.models.get(key) if key is not None else None
        return runtime if runtime is not None and key not in self.unloading else None

    async def _load_model(self, model: ModelConfig) -> ModelRuntime:
        if self.node is None or self.control is None:
            raise InvalidRequest("models are loaded at run time only by a gateway that serves alone, not by a dispatcher")
        if model.cpu is None:
            raise InvalidRequest(f"model '{model.name}': a model loaded at run time is served by its CPU executor")
        if model.name in self.pipelines:
            raise InvalidRequest(PIPELINE_FIXED.format(name=model.name))
        # A reload, as Triton's: the served model goes on serving while its successor starts and
        # is profiled, and is unloaded only once that is ready. A reload that fails leaves it as
        # it was (unloaded first, a model whose file had been replaced by a broken one was
        # served no more, and its requests got 404).
        replaced = self.models.get(model.name)
        if replaced is not None:
            self._check_unloadable(model.name)
        # Its cores come out of the other models' grants before it starts: the node's grants
        # never add up past its cores while it starts and is profiled (refused, nothing is left).
        aside = self.control.set_aside(model.cpu.cores, model.cpu.min_cores, reloading=replaced is not None)
        runtime = ModelRuntime(config=model, sla_ms=model.sla_ms, executors=[], gpu_executors=[])
        executor = self.node.cpu_executor(model, self._socket_dir, self._on_executor_change, self._free_executor_id(model.name))
        runtime.executors.append(executor)
        executor.cores = aside
        # Stopped by stop() as the served ones are, yet no executor of the dispatch core's until
        # the model joins it (a reload's would have taken batches of the model it replaces).
        self._starting[executor.id] = executor
        try:
            await executor.start()
            runtime.signature = _servable(model.name, executor.signatures[model.name])
            await self._profile_model(runtime)
            if self.stopping:  # its profiling failed quietly when stop() stopped its executor
                raise ExecutorStartError(f"executor {executor.id} was stopped while it was profiled")
            if replaced is not None:
                # The swap: requests that arrive while the model it replaces drains wait for the
                # successor (``settled``); they got 404.
                self._swaps[model.name] = asyncio.Event()
                await self._unload_model(model.name)
                # stop() came while the model it replaces drained: its executor is stopped too
                # (joined after stop(), the model was answered 200 and served by no one).
                if self.stopping:
                    raise ExecutorStartError(f"executor {executor.id} was stopped while the model it replaces was unloaded")
        except BaseException as error:
            self._end_swap(model.name)  # its waiters first: answered, not held while it stops
            try:
                await executor.stop()
            finally:
                del self._starting[executor.id]
                self.control.give_back(aside)  # once its executor has stopped, as an unload's cores
            if self.stopping and isinstance(error, Exception):  # an executor stopped before it started, say
                raise InvalidRequest(f"the gateway is shutting down: model '{model.name}' was not loaded", 503) from None
            raise
        try:
            self._serve(runtime, executor, aside)
        finally:
            self._end_swap(model.name)  # whatever happened, no request waits for the swap past it
        done = "reloaded" if replaced is not None else "loaded"
        log.info("model %s: %s (executor %s, pid %s)", model.name, done, executor.id, executor.pid)
        return runtime

    def _serve(self, runtime: ModelRuntime, executor: SupervisedExecutor, aside: float) -> None:
        """A loaded model's executor to the dispatch core, its model to the core and the control."""
        model, now = runtime.config, self.now
        del self._starting[executor.id]
        self.executors[executor.id] = executor
        self.core.add_executor(executor.id, CPU, model.name)
        self._join_core(runtime)
        runtime.core_meters[executor.id] = CoreMeter(executor.enforced_cores, now)
        self.config.models[model.name] = model
        self.models[model.name] = runtime
        self.metrics.sla_seconds.labels(model.name).set(model.sla_ms / 1000)
        self.control.add_model(model, set_aside=aside)
        self._carry_out(self.core.set_executor_ready(executor.id, executor.ready, now), model.name)

    def _end_swap(self, name: str) -> None:
        swap = self._swaps.pop(name, None)
        if swap is not None:
            swap.set()

    async def settled(self, name: str) -> None:
        """Wait while a reload swaps model ``name``: the model it replaces draining (unloading),
        its successor not yet served. A request that arrives then is served by the successor;
        where the gateway's shutdown cut the reload short, it is refused 503 (it got 404, "unknown
        model", for a model served until the shutdown)."""
        swap = self._swaps.get(name)
        if swap is not None:
            await swap.wait()
            if self.stopping:
                raise InvalidRequest(f"the gateway is shutting down: model '{name}' was being reloaded", 503)

    def _free_executor_id(self, name: str) -> str:
        """The CPU executor id of model ``name``: ``cpu-NAME``, or ``cpu-NAME~2`` while a reload
        starts beside the executor that holds it (two of one id would share a socket and cgroup;
        a model's name has no ``~``)."""
        first = cpu_executor_id(name)
        return first if first not in self.executors else f"{first}~2"

    def _check_unloadable(self, name: str) -> None:
        """Refuse (400) to unload ``name`` where it cannot be: a pipeline's step, or a model on the
        GPUs or a cluster's workers."""
        users = [p for p, pipeline in self.pipelines.items() if any(s.model == name for s in pipeline.graph.table.steps)]
        if users:
            raise InvalidRequest(f"model '{name}' is a step of pipeline(s) {', '.join(users)}: it cannot be unloaded")
        if self.control is None or self.core.models[name].on_gpus:
            raise InvalidRequest(f"model '{name}' runs on the GPUs or a cluster's workers: only CPU models unload at run time")

    async def _unload_model(self, name: str, timeout_s: float = 30.0) -> None:
        if name in self.versions:
            keys = set(self.versions.pop(name).values())
            self._changing_version_keys |= keys
            try:
                for key in sorted(keys):
                    await self._unload_model(key, timeout_s)
            finally:
                self._changing_version_keys -= keys
            return
        runtime = self.models.get(name)
        if runtime is None or name in self.unloading:
            raise InvalidRequest(self.not_served(name, None), status=404)
        self._check_unloadable(name)
        # Served no more (404), yet kept for the requests already accepted until they end.
        self.unloading[name] = runtime
        try:
            deadline = time.perf_counter() + timeout_s
            while self.core.busy(name) and time.perf_counter() < deadline:
                await asyncio.sleep(0.02)
            self._carry_out(self.core.drop_queue(name, f"model '{name}' was unloaded before this request ran"), name)
            if self.core.busy(name):
                # A batch still running (hung, say): its requests are answered 503 now and its
                # executors stopped, whose failure ends it. Waited for, it held the unload and its
                # requests until its hang timeout (10 SLAs by default), past the promised 30 s.
                message = f"model '{name}' was unloaded while this request ran ({timeout_s:g} s after the unload began)"
                self._carry_out(self.core.end_running(name, message), name)
                for executor in runtime.executors:
                    await executor.stop()
            while self.core.busy(name):  # the stopped executors' batches fail at once
                await asyncio.sleep(0.02)
            self.core.remove_model(name)
            try:
                for executor in runtime.executors:
                    await executor.stop()
                    self.executors.pop(executor.id, None)
                    self._cpu_seen.pop(executor.id, None)
            finally:
                # Its cores go to the others once its executors have stopped: handed over before,
                # the node's quotas added up past its cores (2.4-2.8 on a node of 2) while they
                # stopped. A stop that failed (the Docker daemon's error) still hands them over.
                self.control.remove_model(name)
            self.config.models.pop(name, None)
            del self.models[name]
            self.metrics.forget(name, [(e.id, e.device) for e in runtime.executors])
            self.live.forget(name)  # a reload starts its seconds anew, as its statistics and /metrics do
        finally:
            del self.unloading[name]
        log.info("model %s: unloaded", name)

    async def stop(self) -> None:
        self.stopping = True
        if self._timer is not None:
            self._timer.cancel()
        if self.control is not None:
            await self.control.stop()
        self._carry_out(self.core.shutdown())
        if self.cluster is not None:
            await self.cluster.stop()
        executors = [*self.executors.values(), *self._starting.values()]
        await asyncio.gather(*(e.stop() for e in executors), return_exceptions=True)
        if self.docker is not None:
            self.docker.close()
        if self.actuator is not None:
            self.actuator.close()
        shutil.rmtree(self._socket_dir, ignore_errors=True)

    # -- requests ---------------------------------------------------------------------------
    def submit(self, runtime: ModelRuntime, request: InferRequest, arrival: float) -> asyncio.Future[Result]:
        """Hand a parsed request to the dispatch core; the future ends with a Result or a RequestFailed."""
        assert runtime.signature is not None
        if runtime.name in self.unloading or self.models.get(runtime.name) is not runtime or runtime.name not in self.core.models:
            # Its handler found it before an unload (or a reload, which serves a new runtime under the
            # name: its signature and limits may differ from those the request was read against)
            # began, and read its body meanwhile.
            raise RequestFailed(f"model '{runtime.served_name}' was unloaded before this request ran", 503, "unloaded")
        for name in runtime.signature.text_inputs:
            # ONNX Runtime's string tensors hold text: the executor turned each byte that is no
            # UTF-8 into U+FFFD and answered 200 on what the client never sent.
            if (index := first_non_text(request.inputs[name])) is not None:
                raise InvalidRequest(
                    f"input '{name}': element {index} is not UTF-8 text; a BYTES input of an ONNX model is a string "
                    "tensor, which holds UTF-8 text only (send binary data as UINT8)"
                )
        levels = runtime.config.priority_levels
        if request.priority > levels:
            raise InvalidRequest(
                f"parameter 'priority' is {request.priority}; model '{runtime.name}' has priority levels 1 to {levels} "
                "(priority_levels; 0: its default)"
            )
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        queued = Request(
            next(self._ids),
            runtime.name,
            arrival,
            rows=request.rows,
            batch_key=batch_key(request.inputs) if runtime.signature.batchable else (),
            timeout_s=request.timeout_us / 1e6 if request.timeout_us else None,
            priority=request.priority or runtime.config.default_level,
            payload=request,
            queued_at=self.now,
        )
        self._futures[queued.id] = future
        # A client that went away cancels its handler and so this future: the request leaves the
        # queue at once (or its result is discarded), and drain no longer waits for it.
        future.add_done_callback(lambda f, gone=queued: f.cancelled() and self._client_gone(gone))
        self._idle.clear()
        self._carry_out(self.core.on_arrival(queued, self.now), queued.model)
        return future

    async def answer(
        self, runtime: ModelRuntime | PipelineRuntime, request: InferRequest, arrival: float
    ) -> tuple[Result, dict[str, str]]:
        """Serve a parsed request on its model or pipeline, whichever protocol carried it: the
        result and its outputs' datatypes; a RequestFailed (a pipeline's step named) otherwise."""
        if isinstance(runtime, PipelineRuntime):
            # Its level is each step model's: one every step model has, or a 400 before any step.
            step_models = {s.model for s in runtime.graph.table.steps if s.model is not None}
            levels = min((self.models[m].config.priority_levels for m in step_models), default=1)
            if request.priority > levels:
                raise InvalidRequest(
                    f"parameter 'priority' is {request.priority}; pipeline '{runtime.name}''s models have priority "
                    f"levels 1 to {levels} (priority_levels; 0: each model's default)"
                )
            # Drained as a model's request is, between its steps and in its function steps too.
            self._running_outside_core += 1
            self._idle.clear()
            try:
                result = await runtime.run(self, request, arrival)
                # An execution of the pipeline, as Triton's ensemble scheduler counts each request
                # that succeeded (execution_count, last_inference, batch_stats).
                assert result.timing is not None
                runtime.statistics.executed(result.timing, round((self.now + self._epoch_offset_s) * 1000))
            except StepFailed as error:
                raise RequestFailed(str(error), error.status, error.outcome) from None
            finally:
                self._running_outside_core -= 1
                self._settle_idle()
            return result, runtime.datatypes_of(result.outputs)
        return await self.submit(runtime, request, arrival), runtime.datatypes

    @property
    def active(self) -> int:
        """Requests handed to the core, pipelines' requests and repository changes that have not
        ended yet (a pipeline's step in the core counts beside its pipeline)."""
        return len(self._futures) + self._running_outside_core

    async def drain(self, timeout_s: float) -> bool:
        """Wait until every accepted request has ended, at most ``timeout_s``; whether they all did."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def received(self, runtime: ModelRuntime) -> None:
        """Account for an infer request that reached the model; ``record`` ends it."""
        runtime.received += 1
        series = self._series(runtime)
        if series is not None:
            series.received.inc()
            series.in_flight.inc()

    def _series(self, runtime: ModelRuntime | PipelineRuntime) -> ModelMetrics | None:
        """The model's series on /metrics, or None for a runtime no longer served: an unload drops
        its series (``forget``), and a request that was still arriving then must not bring them
        back (an in-flight gauge of -1, outcomes beside no arrival, kept across a reload)."""
        name = runtime.name
        if self.models.get(name) is not runtime and self.pipelines.get(name) is not runtime:
            return None
        return self.metrics.for_model(name)

    def record(self, runtime: ModelRuntime, outcome: str, arrival: float, result: Result | None = None) -> None:
        """Account for a request received at ``arrival`` that ended (``result`` given: it was served)."""
        runtime.outcomes[outcome] = runtime.outcomes.get(outcome, 0) + 1
        series = self._series(runtime)
        if series is not None:
            series.outcome(outcome).inc()
            series.in_flight.dec()
        now = self.now
        took_ns = round((now - arrival) * 1e9)
        if result is not None and result.timing is not None:
            runtime.statistics.succeeded(took_ns, round(result.queue_ms * 1e6), result.rows, result.timing)
            # Of the requests answered, as the statistics' queue. Counted where its batch ended, it
            # took in one whose client left before its answer was written (12 against 8 answered)
            # and one whose batch ended after its timeout. A pipeline waits in no queue of its own:
            # its steps' requests are counted under their models.
            if series is not None and self.pipelines.get(runtime.name) is not runtime:
                series.queue_seconds.observe(result.queue_ms / 1000)
        else:
            runtime.statistics.failed(took_ns)
        device = result.executed_on if result is not None else "cpu"
        rt_ms = (now - arrival) * 1000 if result is not None else None
        # Symphony's bad rate counts every request of a model the GPUs serve, wherever it ran.
        if self.gpu_cluster is not None and runtime.gpu_profile is not None:
            out_of_slo = ended_out_of_slo(outcome, rt_ms, runtime.sla_ms)
            if out_of_slo is not None:
                self.gpu_cluster.request_ended(now, out_of_slo)
        if series is not None:  # still served: an unloaded model's seconds are not brought back
            self.live.request_ended(runtime.name, now, outcome, rt_ms, runtime.sla_ms, device)
        if rt_ms is not None:
            if rt_ms > runtime.sla_ms and series is not None:
                series.violations.inc()
            runtime.times.observe(rt_ms, runtime.sla_ms)
            runtime.devices[device] = runtime.devices.get(device, 0) + 1
            # The CPU controllers regulate what their executor serves (ROMA Section 4).
            if device == "cpu":
                runtime.window.add(rt_ms)
            else:
                runtime.window.add_gpu(rt_ms)  # the other part of ROMA's tau_R (equation 1)
            if series is not None:
                series.request_seconds.observe(rt_ms / 1000)

    def set_sla(self, runtime: ModelRuntime, sla_ms: float) -> None:
        runtime.sla_ms = sla_ms
        if runtime.name in self.core.models:
            self.core.set_sla(runtime.name, sla_ms)
        if self.cluster is not None:
            self.cluster.set_sla(runtime.name, sla_ms)
        self.metrics.sla_seconds.labels(runtime.name).set(sla_ms / 1000)
        log.info("model %s: SLA set to %g ms", runtime.name, sla_ms)

    def set_dispatch_batch(self, runtime: ModelRuntime, rows: int) -> None:
        """A planned CPU batch size (Harpagon's batch-aware dispatch; 1: none), at most max_batch_size."""
        if runtime.config.cpu is None:  # accepted, it changed nothing: only CPU batches read it
            raise InvalidRequest(f"model '{runtime.name}' has no CPU executor (cpu_executor = false): no CPU batch to plan")
        limit = batch_limit(runtime.config, runtime.signature is not None and runtime.signature.batchable)
        if not 1 <= rows <= limit:
            raise InvalidRequest(
                f"dispatch_batch must be from 1 to model '{runtime.name}''s max_batch_size, {limit} (fixed at start)"
            )
        runtime.dispatch_batch = rows
        if runtime.name in self.core.models:
            self._carry_out(self.core.set_dispatch_batch(runtime.name, rows, self.now), runtime.name)
        log.info("model %s: dispatch_batch set to %d", runtime.name, rows)

    def set_replicas(self, runtime: ModelRuntime, replicas: int | None) -> None:
        """How many workers run the model's CPU executor (None: every worker that holds it)."""
        if self.cluster is None:
            raise InvalidRequest(
                "replicas are for a dispatcher of a cluster ([cluster] in its config); this gateway serves alone"
            )
        if runtime.config.cpu is None:
            raise InvalidRequest(f"model '{runtime.name}' has no CPU executor (cpu_executor = false): it has no replicas")
        self.cluster.set_replicas(runtime.name, replicas)
        log.info("model %s: replicas set to %s", runtime.name, "every worker" if replicas is None else replicas)

    def set_cores(self, runtime: ModelRuntime, cores: float) -> None:
        now = self.now
        for executor in runtime.executors:
            if abs(executor.cores - cores) > 1e-6:
                executor.set_cores(cores)
            # Core-seconds count what is enforced (the CFS floor, affinity's whole CPUs), not the grant.
            runtime.core_meters[executor.id].set(executor.enforced_cores, now)
            self.metrics.cores.labels(runtime.name, executor.id).set(cores)
            self.metrics.enforced_cores.labels(runtime.name, executor.id).set(executor.enforced_cores)

    def gpu_scaling_signal(self) -> ScalingSignal:
        """Symphony's autoscaling signals of the node's GPUs over the last period (Section 4.4)."""
        assert self.gpu_cluster is not None
        now, gpus = self.now, len(self.gpu_executors)
        return scaling_signal(gpus, self.gpu_cluster.bad_rate(now), self.gpu_cluster.idle_fraction(now, gpus))

    def totals(self) -> list[ModelTotals]:
        """What each model has counted since start, for /metrics."""
        return [
            ModelTotals(
                model=runtime.name,
                core_seconds=self.core_seconds(runtime),
                window_violations=runtime.window_violations,
                restarts={executor.id: executor.restarts for executor in runtime.executors},
            )
            for runtime in self.models.values()
        ]

    def _statistics_kept(self) -> list[ModelRuntime | PipelineRuntime]:
        """Every model and pipeline whose statistics clients may read (not one being unloaded)."""
        return [r for r in [*self.models.values(), *self.pipelines.values()] if r.name not in self.unloading]

    def triton_totals(self) -> list[TritonTotals]:
        """What Triton's nv_inference_* series read, per model version and pipeline, for /metrics."""
        return [
            TritonTotals(
                model=runtime.served_name,
                version=runtime.version,
                statistics=runtime.statistics,
                pending=self.core.queue_length(runtime.name) if runtime.name in self.core.models else 0,
            )
            for runtime in self._statistics_kept()
        ]

    def triton_statistics(self, runtime: ModelRuntime | PipelineRuntime | None, every_version: bool) -> list[dict[str, Any]]:
        """Triton's statistics extension: the ``$model_stat`` of ``runtime`` (None: of everything
        served), under the name and version clients use; with ``every_version``, of each version of
        its model, as Triton answers a request that names no version."""
        if runtime is None:
            runtimes = self._statistics_kept()
        elif every_version and isinstance(runtime, ModelRuntime) and runtime.served_as:
            keys = self.versions.get(runtime.served_as[0], {}).values()
            runtimes = [self.models[key] for key in keys if key in self.models and key not in self.unloading]
        else:
            runtimes = [runtime]
        stats = [r.statistics.to_triton(r.served_name, r.version) for r in runtimes]
        return sorted(stats, key=lambda stat: (stat["name"], int(stat["version"])))

    def core_seconds(self, runtime: ModelRuntime) -> float:
        now = self.now
        return sum(meter.total(now) for meter in runtime.core_meters.values())

    # -- what the control loop measures ----------------------------------------------------
    def _measure(self) -> dict[str, Window]:
        """Per model with a CPU executor, what it did since the last call, and the work still waiting for it."""
        now = self.now
        windows = {}
        for name, runtime in self.models.items():
            if not runtime.executors:
                continue  # a GPU-only model: no cores to control
            window, runtime.window = runtime.window, Window()
            window.cpu_s = sum(self._cpu_used(executor) for executor in runtime.executors)
            if name in self.core.models:
                window.waiting, window.oldest_wait_ms = self.core.cpu_backlog(name, now)
            windows[name] = window
        for executor in self.gpu_executors:
            self._cpu_used(executor)  # GPU executors' CPU is reported apart from the models' core-seconds
        return windows

    def _cpu_used(self, executor: SupervisedExecutor) -> float:
        """CPU seconds the executor used since the last call (0 across a restart: a new process)."""
        total = executor.cpu_seconds()
        previous = self._cpu_seen.get(executor.id)
        if total is None:
            return 0.0
        self.metrics.executor_cpu_seconds.labels(executor.id, executor.device).set(total)
        self._cpu_seen[executor.id] = (executor.pid, total)
        return cpu_seconds_since(previous, executor.pid, total)

    def _on_period(self, now: float, allocations: Mapping[str, Allocation], windows: Mapping[str, Window]) -> None:
        for name, allocation in allocations.items():
            self.models[name].close_window(now, windows[name], allocation.demanded, allocation.granted)
        periods = {name: PeriodOf(a.demanded, a.granted, windows[name].cpu_s) for name, a in allocations.items()}
        self.live.control_period(now, self.config.control.period_s, periods, {n: r.sla_ms for n, r in self.models.items()})
        if self.gpu_cluster is not None:
            signal = self.gpu_scaling_signal()
            self.live.gpu_signals(now, signal.bad_rate, signal.idle_fraction)

    # -- carrying out the core's actions -----------------------------------------------------
    def _has_batch(self, executor_id: str) -> bool:
        executor = self.core.executors.get(executor_id)
        return executor is not None and executor.last is not None

    def _on_executor_change(self, executor_id: str) -> None:
        executor = self.executors.get(executor_id)
        if executor is None:
            return  # a worker's executor forgotten (its worker let go)
        ready = executor.ready
        memory = self.core.gpu_memory
        if not ready and memory is not None:
            # A GPU executor that went down lost the models it held: unloaded, as the core forgets
            # them (else the loads it counts again on its return outnumber what a GPU can hold).
            for model in memory.held.get(executor_id, ()):
                self.metrics.gpu_model_unloads.labels(executor_id, model).inc()
        self._carry_out(self.core.set_executor_ready(executor_id, ready, self.now))
        if ready and executor.device != CPU and self._profiled:
            self._profile_late_gpu(executor)

    @staticmethod
    async def _gpu_profile(runtime: ModelRuntime, gpu: SupervisedExecutor) -> LatencyProfile:
        """The model's l(b) on ``gpu``: an emulated GPU's from its profile, a real one's measured."""
        if gpu.emulate:
            return LatencyProfile(*gpu.emulate[runtime.name])
        assert runtime.signature is not None
        return await profile_executor(gpu, runtime.name, runtime.signature, runtime.config)

    def _profile_late_gpu(self, gpu: SupervisedExecutor) -> None:
        """Profile ``gpu`` for each model served without a GPU profile, then hand the model to
        the GPU scheduler: a dispatcher profiles its models once, at start, and a worker with
        GPUs that connected after that was never given a request."""
        for runtime in self.models.values():
            name = runtime.name
            if runtime.gpu_profile is not None or name in self._gpu_profiling or name in self.unloading:
                continue
            if gpu not in runtime.gpu_executors:
                continue  # a model loaded at run time: its CPU executor alone serves it, the GPUs do not hold it
            if gpu.emulate and name not in gpu.emulate:
                continue  # an emulated GPU holds only the models of its profile
            self._gpu_profiling.add(name)
            task = asyncio.create_task(self._add_gpu_profile(runtime, gpu))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _add_gpu_profile(self, runtime: ModelRuntime, gpu: SupervisedExecutor) -> None:
        try:
            profile = await self._gpu_profile(runtime, gpu)
            if self.models.get(runtime.name) is not runtime or runtime.gpu_profile is not None:
                return  # unloaded (or loaded again, and profiled) meanwhile
            runtime.gpu_profile = profile
            log.info(
                "model %s: GPU profile l(b) = %.3f b + %.3f ms on %s, which came up after start",
                runtime.name,
                profile.per_item_ms,
                profile.fixed_ms,
                gpu.id,
            )
            if self.gpu_cluster is None:
                self.gpu_cluster = GpuClusterWindow(self.now)
                self.metrics.export_scaling_signal(self.gpu_scaling_signal)
            self._carry_out(self.core.add_gpu_profile(runtime.name, profile, self.now))
        finally:
            self._gpu_profiling.discard(runtime.name)

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, float("inf")
        self._carry_out(self.core.on_timer(self.now))

    def _carry_out(self, actions: Iterable[Action], model: str | None = None) -> None:
        """Carry out the core's actions; ``model``: one whose queue the event itself changed (an
        arrival, a client gone). The queue gauges of the models touched are set anew after."""
        touched = {model} if model is not None else set()
        for action in actions:
            if isinstance(action, Start):
                touched.add(action.batch.model)
                if action.batch.load is not None:
                    self._count_load(action.batch.load)
                task = asyncio.create_task(self._run_batch(action.batch))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                if action.batch.device == CPU:
                    self._cpu_work_started(self.models[action.batch.model])
            elif isinstance(action, Finish):
                self._finish(action)
            elif isinstance(action, Fail):
                for request in action.requests:
                    touched.add(request.model)
                    error = RequestFailed(action.message, action.status, action.outcome, dict(action.headers), request.dispatched)
                    self._settle(request.id, error=error)
            elif isinstance(action, WakeAt):
                self._wake_at(action.time)
        now = self.now
        for name in touched:
            if name in self.core.models:
                length = self.core.queue_length(name)
                self.metrics.for_model(name).queue_length.set(length)
                self.live.queue(name, now, length, self.models[name].sla_ms)

    def _count_load(self, load: Load) -> None:
        self.metrics.gpu_model_loads.labels(load.gpu, load.model).inc()
        for victim in load.evict:
            self.metrics.gpu_model_unloads.labels(load.gpu, victim).inc()
        evicted = f", UNLOAD {', '.join(load.evict)}" if load.evict else ""
        log.info("GPU %s: LOAD %s (%g ms)%s", load.gpu, load.model, load.load_ms, evicted)

    def _cpu_work_started(self, runtime: ModelRuntime) -> None:
        """A CPU executor started a batch: work is reaching it, from the clients or spilled by
        the GPUs (the spill is an arrival rate of the CPU executor too). Its controller hears of
        it now, not at the period's end (the control loop asks it at most ten times a period)."""
        if self.control is None:
            return

        def so_far() -> Window:
            done = runtime.window
            window = Window(done.count, done.total_ms, gpu_count=done.gpu_count, gpu_total_ms=done.gpu_total_ms)
            window.waiting, window.oldest_wait_ms = self.core.cpu_backlog(runtime.name, self.now)
            return window

        self.control.react(runtime.name, so_far)

    def _wake_at(self, when: float) -> None:
        if when >= self._timer_at or when == float("inf"):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = asyncio.get_running_loop().call_later(max(0.0, when - self.now), self._on_timer)

    def _client_gone(self, request: Request) -> None:
        self._settle(request.id)
        self._carry_out(self.core.cancel(request, self.now), request.model)

    def _settle(self, request_id: int, result: Result | None = None, error: RequestFailed | None = None) -> None:
        future = self._futures.pop(request_id, None)
        if future is not None and not future.done():
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)
        self._settle_idle()

    def _settle_idle(self) -> None:
        """Idle (what drain waits for) once no request, pipeline or repository change is left."""
        if not self._futures and not self._running_outside_core:
            self._idle.set()

    async def _run_batch(self, batch: Batch) -> None:
        executor = self.executors[batch.executor]
        payloads = [r.payload for r in batch.requests]
        try:
            began = time.perf_counter()
            inputs = stack_inputs(payloads)
            stacked = time.perf_counter()
            outputs, compute_ms = await self._execute(executor, batch, inputs)
            answered = time.perf_counter()
            parts = split_outputs(outputs, payloads)
            # A LOAD of the model first (GPU memory as a cache) is none of the batch's parts: it
            # was counted as compute_output, 100 ms of "output" for a batch of 31 ms.
            load_s = batch.load.load_ms / 1000 if batch.load is not None else 0.0
            timing = BatchTiming.measured(
                batch.rows, stacked - began, max(0.0, answered - stacked - load_s), compute_ms, time.perf_counter() - answered
            )
        except BatchLate as late:
            self.metrics.late_actions.labels(batch.model).inc()
            log.debug("model %s: batch of %d on %s not run: %s", batch.model, batch.rows, executor.id, late)
            actions = self.core.on_batch_late(batch, self.now)
        except ExecutorFailed as error:
            message = f"executor {executor.id} failed: {error}"
            actions = self.core.on_batch_failed(batch, self.now, 503, EXECUTOR_FAILED, message)
        except (ModelError, ValueError) as error:
            if len(batch.requests) > 1:
                actions = await self._run_each_alone(executor, batch)
            else:
                message = f"model '{batch.model}' failed on this input: {error}"
                actions = self.core.on_batch_failed(batch, self.now, 400, "model_error", message)
        else:
            self._outputs[batch.id] = (parts, [timing])
            actions = self.core.on_batch_done(batch, compute_ms, self.now)
        self._carry_out(actions)

    async def _run_each_alone(self, executor: SupervisedExecutor, batch: Batch) -> list[Action]:
        """A batch of several requests that the model refused: each request runs alone on the
        same executor, so that a bad input fails its own request only. Failed together, every
        client was told that its input was bad, in words that carried another client's input.
        Where the executor fails partway, the requests run before are answered, the one it failed
        on ends 503, and those after it go back to their queue."""
        parts: list[dict[str, np.ndarray] | RequestFailed] = []
        # Each run is one execution of its own request's rows (Triton's statistics, the answer's
        # batch_size and compute_ms): counted as one batch of them all, every answer carried the
        # time of every run.
        runs: list[BatchTiming | None] = []
        compute_ms = 0.0
        try:
            for request in batch.requests:
                future = self._futures.get(request.id)
                if future is None or future.done():  # timed out or its client left meanwhile: not run for nothing
                    parts.append({})
                    runs.append(None)
                    continue
                sent = time.perf_counter()
                try:
                    outputs, ms = await self._execute(executor, batch, request.payload.inputs, again=True)
                except (ModelError, ValueError) as error:
                    message = f"model '{batch.model}' failed on this input: {error}"
                    parts.append(RequestFailed(message, 400, "model_error", dispatched=request.dispatched))
                    runs.append(None)
                else:
                    parts.append(outputs)
                    runs.append(BatchTiming.measured(request.rows, 0.0, time.perf_counter() - sent, ms, 0.0))
                    compute_ms += ms
        except ExecutorFailed as error:
            # The requests that ran before it failed are answered with what they got (all were
            # answered 503); the one it failed on ends 503 where it reached the executor (its own
            # input may have killed it); those after it go back to their queue (they ended 503 too).
            left = len(batch.requests) - len(parts)
            self._outputs[batch.id] = (parts + [{}] * left, runs + [None] * left)
            failed_on = 1 if error.reached else 0
            answered, unrun = batch.requests[: len(parts)], batch.requests[len(parts) + failed_on :]
            message = f"executor {executor.id} failed: {error}"
            actions = self.core.on_batch_failed(batch, self.now, 503, EXECUTOR_FAILED, message, answered, unrun)
            if not any(isinstance(a, Finish) and a.batch is batch for a in actions):
                self._outputs.pop(batch.id, None)  # none to answer: none ran, or the batch was taken back
            return actions
        self._outputs[batch.id] = (parts, runs)
        # The time of several runs of one request is no batch's l(b): the profiles learn nothing.
        return self.core.on_batch_done(batch, compute_ms, self.now, learn=False)

    async def _execute(
        self, executor: SupervisedExecutor, batch: Batch, inputs: dict[str, np.ndarray], again: bool = False
    ) -> tuple[dict[str, np.ndarray], float]:
        """Run the batch on its executor, which may begin it until its latest start; kill the
        executor if it hangs. A GPU is busy from the moment the batch is sent until its answer.
        ``again``: one request of a batch already run (``_run_each_alone``): past its latest
        start, and its model loaded by then."""
        hang_s = self.models[batch.model].config.hang_timeout_s
        if again:
            batch = dataclasses.replace(batch, latest_start=math.inf, load=None)
        if batch.load is not None:
            # The executor loads the model first: that time is no hang (a load longer than the
            # timeout had the GPU killed at each try, and every model lost it).
            hang_s += batch.load.load_ms / 1000
        busy = self.gpu_cluster if batch.device == GPU else None
        started = self.now
        if busy is not None:
            busy.batch_started(executor.id, started)
        try:
            waited_ms = [(batch.started - r.arrival) * 1000 for r in batch.requests]
            load = batch.load
            if load is not None:
                run = executor.infer(
                    batch.model,
                    inputs,
                    latest_start=batch.latest_start,
                    waited_ms=waited_ms,
                    load={"load_ms": load.load_ms, "unload": list(load.evict)},
                )
            else:
                run = executor.infer(batch.model, inputs, latest_start=batch.latest_start, waited_ms=waited_ms)
            if getattr(executor, "backend", None) == "remote":
                # Its worker times the batch from when it begins on the executor, and kills and
                # restarts a hung one (answering "failed"); a worker that dies or is cut off is
                # down after its heartbeat timeout, and its batches fail then. Timed here from
                # the send, a batch that waited on the worker behind another dispatcher's was
                # given up on (503) while the worker was running it.
                return await run
            return await asyncio.wait_for(run, hang_s)
        except TimeoutError:
            executor.kill_hung(f"no reply to a batch of {batch.rows} within {hang_s:g} s (hang_timeout_ms)")
            raise ExecutorFailed(f"it did not answer within {hang_s:g} s and was killed (hung)") from None
        finally:
            if busy is not None:
                ended = self.now
                busy.batch_ended(executor.id, ended)
                shown = max(started, self._gpu_busy_shown.get(executor.id, started))
                self._gpu_busy_shown[executor.id] = ended
                self.live.gpu_busy(executor.id, shown, ended)

    def _finish(self, action: Finish) -> None:
        batch = action.batch
        parts, runs = self._outputs.pop(batch.id)
        statistics, series = self.models[batch.model].statistics, self.metrics.for_model(batch.model)
        device = self.executors[batch.executor].device
        now = self.now
        # The batch as the dispatch core formed it (/metrics, the live page: how requests were
        # batched); Triton's statistics count executions, each run of a request alone one of them.
        series.batch_size.observe(batch.rows)
        series.compute_seconds.observe(sum(run.infer_ns for run in runs if run is not None) / 1e9)
        self.live.batch_done(batch.model, batch.executor, device, batch.rows, now)
        for run in runs:
            if run is not None:
                statistics.executed(run, round((now + self._epoch_offset_s) * 1000))
        live = {r.id for r in action.requests}
        for index, (request, part) in enumerate(zip(batch.requests, parts, strict=True)):
            # Triton's queue time: in the model's queue, not the body's upload and parsing before.
            queue_ms = (batch.started - request.entered_queue) * 1000
            if request.id in live and isinstance(part, RequestFailed):  # its own input refused (_run_each_alone)
                self._settle(request.id, error=part)
            elif request.id in live:
                run = runs[0] if len(runs) == 1 else runs[index]
                if run is None:  # not run: its future had ended (the core hears of it soon)
                    continue
                result = Result(
                    part, device, run.rows, queue_ms, run.infer_ns / 1e6, batch.executor, run, request.rows, batch.started, now
                )
                self._settle(request.id, result)

    def describe(self, runtime: ModelRuntime) -> dict[str, Any]:
        times = runtime.times
        return {
            "name": runtime.name,
            "sla_ms": runtime.sla_ms,
            "queue_length": self.core.queue_length(runtime.name) if runtime.name in self.core.models else 0,
            "max_batch_size": runtime.config.max_batch_size if runtime.signature and runtime.signature.batchable else 0,
            "dispatch_batch": runtime.dispatch_batch,
            "ready": runtime.ready,
            "pinned_cores": self.control.pinned.get(runtime.name) if self.control is not None else None,
            "executors": [e.describe() for e in runtime.serving_executors],
            "drop_late": runtime.config.drop_late,
            **(
                {
                    "replicas": {
                        "wanted": self.cluster.replicas.get(runtime.name),
                        "placed": self.cluster.placed.get(runtime.name, []),
                    }
                }
                if self.cluster is not None
                else {}
            ),
            "profiles": {
                device: {"per_item_ms": p.per_item_ms, "fixed_ms": p.fixed_ms, "measured_ms": p.measured()}
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
