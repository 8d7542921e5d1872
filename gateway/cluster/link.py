"""A dispatcher's connection to one worker, and the worker's executors as the engine sees them.

``WorkerLink`` keeps one TCP connection to a worker (gateway/cluster/worker.py has the
protocol): it connects, presents the token, learns the worker's executors from its hello, and
from then on hears a ``status`` every control period. A worker that closes the connection (it
died) or is not heard from for ``heartbeat_timeout_s`` (it is cut off) is down at once: the
batches in flight to it fail with ExecutorFailed (the engine answers them 503), its executors
are no longer ready, so the dispatch core routes around it, and the link keeps trying to
connect again; a worker that comes back is used again from its hello on.

``RemoteExecutor`` is one executor of a worker behind the interface the engine uses for its
own executors (``SupervisedExecutor``): ready or not, ``infer``, its models' signatures. Its
``infer`` reports the round trip measured here, not the executor's compute time: the transfer
to the worker is then part of the latency profile that deadlines are planned with.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import ssl
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from executors.connection import ExecutorConnection, ExecutorFailed, read_frame
from executors.wire import ProtocolViolation, encode_frame, shares_clock

log = logging.getLogger("gateway.cluster")

CONNECT_TIMEOUT_S = 3.0
# Reconnection: quickly at first (a worker restarting under Kubernetes is back in seconds), then
# no more often than this.
RECONNECT_DELAY_S = 0.2
RECONNECT_DELAY_MAX_S = 2.0
# The state of an executor that the worker's last hello left out.
GONE = "gone"


class WorkerRefused(RuntimeError):
    """The worker refused this dispatcher (a wrong token): retrying will not help."""


def describe(error: BaseException) -> str:
    """An error for a log line: its message, or its type where it has none (a TimeoutError's
    is empty)."""
    return str(error) or type(error).__name__


class RemoteExecutor:
    """One executor of a worker, as the engine uses its own (see ``SupervisedExecutor``)."""

    backend = "remote"

    def __init__(self, link: WorkerLink, info: dict[str, Any]):
        self.link = link
        self.local_id = str(info["id"])
        self.id = f"{link.address}/{self.local_id}"
        self.device = str(info["device"])
        self.signatures: dict[str, Any] = dict(info.get("models") or {})
        self.models = list(self.signatures)
        self.provider: str | None = None
        self.emulate: dict[str, tuple[float, float]] = {
            k: (float(v[0]), float(v[1])) for k, v in (info.get("emulate") or {}).items()
        }
        # What a real GPU executor's warm-up did, per model (executors/worker.py's warm_up).
        self.warmed: dict[str, Any] = {}
        self.threads = 0
        self.pid: int | None = None
        self.restarts = 0
        self.worker_state = "new"
        # Why the dispatcher will not use it, where its model differs from the one served.
        self.refused: str | None = None
        self.cores = self.enforced_cores = 0.0
        # A CPU executor serves this dispatcher only where a replica of its model is placed.
        self.placed = self.device != "cpu"
        self.update(info)

    def update(self, info: dict[str, Any]) -> None:
        """The worker's word on this executor (its hello or a status). The provider and the
        warm-up are the executor process's of the moment: a restart may change them."""
        self.worker_state = str(info.get("state", self.worker_state))
        if "models" in info:  # a hello: a worker back with another config may hold another model
            self.signatures = dict(info["models"] or {})
        if "provider" in info:
            self.provider = info["provider"]
        if "warmed" in info:
            self.warmed = dict(info["warmed"] or {})
        self.threads = int(info.get("threads", self.threads))
        self.pid = info.get("pid", self.pid)
        self.restarts = int(info.get("restarts", self.restarts))
        self.cores = float(info.get("cores", self.cores))
        self.enforced_cores = float(info.get("enforced_cores", self.enforced_cores))

    @property
    def gone(self) -> bool:
        """Whether the worker's last hello left this executor out (it came back without it)."""
        return self.worker_state == GONE

    @property
    def state(self) -> str:
        if not self.link.connected:
            return "unreachable"
        if self.refused:
            return "refused"
        return self.worker_state if self.placed or self.gone else "not placed"

    @property
    def ready(self) -> bool:
        return (
            self.link.connected and not self.link.draining and self.worker_state == "ready" and self.placed and not self.refused
        )

    @property
    def in_flight(self) -> int:
        return self.link.in_flight

    async def infer(
        self,
        model: str,
        tensors: dict[str, np.ndarray],
        latest_start: float = math.inf,
        waited_ms: Sequence[float] = (),
        load: dict[str, Any] | None = None,
    ) -> tuple[dict[str, np.ndarray], float]:
        """Run a batch on the worker; the time reported is the round trip, transfer included.
        ``waited_ms``: how long each request of the batch waited here (the worker's controller
        counts it into the response time it regulates)."""
        connection = self.link.connection
        if connection is None or not self.link.connected:
            raise ExecutorFailed(f"worker {self.link.address} is unreachable", reached=False)
        sent = time.perf_counter()
        extra = {"executor": self.local_id, "waited_ms": [round(w, 3) for w in waited_ms], **(load or {})}
        outputs, _ = await connection.infer(model, tensors, latest_start, extra=extra)
        return outputs, (time.perf_counter() - sent) * 1000

    # What the engine may call on its own executors; a worker owns these.
    def set_cores(self, cores: float) -> None:
        raise RuntimeError(f"{self.id}: cores are set by its worker's controllers")

    def kill_hung(self, reason: str) -> None:
        log.error("executor %s: %s; its worker kills and restarts a hung executor", self.id, reason)

    def cpu_seconds(self) -> float | None:
        return None

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "worker": self.link.address,
            "device": self.device,
            "backend": self.backend,
            "cores": self.cores,
            "enforced_cores": self.enforced_cores,
            "threads": self.threads,
            "state": self.state,
            "pid": self.pid,
            "restarts": self.restarts,
            "placed": self.placed,
            "provider": self.provider,
            "emulated": bool(self.emulate),
        }


class WorkerLink:
    """The connection to one worker, kept up until ``stop``."""

    def __init__(
        self,
        address: str,
        token: str,
        dispatcher: str,
        *,
        heartbeat_timeout_s: float,
        on_change: Callable[[WorkerLink, list[RemoteExecutor]], None],
        tls: ssl.SSLContext | None = None,
        sla_ms: Callable[[], dict[str, float]] = dict,
    ):
        """``on_change(link, executors)`` is called when the link goes up or down and when the
        worker reports a change of its executors; ``executors`` are those whose readiness may
        have changed (new ones included). ``sla_ms()``: the SLAs set at run time, by model, which
        the hello tells the worker (its controllers hold them)."""
        self.address, self.token, self.dispatcher = address, token, dispatcher
        self.sla_ms = sla_ms
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.on_change = on_change
        self.tls = tls  # None: plain TCP
        self.executors: dict[str, RemoteExecutor] = {}
        self.connection: ExecutorConnection | None = None
        self.connected = False
        self.draining = False  # discovery lost it: no new batches, those in flight finish
        self.worker_name: str | None = None
        self.last_error: str | None = None
        self.connects = 0
        self.up = asyncio.Event()
        self._heard = 0.0
        self._task: asyncio.Task[None] | None = None

    @property
    def in_flight(self) -> int:
        return self.connection.in_flight if self.connection is not None and self.connected else 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._down("the dispatcher let the worker go")

    async def drain(self, timeout_s: float, has_batch: Callable[[str], bool] = lambda executor_id: False) -> None:
        """Send nothing new; let the batches in flight end (at most ``timeout_s``); then stop.
        ``has_batch(executor_id)``: a batch given to the executor and not ended, which may not
        have reached the connection yet (its task has not run): the drain waits for it too."""
        self.draining = True
        self.on_change(self, list(self.executors.values()))
        deadline = time.perf_counter() + timeout_s

        def busy() -> bool:
            return bool(self.in_flight) or any(has_batch(executor.id) for executor in self.executors.values())

        while busy() and time.perf_counter() < deadline:
            await asyncio.sleep(0.05)
        await self.stop()

    async def _run(self) -> None:
        delay = RECONNECT_DELAY_S
        while True:
            try:
                await self._session()
                delay = RECONNECT_DELAY_S
            except WorkerRefused as error:
                self.last_error = str(error)
                log.error("worker %s refused this dispatcher: %s", self.address, error)
                delay = RECONNECT_DELAY_MAX_S * 5  # a token is fixed by an operator, not by retrying
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ProtocolViolation, ValueError, KeyError) as error:
                self._connect_failed(describe(error))
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_DELAY_MAX_S)

    def _connect_failed(self, message: str) -> None:
        """Log a failure to connect once, not at every retry: again only when it changes or
        after the worker was reached (a success clears ``last_error``)."""
        if message != self.last_error:
            log.warning("worker %s: %s", self.address, message)
        self.last_error = message

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the worker, over TLS where this dispatcher has a CA. The TCP connect
        and the TLS handshake are timed apart, so that a failure says which of them failed."""
        host, _, port = self.address.rpartition(":")
        host = host.strip("[]")
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), CONNECT_TIMEOUT_S)
        except TimeoutError:
            raise TimeoutError(f"no TCP connection within {CONNECT_TIMEOUT_S:g} s") from None
        if self.tls is None:
            return reader, writer
        try:
            # The worker's certificate must name the host or address dialled.
            await asyncio.wait_for(writer.start_tls(self.tls, server_hostname=host), CONNECT_TIMEOUT_S)
        except ssl.SSLCertVerificationError:
            writer.close()
            raise  # its message says what is wrong with the certificate
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as error:
            writer.close()
            # A worker without TLS takes the ClientHello for a huge hello: it closes the connection
            # (a worker older than its hello cap waits for the rest: the handshake times out).
            raise ConnectionError(
                f"the TLS handshake did not complete ({describe(error)}): the worker may not serve TLS "
                "(one without [worker] tls_cert speaks plain TCP)"
            ) from error
        return reader, writer

    async def _read_hello(self, reader: asyncio.StreamReader) -> dict[str, Any]:
        try:
            hello, _ = await asyncio.wait_for(read_frame(reader), CONNECT_TIMEOUT_S)
        except TimeoutError:
            raise TimeoutError(f"no hello from the worker within {CONNECT_TIMEOUT_S:g} s") from None
        except (asyncio.IncompleteReadError, ConnectionResetError) as error:
            # A TLS worker drops a plain connection in its handshake, before a word of the protocol.
            hint = ": it may expect TLS (a worker with [worker] tls_cert needs [cluster] tls_ca here)" if self.tls is None else ""
            raise ConnectionError(f"the worker closed the connection during the hello{hint}") from error
        return hello

    async def _session(self) -> None:
        reader, writer = await self._connect()
        try:
            hello_frame = {"kind": "hello", "token": self.token, "dispatcher": self.dispatcher, "sla_ms": self.sla_ms()}
            writer.writelines(encode_frame(hello_frame))
            await writer.drain()
            hello = await self._read_hello(reader)
            received = time.perf_counter()
            if hello.get("kind") == "refused":
                raise WorkerRefused(str(hello.get("message", "refused")))
            if hello.get("kind") != "hello":
                raise ProtocolViolation(f"expected the worker's hello, got {hello.get('kind')!r}")
            connection = ExecutorConnection(reader, writer, hello, shares_clock(hello.get("clock"), received), self._on_message)
        except BaseException:
            writer.close()
            raise
        self.worker_name = str(hello.get("worker", self.address))
        changed = []
        for info in hello.get("executors", []):
            executor = self.executors.get(str(info["id"]))
            if executor is None:
                executor = self.executors[str(info["id"])] = RemoteExecutor(self, info)
            else:
                executor.update(info)
            changed.append(executor)
        # A worker back at its address without an executor it had (its config changed): that
        # one kept its last state, "ready", and took batches the worker answered with 503s.
        listed = {str(info["id"]) for info in hello.get("executors", [])}
        for key, executor in self.executors.items():
            if key not in listed and not executor.gone:
                executor.worker_state = GONE
                changed.append(executor)
        self.connection, self.connected, self._heard = connection, True, time.perf_counter()
        # An SLA set while the hello was on its way: send_sla dropped it (the link was not up).
        for model, sla_ms in self.sla_ms().items():
            if hello_frame["sla_ms"].get(model) != sla_ms:
                connection.send({"kind": "sla", "model": model, "sla_ms": sla_ms})
        self.connects += 1
        self.last_error = None
        self.up.set()
        log.info("worker %s (%s) connected: %d executors", self.address, self.worker_name, len(changed))
        self.on_change(self, changed)
        try:
            await self._watch(connection)
        finally:
            self._down(self.last_error or "the worker closed the connection")

    def send_sla(self, model: str, sla_ms: float) -> None:
        """A model's SLA set at run time, to the worker's controllers (a link down tells it in
        its next hello)."""
        if self.connection is not None and self.connected:
            self.connection.send({"kind": "sla", "model": model, "sla_ms": sla_ms})

    async def _watch(self, connection: ExecutorConnection) -> None:
        """Until the connection ends or the worker falls silent past the heartbeat timeout."""
        while not connection.closed.done():
            silent = time.perf_counter() - self._heard
            if silent > self.heartbeat_timeout_s:
                self.last_error = f"no word from the worker for {silent:.1f} s (cut off?)"
                log.error("worker %s: %s", self.address, self.last_error)
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(connection.closed), self.heartbeat_timeout_s / 4)
        self.last_error = connection.closed.result()

    def _on_message(self, message: dict[str, Any]) -> None:
        self._heard = time.perf_counter()
        if message.get("kind") != "status":
            return
        changed = []
        for info in message.get("executors", []):
            executor = self.executors.get(str(info.get("id")))
            if executor is not None:
                was = executor.ready
                executor.update(info)
                if executor.ready != was:
                    changed.append(executor)
        if changed:
            self.on_change(self, changed)

    def _down(self, reason: str) -> None:
        connection, self.connection = self.connection, None
        was_up, self.connected = self.connected, False
        self.up.clear()
        if connection is not None:
            # In-flight batches fail now (503 to their clients), not when some timeout passes.
            connection.fail_all(f"worker {self.address} is gone: {reason}")
        if was_up:
            log.warning("worker %s is down: %s", self.address, reason)
            self.on_change(self, list(self.executors.values()))
