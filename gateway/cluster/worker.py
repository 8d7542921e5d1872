"""``gateway worker``: one node of a cluster (ROMA Sections 2.1-2.2).

A worker owns the executors of its node, built as ``gateway serve`` builds them
(gateway/node.py): one CPU executor per model, one GPU executor per GPU holding every model.
It runs the node's control plane where the cores are enforced: the CT controller of each model,
the node supervisor (Algorithm 2) and the actuator. Dispatchers reach its executors over TCP
with the executor protocol itself (executors/wire.py, DESIGN.md principle 2):

- dispatcher -> worker ``hello``: {"kind": "hello", "token", "dispatcher", "sla_ms"}; a wrong
  token is answered ``refused`` and the connection closed. ``sla_ms``: the SLAs the dispatcher's
  admin API set, by model, which the worker's controllers then regulate to.
- dispatcher -> worker ``sla``: {"kind": "sla", "model", "sla_ms"}, when its admin API sets one.
- worker -> dispatcher ``hello``: {"kind": "hello", "worker", "clock", "pid", "cpu_cores",
  "executors": [{"id", "device", "models": {name: signature}, "provider", "emulate", "warmed",
  "state", "cores", "enforced_cores"}]}.
- dispatcher -> worker ``infer``: an executor's ``infer`` with "executor" (which one) and
  "waited_ms" (how long each request of the batch had waited at the dispatcher when sent).
- worker -> dispatcher: the executor's ``result``, ``error`` or ``late``, under the same id, or
  ``failed`` when the executor could not run the batch (crashed, restarting, hung).
- worker -> dispatcher ``status`` every control period and when an executor changes state:
  {"kind": "status", "executors": [{"id", "state", "cores", "enforced_cores"}]}, and in the
  frames of a change also "provider" and "warmed": a restarted executor's provider and warm-up
  reach the dispatchers with the state that says it is ready again, and the period's frames
  carry only what a period changes. It is also the heartbeat: a dispatcher that hears nothing
  for a while takes the worker as cut off.

Several dispatchers may share a worker (Section 2.1). Each schedules its own traffic; the
worker's controllers see everything that reaches its executors, whichever dispatcher sent it:
a request's response time is its wait at the dispatcher plus its time here.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import logging
import math
import os
import shutil
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from executors.connection import BatchLate, ExecutorFailed, ModelError, read_frame
from executors.lifecycle import SupervisedExecutor, cpu_seconds_since
from executors.sockets import socket_folder
from executors.wire import FrameTooLarge, ProtocolViolation, encode_frame, pack_tensors, unpack_tensors
from gateway.cluster.link import describe
from gateway.cluster.tls import server_context
from gateway.config import GatewayConfig, worker_token_error
from gateway.connections import Connections
from gateway.control import ControlLoop
from gateway.logs import ACCESS_LOG, AccessLog
from gateway.node import NodeExecutors, build_node_executors
from gateway.stopping import start_unless_stopped, stop_on_signals
from supervisor.node import Allocation, Window

log = logging.getLogger("gateway.worker")

# The hello of a dispatcher must come this soon after its connect: a port scanner or a peer
# speaking another protocol is dropped rather than held.
HELLO_TIMEOUT_S = 5.0
# The hello is read before the token is checked, so it may not be as large as the protocol's
# other frames (executors/wire.py's MAX_FRAME_BYTES, 2 GiB): a stranger announcing a huge one
# would have the worker buffer whatever it sends. A real hello is a token and a dispatcher's
# name: 123 bytes, prefix included, with a 64-character token and "host-pid" (measured); this
# leaves room for long tokens and names.
MAX_HELLO_BYTES = 16 * 1024
# The first bytes of a TLS ClientHello record (content type 22, version 3.x).
TLS_RECORD_START = b"\x16\x03"


class HelloTooLarge(ProtocolViolation):
    """A peer announced a hello over MAX_HELLO_BYTES: closed without reading it."""


async def read_hello(reader: asyncio.StreamReader) -> dict[str, Any]:
    """A dispatcher's hello frame, refused unread when its prefix announces more than
    MAX_HELLO_BYTES."""
    try:
        header, _ = await read_frame(reader, MAX_HELLO_BYTES)
    except FrameTooLarge as error:
        tls = " (its first bytes are a TLS handshake: the dispatcher speaks TLS, this worker does not)"
        raise HelloTooLarge(
            f"its hello announced {error.size} bytes, over the {MAX_HELLO_BYTES} a hello may have"
            + (tls if error.prefix.startswith(TLS_RECORD_START) else "")
        ) from None
    if not isinstance(header, dict):
        raise ProtocolViolation(f"its hello is a JSON {type(header).__name__}, not an object")
    return header


def split_host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


@dataclass
class InFlight:
    """A batch a dispatcher sent and the worker has not answered yet."""

    model: str
    received: float
    waited_ms: list[float]


@dataclass
class ModelLoad:
    """What a model's CPU executor did since the last control period, as its controller sees it."""

    window: Window = field(default_factory=Window)
    served: int = 0  # requests of dispatchers' batches answered, ever
    in_flight: dict[tuple[int, int], InFlight] = field(default_factory=dict)  # (session, id) -> batch
    cpu_seen: tuple[int | None, float] | None = None


class WorkerNode:
    def __init__(self, config: GatewayConfig, clock: Any = time.perf_counter):
        self.config = config
        self.clock = clock
        self.name = config.worker.name or socket.gethostname()
        self._socket_dir = socket_folder("gateway-worker")
        self.node: NodeExecutors = build_node_executors(config, self._socket_dir, self._on_executor_change)
        self.executors: dict[str, SupervisedExecutor] = self.node.by_id
        self.loads = {name: ModelLoad() for name in self.node.cpu}
        # Per executor, the end of the last batch sent to it: it runs them one after another, in
        # the order sent, so a batch begins once the one before it has ended.
        self._last_sent: dict[str, asyncio.Future[None]] = {}
        #: SLAs the dispatchers set at run time, by model (the config's until one does): the last
        #: one heard wins where several dispatchers share the worker.
        self.sla_ms: dict[str, float] = {}
        self.control: ControlLoop | None = None
        self.sessions: dict[int, asyncio.StreamWriter] = {}
        self._session_ids = iter(range(1, 1 << 62))
        self._server: asyncio.AbstractServer | None = None
        self._http: web.AppRunner | None = None
        self._http_listener: asyncio.Server | None = None
        self._http_connections: Connections | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.ready = False
        self.registry = CollectorRegistry()
        self._cores = Gauge("gateway_worker_cores", "Cores granted to an executor", ["executor"], registry=self.registry)
        self._batches = Counter(
            "gateway_worker_batches", "Batches run, by executor and outcome", ["executor", "outcome"], registry=self.registry
        )
        self._dispatchers = Gauge("gateway_worker_dispatchers", "Dispatchers connected", registry=self.registry)

    # -- life --------------------------------------------------------------------------------
    async def start(self) -> None:
        problem = worker_token_error(self.config.worker.token)
        if problem is not None:
            raise ValueError(f"worker.token: {problem}")
        if self.node.docker is not None:
            await asyncio.to_thread(self.node.docker.connect)
        self.control = ControlLoop(
            self.config,
            measure=self._measure,
            set_cores=self._set_cores,
            on_period=self._on_period,
            clock=self.clock,
            sla_ms=lambda name: self.sla_ms.get(name, self.config.models[name].sla_ms),
        )
        for name, cores in self.control.initial_cores.items():
            self.node.cpu[name].cores = cores
        results = await asyncio.gather(*(e.start() for e in self.executors.values()), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            await self.stop()
            raise failures[0]
        self.control.start()
        host, port = split_host_port(self.config.worker.listen)
        worker = self.config.worker
        tls = server_context(worker.tls_cert, worker.tls_key) if worker.tls_cert and worker.tls_key else None
        # A TLS handshake gets the hello's time; one that never finishes is dropped as a silent peer is.
        self._server = await asyncio.start_server(
            self._serve_dispatcher, host, port, ssl=tls, ssl_handshake_timeout=HELLO_TIMEOUT_S if tls else None
        )
        if self.config.worker.http_port:
            await self._start_http(host)
        self.ready = True
        log.info(
            "worker %s: %d executors ready, listening on %s (%s); cores enforced by %s",
            self.name,
            len(self.executors),
            self.config.worker.listen,
            "TLS" if tls else "plain TCP",
            self.node.enforced_by,
        )

    async def stop(self) -> None:
        self.ready = False
        if self._server is not None:
            self._server.close()
        for writer in list(self.sessions.values()):
            writer.close()
        if self.control is not None:
            await self.control.stop()
        if self._http_listener is not None:
            self._http_listener.close()
        if self._http_connections is not None:
            await self._http_connections.close_all(grace_s=1.0)
        if self._http is not None:
            await self._http.cleanup()
        await asyncio.gather(*(e.stop() for e in self.executors.values()), return_exceptions=True)
        self.node.close()
        shutil.rmtree(self._socket_dir, ignore_errors=True)

    def _set_sla(self, model: Any, sla_ms: Any, dispatcher: Any) -> None:
        """A dispatcher's SLA for ``model``: what its controller regulates to from now on."""
        if model not in self.loads or isinstance(sla_ms, bool) or not isinstance(sla_ms, int | float):
            return  # not a model with a CPU executor here, or not a number: nothing to regulate
        # Every hello carries each model's SLA, the config's among them: one already held is no news.
        if not (math.isfinite(sla_ms) and sla_ms > 0) or self.sla_ms.get(model, self.config.models[model].sla_ms) == sla_ms:
            return
        self.sla_ms[model] = float(sla_ms)
        log.info("worker %s: model %s: SLA set to %g ms by dispatcher %s", self.name, model, sla_ms, dispatcher)

    # -- what dispatchers see ----------------------------------------------------------------
    def executor_state(self, executor: SupervisedExecutor, *, process: bool = True) -> dict[str, Any]:
        """What a dispatcher knows of ``executor``; with ``process``, also what its process said
        when it last came up (only a start changes that)."""
        state: dict[str, Any] = {
            "id": executor.id,
            "state": executor.state,
            "cores": executor.cores,
            "enforced_cores": executor.enforced_cores,
        }
        if process:
            # A restarted executor may run another provider (CUDA's failed: the CPU's) and have
            # warmed up other sizes.
            state["provider"] = executor.provider
            state["warmed"] = executor.warmed
            # What the README's executor fields promise on a dispatcher's admin API as on a node's.
            state["threads"], state["pid"], state["restarts"] = executor.threads, executor.pid, executor.restarts
        return state

    def hello(self) -> dict[str, Any]:
        return {
            "kind": "hello",
            "worker": self.name,
            "pid": os.getpid(),
            "clock": self.clock(),
            "cpu_cores": self.config.node.cpu_cores,
            "executors": [
                {
                    **self.executor_state(e),
                    "device": e.device,
                    "models": e.signatures,
                    "emulate": {name: list(profile) for name, profile in e.emulate.items()} or None,
                }
                for e in self.executors.values()
            ],
        }

    def describe(self) -> dict[str, Any]:
        """The node for /v2/worker: devices, models, cores, the dispatchers connected."""
        return {
            "worker": self.name,
            "ready": self.ready,
            "cpu_cores": self.config.node.cpu_cores,
            "gpus": list(self.config.node.gpus),
            "enforced_by": self.node.enforced_by,
            "dispatchers": len(self.sessions),
            "executors": [e.describe() for e in self.executors.values()],
            "models": {
                name: {
                    "cpu_executor": self.node.cpu[name].id if name in self.node.cpu else None,
                    # Requests its CPU executor answered, from every dispatcher: what its controller regulates.
                    "served": self.loads[name].served if name in self.loads else 0,
                    "cores": self.node.cpu[name].cores if name in self.node.cpu else 0.0,
                    # What its controller regulates to: a dispatcher's SLA, or the config's.
                    "sla_ms": self.sla_ms.get(name, model.sla_ms),
                }
                for name, model in self.config.models.items()
            },
        }

    def _broadcast_status(self, *, process: bool) -> None:
        executors = [self.executor_state(e, process=process) for e in self.executors.values()]
        frame = encode_frame({"kind": "status", "executors": executors})
        for writer in list(self.sessions.values()):
            if not writer.is_closing():
                writer.writelines(frame)

    def _on_executor_change(self, executor_id: str) -> None:
        # An executor that came up sets its provider and warm-up before it says it is ready, so
        # this frame carries them; a dispatcher that connects later reads them in the hello.
        if self.sessions:
            self._broadcast_status(process=True)

    # -- a dispatcher's connection -----------------------------------------------------------
    async def _serve_dispatcher(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            header = await asyncio.wait_for(read_hello(reader), HELLO_TIMEOUT_S)
        except HelloTooLarge as error:
            log.warning("worker %s: closed the connection from %s unread: %s", self.name, peer, error)
            writer.close()
            return
        except Exception as error:
            log.warning("worker %s: connection from %s sent no hello: %s", self.name, peer, describe(error))
            writer.close()
            return
        # A lone surrogate ("\ud800", which JSON allows) cannot be UTF-8: it raised out of the
        # handler, and the dispatcher got no "refused". Kept as its bytes, it is a wrong token.
        token = str(header.get("token", "")).encode("utf-8", "surrogatepass")
        expected = (self.config.worker.token or "").encode()
        if header.get("kind") != "hello" or not hmac.compare_digest(token, expected):
            why = "wrong token" if header.get("kind") == "hello" else "no hello"
            log.warning("worker %s: refused %s: %s", self.name, peer, why)
            writer.writelines(encode_frame({"kind": "refused", "message": "wrong worker token"}))
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            writer.close()
            return
        session = next(self._session_ids)
        self.sessions[session] = writer
        self._dispatchers.set(len(self.sessions))
        dispatcher = header.get("dispatcher")
        log.info("worker %s: dispatcher %s connected from %s", self.name, dispatcher, peer)
        slas = header.get("sla_ms")
        for model, sla_ms in slas.items() if isinstance(slas, dict) else ():
            self._set_sla(model, sla_ms, dispatcher)
        writer.writelines(encode_frame(self.hello()))
        try:
            while True:
                frame, payload = await read_frame(reader)
                if frame.get("kind") == "infer":
                    task = asyncio.create_task(self._infer(session, writer, frame, payload))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                elif frame.get("kind") == "sla":
                    self._set_sla(frame.get("model"), frame.get("sla_ms"), dispatcher)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except Exception as error:
            log.warning("worker %s: dispatcher %s: %s", self.name, peer, error)
        finally:
            self.sessions.pop(session, None)
            self._dispatchers.set(len(self.sessions))
            writer.close()
            log.info("worker %s: dispatcher %s disconnected", self.name, dispatcher)

    async def _infer(self, session: int, writer: asyncio.StreamWriter, header: dict[str, Any], payload: bytes) -> None:
        request_id, model = header.get("id"), str(header.get("model"))
        executor = self.executors.get(str(header.get("executor")))
        received = self.clock()
        load = self.loads.get(model) if executor is not None and executor.device == "cpu" else None
        key = (session, request_id)
        if load is not None:
            waited = [float(w) for w in header.get("waited_ms", [])]
            load.in_flight[key] = InFlight(model, received, waited)
            self._react(model)
        reply: dict[str, Any]
        buffers: list[Any] = []
        outcome = "ok"
        try:
            if executor is None:
                raise ExecutorFailed(f"worker {self.name} has no executor {header.get('executor')!r}")
            tensors = unpack_tensors(header["tensors"], payload)
            latest = header.get("latest", math.inf)
            outputs, compute_ms = await self._run(executor, model, tensors, latest)
            descriptions, buffers = pack_tensors(outputs)
            reply = {"kind": "result", "id": request_id, "compute_ms": compute_ms, "tensors": descriptions}
        except BatchLate as late:
            reply, outcome = {"kind": "late", "id": request_id, "late_ms": late.late_ms}, "late"
        except ModelError as error:
            reply, outcome = {"kind": "error", "id": request_id, "message": str(error)}, "model_error"
        except TimeoutError:
            assert executor is not None
            executor.kill_hung("no reply to a batch from a dispatcher in time (hang_timeout_ms)")
            reply, outcome = {"kind": "failed", "id": request_id, "message": f"executor {executor.id} hung"}, "failed"
        except (ExecutorFailed, KeyError, ValueError) as error:
            reply, outcome = {"kind": "failed", "id": request_id, "message": str(error)}, "failed"
        finally:
            if load is not None:
                batch = load.in_flight.pop(key, None)
                if batch is not None and outcome == "ok":
                    here_ms = (self.clock() - batch.received) * 1000
                    for waited_ms in batch.waited_ms:
                        load.window.add(waited_ms + here_ms)
                    load.served += len(batch.waited_ms)
        self._batches.labels(str(header.get("executor")), outcome).inc()
        if not writer.is_closing():
            writer.writelines(encode_frame(reply, buffers))
            with contextlib.suppress(ConnectionError):
                await writer.drain()

    async def _run(
        self, executor: SupervisedExecutor, model: str, tensors: dict[str, Any], latest: float
    ) -> tuple[dict[str, Any], float]:
        """The batch on ``executor``, timed against its model's hang timeout from when it begins:
        once the batch sent before it (another dispatcher's, say) has ended. Timed from when it was
        sent, a batch that waited behind a long one made the healthy executor look hung, and it
        was killed, with every batch on it (a worker shared by two dispatchers)."""
        loop = asyncio.get_running_loop()
        ahead = self._last_sent.get(executor.id)
        ended: asyncio.Future[None] = loop.create_future()
        self._last_sent[executor.id] = ended
        run = asyncio.ensure_future(executor.infer(model, tensors, latest))
        try:
            if ahead is not None and not ahead.done():
                await asyncio.wait({ahead, run}, return_when=asyncio.FIRST_COMPLETED)
            return await asyncio.wait_for(run, self.config.models[model].hang_timeout_s)
        finally:
            run.cancel()  # where this call itself was cancelled while it waited its turn
            ended.set_result(None)
            if self._last_sent.get(executor.id) is ended:
                del self._last_sent[executor.id]

    # -- the node's control plane ------------------------------------------------------------
    def _backlog(self, load: ModelLoad, now: float) -> tuple[int, float | None]:
        waiting = sum(len(b.waited_ms) for b in load.in_flight.values())
        ages = [max(b.waited_ms, default=0.0) + (now - b.received) * 1000 for b in load.in_flight.values()]
        return waiting, max(ages, default=None)

    def _react(self, model: str) -> None:
        """Work reached a model's executor: its controller may raise its cores between periods."""
        if self.control is None:
            return
        load = self.loads[model]

        def so_far() -> Window:
            window = Window(load.window.count, load.window.total_ms)
            window.waiting, window.oldest_wait_ms = self._backlog(load, self.clock())
            return window

        self.control.react(model, so_far)

    def _measure(self) -> dict[str, Window]:
        now = self.clock()
        windows = {}
        for name, load in self.loads.items():
            window, load.window = load.window, Window()
            window.cpu_s = self._cpu_used(self.node.cpu[name], load)
            window.waiting, window.oldest_wait_ms = self._backlog(load, now)
            windows[name] = window
        return windows

    @staticmethod
    def _cpu_used(executor: SupervisedExecutor, load: ModelLoad) -> float:
        total = executor.cpu_seconds()
        if total is None:
            return 0.0
        previous, load.cpu_seen = load.cpu_seen, (executor.pid, total)
        return cpu_seconds_since(previous, executor.pid, total)

    def _set_cores(self, name: str, cores: float) -> None:
        executor = self.node.cpu[name]
        if abs(executor.cores - cores) > 1e-6:
            executor.set_cores(cores)
        self._cores.labels(executor.id).set(cores)

    def _on_period(self, now: float, allocations: Mapping[str, Allocation], windows: Mapping[str, Window]) -> None:
        self._broadcast_status(process=False)  # the heartbeat too

    # -- health and state over HTTP ------------------------------------------------------------
    async def _start_http(self, host: str) -> None:
        app = web.Application()

        async def live(request: web.Request) -> web.Response:
            return web.json_response({"live": True})

        async def ready(request: web.Request) -> web.Response:
            up = self.ready and all(e.ready for e in self.executors.values())
            return web.json_response({"ready": up}, status=200 if up else 503)

        async def state(request: web.Request) -> web.Response:
            return web.json_response(self.describe())

        async def metrics(request: web.Request) -> web.Response:
            return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

        app.router.add_get("/v2/health/live", live)
        app.router.add_get("/v2/health/ready", ready)
        app.router.add_get("/v2/worker", state)
        app.router.add_get("/metrics", metrics)
        # The access log (--access-log) is written only where gateway/logs.py enabled it.
        self._http = web.AppRunner(app, access_log=ACCESS_LOG, access_log_class=AccessLog)
        await self._http.setup()
        # The serving gateway's guards on connections (a head within header_timeout_s, a cap under
        # the descriptor limit): a bare TCPSite kept idle connections open for good, and enough
        # of them left the worker no descriptor to take a dispatcher's hello on.
        from gateway.server import listen

        self._http_connections, self._http_listener = await listen(
            self._http, self.config, (host, self.config.worker.http_port), listeners=2
        )


async def serve_worker(config: GatewayConfig) -> None:
    """Run a worker until SIGTERM or SIGINT."""
    # Heard before the node makes its executors' groups and socket folder (gateway/stopping.py).
    stop = stop_on_signals()
    node = WorkerNode(config)
    if not await start_unless_stopped(node.start(), stop, node.stop):
        log.info("stopped while starting")
        return
    # Start-up's objects out of the collector's reach, as in gateway/server.py's serve.
    gc.collect()
    gc.freeze()
    try:
        await stop.wait()
    finally:
        await node.stop()
