"""Start, watch and restart one executor; the backends differ only in how they launch it.

A crashed executor is noticed twice: its connection ends (so the requests in flight fail at
once) and its process or container exits (so it is reaped and started again, with a backoff
that grows while it keeps crashing).
"""

from __future__ import annotations

import abc
import asyncio
import collections
import contextlib
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from executors.connection import ExecutorConnection, ExecutorFailed
from executors.limits import Actuator
from executors.names import safe_name

log = logging.getLogger("executors")

# How long a launch may go without saying hello or printing a line (a large model on a slow
# disk): a GPU executor opens a session per batch size and warms each up first, which for many
# large models takes longer, and it prints a line per model as it goes.
START_TIMEOUT_S = 120.0
# Restart backoff: first retry quickly, back off while it keeps failing, reset once it has run
# for a while. The values are the usual ones of process supervisors (systemd, supervisord).
RESTART_DELAY_S = 0.1
RESTART_DELAY_MAX_S = 5.0
STABLE_AFTER_S = 30.0


class ExecutorStartError(RuntimeError):
    """The executor never became ready; the message carries what it printed."""


def cpu_seconds_since(previous: tuple[int | None, float] | None, pid: int | None, total: float) -> float:
    """CPU seconds a process used since ``previous`` (its pid and ``cpu_seconds`` then): 0 on a
    first reading or across a restart (a new process), and never below 0 (the first report
    after the kernel's 10 ms ticks may read a hair below them)."""
    if previous is None or previous[0] != pid:
        return 0.0
    return max(0.0, total - previous[1])


class SupervisedExecutor(abc.ABC):
    """One executor (one OS process or container) and its connection, restarted when it dies."""

    backend: str = "abstract"

    def __init__(
        self,
        executor_id: str,
        models: dict[str, Path],
        *,
        device: str,
        threads: int,
        cores: float,
        socket_dir: Path,
        actuator: Actuator | None = None,
        emulate: dict[str, tuple[float, float]] | None = None,
        emulate_zeros: bool = False,
        memory_mb: float | None = None,
        on_change: Callable[[], None] = lambda: None,
        model_cache: bool = False,
        gpu_batches: Mapping[str, int] | None = None,
        warmup: bool = False,
        fixed_batch_shapes: bool = False,
        cudnn_conv_algo_search: str = "EXHAUSTIVE",
    ) -> None:
        self.id = executor_id
        self.models = models
        self.device = device
        self.threads = threads
        self.cores = cores
        self.on_change = on_change
        self.actuator = actuator
        self.emulate = emulate or {}
        self.emulate_zeros = emulate_zeros
        self.memory_mb = memory_mb
        # A GPU executor whose memory is a cache of models: it holds none at start, and LOADs
        # and UNLOADs them as each batch says (schedulers/gpu_memory.py).
        self.model_cache = model_cache
        # A real GPU's models (model -> its largest batch): run at fixed batch sizes
        # (``fixed_batch_shapes``, executors/batch_shapes.py) and once at each size before the
        # executor says it is ready (``warmup``, executors/worker.py's warm_up); the CUDA
        # provider's cuDNN algorithm search. What the warm-up did, per model, as the hello said it.
        self.gpu_batches = dict(gpu_batches or {})
        self.warmup, self.fixed_batch_shapes = warmup, fixed_batch_shapes
        self.cudnn_conv_algo_search = cudnn_conv_algo_search
        self.warmed: dict[str, Any] = {}
        self.socket_path = socket_dir / f"{safe_name(executor_id)}.sock"
        self.state = "new"
        self.restarts = 0
        self.pid: int | None = None
        self.signatures: dict[str, Any] = {}
        self.provider: str | None = None
        self.output_tail: collections.deque[str] = collections.deque(maxlen=30)
        # When the executor last printed a line (time.monotonic), where the backend relays its output.
        self.last_output_at: float | None = None
        self._connection: ExecutorConnection | None = None
        self._accepted: asyncio.Queue[ExecutorConnection] = asyncio.Queue()
        self._server: asyncio.AbstractServer | None = None
        self._task: asyncio.Task[None] | None = None
        self._handle: Any = None
        self._stopping = False
        # The cores of the last quota carried out, and the cores it really enforces.
        self._enforced: tuple[float, float] | None = None
        # Whether a process of this run was launched and is under the actuator: cores set from
        # then on reach it at once, before its hello as after it.
        self._contained = False
        self._process: psutil.Process | None = None

    # -- what a backend provides ------------------------------------------------------------
    @abc.abstractmethod
    async def _launch(self) -> Any:
        """Start the executor so that it connects to ``self.socket_path``; return a handle."""

    @abc.abstractmethod
    async def _wait_exit(self, handle: Any) -> str:
        """Wait until the launched executor has exited; say how it ended."""

    @abc.abstractmethod
    async def _kill(self, handle: Any) -> None:
        """Make sure the launched executor is gone."""

    async def _end_run(self, handle: Any) -> None:
        """``_kill`` before a restart; where it fails, the restart is tried all the same (an error
        that escaped here ended the supervision for good: never restarted, never stopped)."""
        try:
            await self._kill(handle)
        except Exception as error:
            log.error("executor %s: could not make sure its last run ended: %s; restarting it anyway", self.id, error)

    async def _on_ready(self) -> None:
        """The executor said hello: put it under the actuator and give it its cores."""
        self._attach()

    def _attach(self) -> None:
        if self.actuator is not None and self.pid is not None:
            # The quota first: a new group has none (-1), and a process moved in before it is
            # written ran for that moment on every core of the node.
            self._actuate()
            try:
                self.actuator.attach(self.id, self.pid)
            except OSError as error:
                log.error("executor %s: could not attach pid %s to %s: %s", self.id, self.pid, self.actuator.name, error)

    def worker_arguments(self, connect: str, model_paths: dict[str, Path] | None = None) -> list[str]:
        """The worker's command line; ``model_paths`` where the worker sees the models, if elsewhere."""
        args = ["-m", "executors.worker", "--connect", connect, "--threads", str(self.threads)]
        for name, path in (model_paths or self.models).items():
            args.append(f"--model={name}={path}")  # one word: a name may begin with "-"
        if self.emulate:
            for name, (per_item_ms, fixed_ms) in self.emulate.items():
                args.append(f"--emulate={name}={per_item_ms},{fixed_ms}")
            if self.emulate_zeros:
                args.append("--emulate-zeros")
        elif self.device.startswith("gpu"):
            args += ["--provider", "cuda", "--device-id", self.device.partition(":")[2] or "0"]
            args += ["--cudnn-conv-algo-search", self.cudnn_conv_algo_search]
            if not self.model_cache:  # a model cache holds no session at start: nothing to warm
                for flag, wanted in (("--fixed-batches", self.fixed_batch_shapes), ("--warmup", self.warmup)):
                    if wanted:
                        for name, max_batch in self.gpu_batches.items():
                            args.append(f"{flag}={name}={max_batch}")
        if self.model_cache:
            args.append("--model-cache")
        return args

    # -- the gateway's side -----------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.state == "ready"

    @property
    def in_flight(self) -> int:
        return self._connection.in_flight if self._connection is not None else 0

    @property
    def enforced_cores(self) -> float:
        """The cores really enforced for ``self.cores``, which the core-seconds count: the CFS quota's
        floor (0.01 core) and affinity's whole CPUs make it more than the grant.
        Before the quota is carried out, what it will enforce; with nothing to enforce it, the grant."""
        if self._enforced is not None and self._enforced[0] == self.cores:
            return self._enforced[1]
        return self._would_enforce(self.cores)

    def _would_enforce(self, cores: float) -> float:
        return self.actuator.enforced(cores) if self.actuator is not None else cores

    def cpu_seconds(self) -> float | None:
        """CPU time (user + system) the executor's current process has used; None when not running.

        As the process reported it with its last result where it did (to the nanosecond), else
        from the kernel's counters outside it, which tick at 10 ms: at a few requests a second,
        most control periods of a 1.5 ms model would read 0 and the rest 10 ms a request, and
        the controllers' CPU seconds per request would be several times the truth."""
        process = self._process
        try:
            if process is None or not process.is_running():  # is_running also notices a reused pid
                return None
            connection = self._connection
            if connection is not None and connection.cpu_s is not None and connection.hello.get("pid") == process.pid:
                return connection.cpu_s
            times = process.cpu_times()
        except psutil.Error:
            return None
        return times.user + times.system

    async def start(self) -> None:
        """Start the executor and wait until it is ready; raise ExecutorStartError if it fails."""
        self._server = await asyncio.start_unix_server(self._on_connect, path=str(self.socket_path))
        first_start: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._supervise(first_start))
        await first_start

    async def infer(
        self,
        model: str,
        tensors: dict[str, np.ndarray],
        latest_start: float = math.inf,
        waited_ms: Sequence[float] = (),
        load: Mapping[str, Any] | None = None,
    ) -> tuple[dict[str, np.ndarray], float]:
        """Run a batch that the executor must begin by ``latest_start`` (or raise BatchLate).
        ``waited_ms`` (the requests' waits) matters to a worker's executors only (RemoteExecutor).
        ``load``: {"load_ms": ..., "unload": [...]}, a LOAD of the model (and UNLOADs) first."""
        if self._connection is None or not self.ready:
            raise ExecutorFailed(f"executor {self.id} is not running ({self.state})", reached=False)
        return await self._connection.infer(model, tensors, latest_start, extra=load)

    def set_cores(self, cores: float) -> None:
        """Resize the running executor (no restart); a restarted one gets the same cores."""
        self.cores = cores
        # A process starting (launched, no hello yet) runs under its group's quota too: left at
        # the last run's cores, it kept 1.5 cores while the control loop gave them to another
        # model (3.4 cores of quota on a node of 2, and 0.1 counted as enforced).
        if self._contained:
            self._actuate()

    def _actuate(self) -> None:
        if self.actuator is None or self.pid is None:
            return
        try:
            self._enforced = (self.cores, self.actuator.apply(self.id, self.cores))
        except OSError as error:
            self._enforced = None
            log.error("executor %s: could not set %.2f cores with %s: %s", self.id, self.cores, self.actuator.name, error)

    def kill_hung(self, reason: str) -> None:
        """The executor stopped answering: kill it, so that it is restarted like a crashed one."""
        if self._handle is None or self.state != "ready":
            return
        log.error("executor %s (pid %s): %s; killing it", self.id, self.pid, reason)
        self._set_state("restarting")
        handle = self._handle
        asyncio.get_running_loop().create_task(self._kill(handle))

    async def stop(self) -> None:
        self._stopping = True
        self._contained = False  # its group is removed below: no quota written to it again
        if self._connection is not None:
            await self._connection.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._handle is not None:
            await self._kill(self._handle)
        if self._server is not None:
            self._server.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        if self.actuator is not None:  # an executor unloaded at run time leaves no group behind
            self.actuator.detach(self.id)
        self.state = "stopped"

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "device": self.device,
            "backend": self.backend,
            "cores": self.cores,
            "enforced_cores": self.enforced_cores,
            "threads": self.threads,
            "state": self.state,
            "pid": self.pid,
            "restarts": self.restarts,
            "provider": self.provider,
            "actuator": self.actuator.name if self.actuator is not None else None,
            "emulated": bool(self.emulate),
            "memory_mb": self.memory_mb,
        }

    # -- supervision ------------------------------------------------------------------------
    def _watch_process(self) -> psutil.Process | None:
        if self.pid is None:
            return None
        try:
            return psutil.Process(self.pid)
        except psutil.Error:
            return None

    def _output_line(self, line: str) -> None:
        """A line the executor printed: kept for a failure's message, logged, and the launch's
        proof of life while it has not said hello (``_until_hello_or_quiet``)."""
        self.output_tail.append(line)
        self.last_output_at = time.monotonic()
        log.info("[%s] %s", self.id, line)

    async def _until_hello_or_quiet(self, exited: asyncio.Future[str], accepted: asyncio.Future[Any]) -> set[asyncio.Future[Any]]:
        """Wait for the launch's hello (or its exit) while it keeps printing: what is done, or
        nothing once it has been quiet for START_TIMEOUT_S."""
        began = time.monotonic()
        while True:
            quiet_since = max(began, self.last_output_at or began)
            remaining = START_TIMEOUT_S - (time.monotonic() - quiet_since)
            if remaining <= 0:
                return set()
            done, _ = await asyncio.wait({exited, accepted}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            if done:
                return done

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            connection = await asyncio.wait_for(ExecutorConnection.accept(reader, writer), START_TIMEOUT_S)
        except Exception as error:
            log.warning("executor %s: bad connection: %s", self.id, error)
            writer.close()
            return
        await self._accepted.put(connection)

    def _close_stale_connections(self) -> None:
        """Close the connections an earlier launch left queued: one whose hello came just after
        it was given up on (it exited first) was taken as the next launch's, with its pid, and
        that launch was restarted at once, its connection already closed."""
        while not self._accepted.empty():
            stale = self._accepted.get_nowait()
            asyncio.get_running_loop().create_task(stale.close())

    def _set_state(self, state: str) -> None:
        self.state = state
        self.on_change()

    async def _supervise(self, first_start: asyncio.Future[None]) -> None:
        try:
            await self._keep_running(first_start)
        finally:  # stopped (cancelled) before it was ever ready: whoever awaits start() learns it
            if not first_start.done():
                first_start.set_exception(ExecutorStartError(f"executor {self.id} was stopped before it started"))

    async def _keep_running(self, first_start: asyncio.Future[None]) -> None:
        delay = RESTART_DELAY_S
        loop = asyncio.get_running_loop()
        while not self._stopping:
            self._set_state("starting")
            self._close_stale_connections()
            try:
                handle = self._handle = await self._launch()
                self._contained = True
                if self._enforced is None or self._enforced[0] != self.cores:
                    self._actuate()  # cores changed while it was launched
            except Exception as error:  # the backend could not even start it (no image, no runtime, ...)
                if not first_start.done():
                    self._set_state("failed")
                    first_start.set_exception(
                        error if isinstance(error, ExecutorStartError) else ExecutorStartError(f"executor {self.id}: {error}")
                    )
                    return
                log.error("executor %s could not be started: %s; retrying in %.1f s", self.id, error, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RESTART_DELAY_MAX_S)
                continue
            exited = asyncio.ensure_future(self._wait_exit(handle))
            accepted = asyncio.ensure_future(self._accepted.get())
            done = await self._until_hello_or_quiet(exited, accepted)
            if accepted not in done:
                accepted.cancel()
                self._contained = False
                how = exited.result() if exited in done else f"no hello and no output for {START_TIMEOUT_S:.0f} s"
                await self._end_run(handle)
                message = f"executor {self.id} failed to start: {how}\n" + "\n".join(self.output_tail)
                if not first_start.done():
                    self._set_state("failed")
                    first_start.set_exception(ExecutorStartError(message))
                    return
                log.error("%s", message)
            else:
                connection = accepted.result()
                self._connection = connection
                self.signatures = connection.hello["models"]
                self.provider = ",".join(sorted(set(connection.hello.get("providers", {}).values())))
                self.pid = connection.hello.get("pid")
                self.warmed = connection.hello.get("warmed", {})
                await self._on_ready()  # a backend may put the host's pid in self.pid
                self._process = self._watch_process()
                started_at = loop.time()
                self._set_state("ready")
                if not first_start.done():
                    first_start.set_result(None)
                await asyncio.wait({exited, connection.closed}, return_when=asyncio.FIRST_COMPLETED)
                self._contained = False
                # Fail what was in flight now, not when the process has been reaped.
                connection.fail_all(f"executor {self.id} (pid {self.pid}) stopped while running the batch")
                self._connection = None
                if self._stopping:
                    await self._kill(handle)
                    return
                self._set_state("restarting")
                await self._end_run(handle)
                how = await exited
                log.error("executor %s (pid %s) ended: %s; restarting", self.id, self.pid, how)
                if loop.time() - started_at > STABLE_AFTER_S:
                    delay = RESTART_DELAY_S
            self.restarts += 1
            self._set_state("restarting")
            await asyncio.sleep(delay)
            delay = min(delay * 2, RESTART_DELAY_MAX_S)
