"""The HTTP front end: KServe v2 data plane, admin API and /metrics on one aiohttp app."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from executors.tensors import KSERVE_TO_TRITON_CONFIG
from gateway import __version__
from gateway.config import GatewayConfig
from gateway.engine import Engine, ModelRuntime, RequestFailed
from gateway.metrics import GatewayMetrics
from gateway.openapi import openapi_document
from gateway.protocol import InvalidRequest, Limits, encode_infer_response, parse_infer_request
from gateway.routes import ROUTES, plane

log = logging.getLogger("gateway")

ENGINE: web.AppKey[Engine] = web.AppKey("engine", Engine)
HANDLERS: web.AppKey[Handlers] = web.AppKey("handlers")
SERVER_NAME = "gateway"
# The only model version served; the protocol lets clients name it in the path.
MODEL_VERSION = "1"


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error leaves as JSON {"error": ...}; an unexpected one is logged and is a 500."""
    try:
        return await handler(request)
    except InvalidRequest as error:
        return error_response(error.status, str(error))
    except web.HTTPException as error:
        if error.status < 400:
            raise
        message = error.text if error.text and not error.text.startswith(f"{error.status}:") else error.reason
        # Keep what the status needs beside the body, such as the Allow of a 405 (RFC 9110).
        kept = {k: v for k, v in error.headers.items() if k.lower() not in ("content-type", "content-length")}
        return error_response(error.status, message, kept)
    except Exception:
        log.exception("unexpected error on %s %s", request.method, request.path)
        return error_response(500, "internal error; see the gateway's log")


def bearer_guard(admin_token: str | None, data_token: str | None) -> Middleware:
    """The admin API needs the admin token; the data plane the data token when one is set.

    Which paths are which is ``gateway.routes.plane``: health, /metrics and /openapi.json stay open.
    """

    tokens = {"admin": (admin_token, "admin API"), "data": (data_token, "data plane")}

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        needs = plane(request.path)
        token, name = tokens[needs] if needs is not None else (None, "")
        if token is not None:
            scheme, _, given = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
                problem = "the bearer token is wrong" if scheme.lower() == "bearer" else "no 'Authorization: Bearer' header"
                return error_response(401, f"the {name} needs a bearer token: {problem}", {"WWW-Authenticate": "Bearer"})
        return await handler(request)

    return guard


class Handlers:
    def __init__(self, engine: Engine):
        self.engine = engine
        server = engine.config.server
        self.limits = Limits(server.max_json_depth, server.max_elements)
        self.draining = False  # set on SIGTERM/SIGINT: not ready, no new requests

    def _runtime(self, request: web.Request) -> ModelRuntime:
        name = request.match_info["model"]
        runtime = self.engine.models.get(name)
        if runtime is None:
            known = ", ".join(sorted(self.engine.models))
            raise InvalidRequest(f"unknown model '{name}'; served models: {known}", status=404)
        version = request.match_info.get("version")
        if version is not None and version != MODEL_VERSION:
            raise InvalidRequest(f"model '{name}' has no version '{version}'; served version: {MODEL_VERSION}", status=404)
        return runtime

    # -- KServe v2 --------------------------------------------------------------------------
    async def server_metadata(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"name": SERVER_NAME, "version": __version__, "extensions": ["binary_tensor_data", "model_configuration"]}
        )

    async def live(self, request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def ready(self, request: web.Request) -> web.Response:
        ready = not self.draining and all(r.ready for r in self.engine.models.values())
        return web.json_response({"ready": ready}, status=200 if ready else 503)

    async def model_metadata(self, request: web.Request) -> web.Response:
        runtime = self._runtime(request)
        signature = runtime.signature
        assert signature is not None
        return web.json_response(
            {
                "name": runtime.name,
                "versions": [MODEL_VERSION],
                "platform": "onnxruntime_onnx",
                "inputs": [t.as_json() for t in signature.inputs],
                "outputs": [t.as_json() for t in signature.outputs],
            }
        )

    async def model_ready(self, request: web.Request) -> web.Response:
        runtime = self._runtime(request)
        ready = runtime.ready and not self.draining
        return web.json_response({"name": runtime.name, "ready": ready}, status=200 if ready else 503)

    async def model_config(self, request: web.Request) -> web.Response:
        """Triton's model configuration, which perf_analyzer reads before it sends anything."""
        runtime = self._runtime(request)
        signature = runtime.signature
        assert signature is not None
        batching = signature.batchable

        def tensors(specs: Any) -> list[dict[str, Any]]:
            return [
                {
                    "name": t.name,
                    "data_type": KSERVE_TO_TRITON_CONFIG[t.datatype],
                    "dims": list(t.shape[1:] if batching else t.shape),
                }
                for t in specs
            ]

        config: dict[str, Any] = {
            "name": runtime.name,
            "platform": "onnxruntime_onnx",
            "backend": "onnxruntime",
            "max_batch_size": runtime.config.max_batch_size if batching else 0,
            "input": tensors(signature.inputs),
            "output": tensors(signature.outputs),
            "parameters": {"sla_ms": {"string_value": str(runtime.sla_ms)}},
        }
        if batching:
            config["dynamic_batching"] = {}
        return web.json_response(config)

    async def infer(self, request: web.Request) -> web.Response:
        """One infer request; it ends in exactly one outcome, accounted for in /metrics."""
        # time.perf_counter, as every timestamp of the engine: uvloop's loop.time() has 1 ms
        # resolution and stands still within a loop iteration.
        arrival = time.perf_counter()
        runtime = self._runtime(request)
        self.engine.received(runtime)
        outcome, served_on = "internal_error", None
        try:
            response, outcome, served_on = await self._infer(request, runtime, arrival)
            return response
        except InvalidRequest:
            outcome = "invalid"
            raise
        except web.HTTPException as error:
            outcome = "too_large" if error.status == 413 else "invalid"
            raise
        except (asyncio.CancelledError, ConnectionError):
            outcome = "client_gone"
            raise
        finally:
            self.engine.record(runtime, outcome, arrival if served_on else None, served_on or "cpu")

    async def _infer(self, request: web.Request, runtime: ModelRuntime, arrival: float) -> tuple[web.Response, str, str | None]:
        assert runtime.signature is not None
        if self.draining:
            return error_response(503, "the gateway is shutting down; no new requests"), "shutdown", None
        body = await request.read()
        parsed = parse_infer_request(
            body,
            request.headers.get("Inference-Header-Content-Length"),
            runtime.signature,
            runtime.config.max_batch_size,
            self.limits,
        )
        try:
            result = await self.engine.submit(runtime, parsed, arrival)
        except RequestFailed as error:
            return error_response(error.status, str(error), error.headers), error.outcome, None
        parameters = {
            "executed_on": result.executed_on,
            "batch_size": result.batch_size,
            "queue_ms": round(result.queue_ms, 3),
            "compute_ms": round(result.compute_ms, 3),
        }
        payload, header_length = encode_infer_response(runtime.name, parsed, result.outputs, runtime.datatypes, parameters)
        if header_length is None:
            return web.Response(body=payload, content_type="application/json"), "success", result.executed_on
        response = web.Response(
            body=payload,
            content_type="application/octet-stream",
            headers={"Inference-Header-Content-Length": str(header_length)},
        )
        return response, "success", result.executed_on

    # -- admin ------------------------------------------------------------------------------
    async def admin_models(self, request: web.Request) -> web.Response:
        return web.json_response({"models": [self.engine.describe(r) for r in self.engine.models.values()]})

    async def admin_model(self, request: web.Request) -> web.Response:
        return web.json_response(self.engine.describe(self._runtime(request)))

    async def admin_pin_cores(self, request: web.Request) -> web.Response:
        """Pin a model's cores ({"cores": 0.5}) or hand them back to the policy ({"cores": null})."""
        runtime = self._runtime(request)
        body = await self._json_body(request)
        cores = body.get("cores", ...) if isinstance(body, dict) else ...
        valid = cores is None or (not isinstance(cores, bool) and isinstance(cores, (int, float)) and 0 < cores < float("inf"))
        if cores is ... or not valid:
            raise InvalidRequest('the body must be {"cores": N} with N a positive number of cores, or {"cores": null}')
        assert self.engine.control is not None
        self.engine.control.pin(runtime.name, None if cores is None else float(cores))
        return web.json_response(self.engine.describe(runtime))

    async def _json_body(self, request: web.Request) -> object:
        try:
            return json.loads(await request.read())
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise InvalidRequest(f"the body is not valid JSON: {error}") from None

    async def admin_history(self, request: web.Request) -> web.Response:
        """One entry per control period: requests, mean response time, SLA, cores demanded and granted."""
        runtime = self._runtime(request)
        return web.json_response(
            {"name": runtime.name, "period_s": self.engine.config.control.period_s, "history": list(runtime.history)}
        )

    async def admin_node(self, request: web.Request) -> web.Response:
        config = self.engine.config
        control = config.control
        return web.json_response(
            {
                "cpu_cores": config.node.cpu_cores,
                "control": {
                    "policy": control.policy,
                    "period_s": control.period_s,
                    "setpoint_ratio": control.setpoint_ratio,
                    "spare_share": control.spare_share,
                    "reserved_cores": control.reserved_cores,
                    "actuator": self.engine.enforced_by,
                },
                "cores": {name: sum(e.cores for e in r.executors) for name, r in self.engine.models.items()},
            }
        )

    async def admin_set_sla(self, request: web.Request) -> web.Response:
        runtime = self._runtime(request)
        body = await self._json_body(request)
        sla = body.get("sla_ms") if isinstance(body, dict) else None
        if isinstance(sla, bool) or not isinstance(sla, (int, float)) or not 0 < sla < float("inf"):
            raise InvalidRequest('the body must be {"sla_ms": N} with N a positive number of milliseconds')
        self.engine.set_sla(runtime, float(sla))
        return web.json_response(self.engine.describe(runtime))

    async def openapi(self, request: web.Request) -> web.Response:
        return web.json_response(openapi_document(__version__))

    async def metrics(self, request: web.Request) -> web.Response:
        engine, metrics = self.engine, self.engine.metrics
        for runtime in engine.models.values():
            metrics.core_seconds.labels(runtime.name).set(engine.core_seconds(runtime))
            metrics.window_violations.labels(runtime.name).set(runtime.window_violations)
            for executor in runtime.executors:
                metrics.restarts.labels(runtime.name, executor.id).set(executor.restarts)
        return web.Response(body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


def build_app(engine: Engine) -> web.Application:
    server = engine.config.server
    app = web.Application(
        middlewares=[errors_as_json, bearer_guard(server.admin_token, server.data_token)], client_max_size=server.max_body_bytes
    )
    app[ENGINE] = engine
    h = app[HANDLERS] = Handlers(engine)
    # The route table (gateway/routes.py), which the OpenAPI document is built from too. A GET
    # answers HEAD as well, as aiohttp's web.get does.
    app.add_routes(
        [
            web.get(r.path, getattr(h, r.handler)) if r.method == "GET" else web.route(r.method, r.path, getattr(h, r.handler))
            for r in ROUTES
        ]
    )
    return app


def run(config: GatewayConfig) -> None:
    """Run the gateway on uvloop where it is installed (it serves about a third more requests per core)."""
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(serve(config))


async def serve(config: GatewayConfig) -> None:
    """Start the executors, then the HTTP server; run until SIGINT or SIGTERM."""
    engine = Engine(config, GatewayMetrics())
    await engine.start()
    app = build_app(engine)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, config.server.host, config.server.port)
    try:
        await site.start()
    except OSError as error:
        await engine.stop()
        raise SystemExit(f"cannot listen on {config.server.host}:{config.server.port}: {error}") from None
    log.info("serving %d model(s) on http://%s:%d", len(engine.models), config.server.host, config.server.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    stop.clear()
    # Drain: readiness goes false and new requests are answered 503 while the accepted ones
    # finish, for at most drain_timeout_s (a second signal cuts it short). Then stop listening,
    # end what is left (answered 503), and only then close the HTTP side: its handlers are
    # waiting on exactly those requests.
    app[HANDLERS].draining = True
    log.info("shutting down: draining %d request(s) for at most %g s", engine.active, config.server.drain_timeout_s)
    drained = asyncio.ensure_future(engine.drain(config.server.drain_timeout_s))
    signalled = asyncio.ensure_future(stop.wait())
    await asyncio.wait({drained, signalled}, return_when=asyncio.FIRST_COMPLETED)
    signalled.cancel()
    if not (drained.done() and drained.result()):
        drained.cancel()
        log.warning("shutting down with %d request(s) unfinished: they are answered 503", engine.active)
    await site.stop()
    await engine.stop()
    await runner.cleanup()
