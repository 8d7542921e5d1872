"""The HTTP front end: KServe v2 data plane, admin API and /metrics on one aiohttp app."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from http import HTTPStatus
from typing import Any, TypeVar

import orjson
from aiohttp import hdrs, web, web_urldispatcher
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from executors.tensors import KSERVE_TO_TRITON_CONFIG
from gateway import __version__
from gateway.config import GatewayConfig
from gateway.config.schema import PIPELINE_INPUT, PipelineTable
from gateway.connections import Connections, GatewayConnection, connection_cap, descriptor_limit
from gateway.content_coding import (
    COMPRESS_ON_LOOP_BYTES,
    BadCoding,
    BodyTooLarge,
    UnsupportedCoding,
    codings_of,
    compress,
    decode,
    response_coding,
)
from gateway.engine import Engine, ModelRuntime, RequestFailed, Result
from gateway.logs import ACCESS_LOG, REQUEST_ID_KEY, AccessLog
from gateway.metrics import GatewayMetrics, triton_exposition
from gateway.observe import REQUEST_ID_HEADER, new_request_id, observe, record_of
from gateway.openapi import openapi_document
from gateway.protocol import LARGE_BYTES, InferRequest, InvalidRequest, Limits, encode_infer_response, parse_infer_request
from gateway.repository import load_from_repository, repository_index
from gateway.routes import ROUTES, SLA_MS_RANGE, bearer_token_matches, not_served_reason, plane
from gateway.stopping import start_unless_stopped, stop_on_signals
from gateway.tracing import RequestTracer, start_tracing
from gateway.ui.assets import ASSETS, PAGE, read_asset
from gateway.ui.live import live_document, seconds_asked

log = logging.getLogger("gateway")

ENGINE: web.AppKey[Engine] = web.AppKey("engine", Engine)
HANDLERS: web.AppKey[Handlers] = web.AppKey("handlers")
SERVER_NAME = "gateway"
# After the drain, how long the open connections may still send a request (answered 503 with
# Connection: close) before they are closed, and then how long aiohttp may take to end their
# handlers: together within the second the gateway allows itself past drain_timeout_s.
CLOSE_GRACE_S = 0.5
HANDLER_SHUTDOWN_S = 0.25
# The access log's status of a request whose client left before its answer (aiohttp writes no
# line for it): nginx's 499, "client closed request".
CLIENT_CLOSED_REQUEST = 499
# What /v2 lists: the binary tensor data, model configuration and statistics extensions of
# Triton (perf_analyzer asks for statistics only where they are listed).
EXTENSIONS = ("binary_tensor_data", "model_configuration", "statistics", "model_repository")


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]
T = TypeVar("T")
# A body is read in pieces of at most this: each is one short copy on the event loop.
BODY_CHUNK_BYTES = 1 << 20


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error leaves as JSON {"error": ...}; an unexpected one is logged and is a 500."""
    try:
        return await handler(request)
    except (BodyTimedOut, BodyTooLargeAnnounced) as error:
        return await _answer_and_close(request, error_response(error.status, str(error)))
    except InvalidRequest as error:
        return error_response(error.status, str(error))
    except web.HTTPException as error:
        if error.status < 400:
            raise
        if error.status == 404 and (reason := not_served_reason(request.path)) is not None:
            return error_response(501, reason)
        message = error.text if error.text and not error.text.startswith(f"{error.status}:") else error.reason
        # Keep what the status needs beside the body, such as the Allow of a 405 (RFC 9110).
        kept = {k: v for k, v in error.headers.items() if k.lower() not in ("content-type", "content-length")}
        return error_response(error.status, message, kept)
    except Exception:
        log.exception("unexpected error on %s %s", request.method, request.path)
        return error_response(500, "internal error; see the gateway's log")


async def expect_continue(request: web.Request, observed: Middleware) -> web.StreamResponse | None:
    """``Expect: 100-continue`` (curl's for bodies over 1 KiB) as aiohttp answers it, but no 100
    for a Content-Length over ``max_body_bytes``; any other expectation a JSON 417, as every
    error of the gateway (aiohttp's own is plain text).

    aiohttp calls this before any middleware, and a response from it goes out without them: the
    417 is answered through ``observed`` (the observe middleware), so that it carries its request
    id, and an infer request's is logged and traced as any other refusal is."""
    if request.headers.get("Expect", "").lower() != "100-continue":
        return await observed(request, _refuse_expectation)
    if _announced_too_large(request):
        # RFC 9110 section 10.1.1: no 100 for a body that will be refused; the handler refuses it
        # before reading (read_body), counted as any body too large, and the client need not send it.
        return None
    await web_urldispatcher._default_expect_handler(request)  # aiohttp's own "100 Continue", kept exact
    return None


async def _refuse_expectation(request: web.Request) -> web.Response:
    # The body that may follow is not read: answered, then closed.
    expect = request.headers.get("Expect", "")
    refusal = error_response(417, f"unknown expectation {expect!r}: only 100-continue is supported")
    return await _answer_and_close(request, refusal)


async def _answer_and_close(request: web.Request, response: web.Response) -> web.Response:
    """Send ``response`` now, then close the connection at once: aiohttp would otherwise linger
    up to 10 s reading the rest of a body that a stalled client is not sending."""
    if REQUEST_ID_KEY in request:  # set by observe, the outermost middleware: prepared here, the response is past it
        response.headers[REQUEST_ID_HEADER] = request[REQUEST_ID_KEY]
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    request.protocol.force_close()
    return response


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
            # aiohttp reads header bytes as UTF-8 with surrogateescape: back to the same bytes, so
            # that a token that is not UTF-8 is a wrong token rather than an error.
            given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
            if not bearer_token_matches(given, token):
                bearer = given.partition(b" ")[0].lower() == b"bearer"
                problem = "the bearer token is wrong" if bearer else "no 'Authorization: Bearer' header"
                return error_response(401, f"the {name} needs a bearer token: {problem}", {"WWW-Authenticate": "Bearer"})
        return await handler(request)

    return guard


class BodyTimedOut(InvalidRequest):
    """A body still not all sent when its request's time is up: 408, and the connection closed,
    as nginx's client_body_timeout does (the rest of the body will not be waited for)."""

    def __init__(self, timeout_s: float):
        super().__init__(f"the request body did not arrive within {timeout_s * 1000:g} ms (server.request_timeout_ms)", 408)


def _announced_too_large(request: web.Request) -> bool:
    """The request's Content-Length is over ``max_body_bytes``."""
    return request.content_length is not None and request.content_length > request.client_max_size


class BodyTooLargeAnnounced(InvalidRequest):
    """A Content-Length over ``max_body_bytes``: 413 before any of the body is read, and the
    connection closed (the body that may follow is not read)."""

    def __init__(self, limit: int, announced: int):
        super().__init__(f"Maximum request body size {limit} exceeded, actual body size {announced}", 413)


def _all_lines(request: web.Request, name: str) -> str | None:
    """A list header's value over all its lines, as one (RFC 9110 5.3: two lines of it are one
    line with a comma between): its first line alone took a body gzipped twice for once."""
    lines = request.headers.getall(name, [])
    return ", ".join(lines) if lines else None


def _check_transfer_coding(transfer_encoding: str | None) -> None:
    """Only the chunked transfer coding is served: aiohttp's parser took ``gzip, chunked`` as
    chunked and handed the gzip bytes on as the body. RFC 9112 6.1: a transfer coding the server
    does not understand is answered 501."""
    if transfer_encoding is None:
        return
    others = [c.strip() for c in transfer_encoding.lower().split(",") if c.strip() != "chunked"]
    if others:
        raise InvalidRequest(f"Transfer-Encoding {', '.join(others)!r} is not served: only chunked is", status=501)


async def _read_body(request: web.Request, timeout_s: float, inflating: Executor, started: float | None = None) -> list[bytes]:
    """The request body, in pieces of at most ``BODY_CHUNK_BYTES``; ``joined`` makes them one.
    All of it must arrive within ``timeout_s`` of ``started`` (a ``perf_counter`` time; now by
    default), or BodyTimedOut: a client that stops half-way through its body holds no request
    and no connection for longer than any request may take.

    Not ``request.read()``: that copies the body twice on the event loop, and a 60 MB body
    held the loop for tens of milliseconds at its last copy. A body that aiohttp's parser
    refuses is a 400. A body in gzip or deflate arrives as sent (the connections do not inflate
    it: aiohttp did so on the loop) and is inflated here, off the loop, up to the same limit
    (gateway/content_coding.py).
    """
    limit = request.client_max_size
    if _announced_too_large(request):
        # Refused before a byte is read: answered and closed (BodyTooLargeAnnounced), so that a
        # client waiting for 100 Continue, or still sending, is not read from for nothing.
        raise BodyTooLargeAnnounced(limit, request.content_length)
    _check_transfer_coding(_all_lines(request, hdrs.TRANSFER_ENCODING))
    content_encoding = _all_lines(request, hdrs.CONTENT_ENCODING)
    try:
        codings = codings_of(content_encoding) if content_encoding else []
    except UnsupportedCoding as error:
        raise InvalidRequest(str(error), status=415) from None
    request.content.set_read_chunk_size(limit)  # as request.read() does: fewer pauses of the socket
    chunks: list[bytes] = []
    size = 0
    left_s = timeout_s - (time.perf_counter() - started if started is not None else 0.0)
    try:
        # A body already all received (most are) is read without a timer.
        async with contextlib.nullcontext() if request.content.is_eof() else asyncio.timeout(max(left_s, 0.0)):
            while chunk := await request.content.read(BODY_CHUNK_BYTES):
                size += len(chunk)
                if size > limit:
                    raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=size)
                chunks.append(chunk)
    except TimeoutError:
        raise BodyTimedOut(timeout_s) from None
    except web.RequestPayloadError as error:
        if request.transport is None or request.transport.is_closing():
            raise ConnectionResetError("the client left while sending its body") from error
        # aiohttp's message reads "400, message:\n  Can not decode content-encoding: gzip".
        raise InvalidRequest(f"the request body is malformed: {str(error).rpartition('message:')[2].strip()}") from None
    if not codings:
        return chunks
    try:
        return [await asyncio.get_running_loop().run_in_executor(inflating, _decoded, chunks, codings, limit)]
    except BodyTooLarge as error:
        raise InvalidRequest(str(error), status=413) from None
    except BadCoding as error:
        raise InvalidRequest(str(error)) from None


def _decoded(chunks: list[bytes], codings: list[str], limit: int) -> bytes:
    return decode(joined(chunks), codings, limit)


def joined(chunks: list[bytes]) -> bytes | bytearray:
    """One buffer of ``chunks``, a chunk at a time: in a worker thread, no step holds the GIL for
    long. (``b"".join`` of 60 MB holds it for tens of milliseconds, and so does ``bytearray(n)``,
    which writes zeros over all of it; ``extend`` grows the buffer in place, by ``mremap``.)"""
    if len(chunks) <= 1:
        return chunks[0] if chunks else b""
    body = bytearray()
    for chunk in chunks:
        body.extend(chunk)
    return body


def _parse_chunks(chunks: list[bytes], *args: Any) -> InferRequest:
    return parse_infer_request(joined(chunks), *args)


class JsonErrorConnection(GatewayConnection):
    """A ``GatewayConnection`` whose own errors are the documented JSON ``{"error": ...}``, and
    whose every request has its access-log line.

    What aiohttp's HTTP parser refuses (a bad request line, an invalid header, a request line or
    header over its size limits) is answered by the connection itself, before any middleware,
    and aiohttp writes it as text/plain.
    """

    __slots__ = ("_warned",)

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._warned = False

    def handle_error(
        self, request: Any, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        if status >= 500:
            super().handle_error(request, status, exc, message)  # logs it; raises if a response is under way
            text = "internal error; see the gateway's log"
        else:
            # The client's mistake (a malformed request line or header), which aiohttp logs as an
            # ERROR with its parser's traceback: one WARNING per connection says all there is.
            if not self._warned:
                self._warned = True
                problem = " ".join(str(message or exc).split())  # aiohttp's message points at the bad byte over three lines
                log.warning("malformed HTTP request from %s (%d): %s", request.remote, status, problem)
            if request.writer.output_size > 0:
                raise ConnectionError("a response is under way: no error response can follow it")
            text = f"the HTTP request is malformed: {message}" if message else HTTPStatus(status).phrase
        response = error_response(status, text)
        # Every answer carries its request's id: the middleware that names a request never ran
        # for one the parser refused (aiohttp answers it before the middlewares), so it is named here.
        if REQUEST_ID_KEY not in request:
            request[REQUEST_ID_KEY] = new_request_id()
        response.headers[REQUEST_ID_HEADER] = request[REQUEST_ID_KEY]
        response.force_close()
        return response

    async def _handle_request(self, request: Any, start_time: Any, request_handler: Any) -> Any:
        try:
            return await super()._handle_request(request, start_time, request_handler)
        except asyncio.CancelledError:
            # Its client left, and its handler was cancelled (handler_cancellation): aiohttp
            # writes the access line after a response alone.
            self.log_access(request, web.Response(status=CLIENT_CLOSED_REQUEST), start_time)
            raise


class Handlers:
    def __init__(self, engine: Engine):
        self.engine = engine
        server = engine.config.server
        self.limits = Limits(server.max_json_depth, server.max_elements)
        self.request_timeout_s = server.request_timeout_ms / 1000
        self.compress_min_bytes = server.compress_min_bytes
        self.draining = False  # set on SIGTERM/SIGINT: not ready, no new requests
        # Decoding a large request (and encoding a large response) runs here, off the event loop.
        # One thread: the work holds the GIL, so more threads would only make the loop wait longer.
        self.codec = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gateway-codec")
        # Compressed bodies are inflated here (zlib lets the GIL go): a pool of their own, so
        # that neither a pipeline's slow functions nor a large decode hold them up.
        self.inflating = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gateway-inflate")

    def _runtime(self, request: web.Request) -> ModelRuntime:
        """The model the path names; a pipeline is served as a model (the same fields)."""
        name = request.match_info["model"]
        version = request.match_info.get("version")
        runtime = self.engine.served(name, version)
        if runtime is None:
            raise InvalidRequest(self.engine.not_served(name, version), status=404)
        return runtime

    async def _settled_runtime(self, request: web.Request) -> ModelRuntime:
        """``_runtime``, once a reload of the model has swapped it for its successor: a request that
        came while the model it replaces drained got 404, though the model was served before and after."""
        await self.engine.settled(request.match_info["model"])
        return self._runtime(request)

    def _model(self, request: web.Request) -> ModelRuntime:
        """The model the admin path names: by a name GET /admin/models lists (a version's own
        ``NAME.vN`` too: each version has its SLA, cores and executors), else as clients name it
        (a repository model's name: its highest version). A pipeline has no SLA, cores or
        batches of its own to set (its steps' models have them), so it is no model here."""
        runtime = self.engine.listed(request.match_info["model"]) or self._runtime(request)
        pipeline = self.engine.pipelines.get(runtime.name)
        if pipeline is not None:
            steps = ", ".join(sorted({s.model for s in pipeline.graph.table.steps if s.model is not None}))
            raise InvalidRequest(
                f"'{runtime.name}' is a pipeline, not a model of the admin API: set its steps' models ({steps})", status=404
            )
        return runtime

    async def _model_and_body(self, request: web.Request) -> tuple[ModelRuntime, object]:
        """The model an admin PUT names, and its JSON body. The model is looked up again once the
        body is in: an unload or a reload meanwhile would have the change go to a model no longer
        served (a 500 for cores, a 200 that changed nothing, an SLA split between two runtimes)."""
        self._model(request)  # an unknown model is a 404 before any body is read
        body = await self._json_body(request)
        return self._model(request), body

    # -- KServe v2 --------------------------------------------------------------------------
    async def server_metadata(self, request: web.Request) -> web.Response:
        return web.json_response({"name": SERVER_NAME, "version": __version__, "extensions": list(EXTENSIONS)})

    async def model_stats(self, request: web.Request) -> web.Response:
        # Without a version in the path, Triton answers with every version of the model.
        runtime = await self._settled_runtime(request)
        every_version = "version" not in request.match_info
        return web.json_response({"model_stats": self.engine.triton_statistics(runtime, every_version)})

    async def all_model_stats(self, request: web.Request) -> web.Response:
        return web.json_response({"model_stats": self.engine.triton_statistics(None, every_version=True)})

    async def live(self, request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def ready(self, request: web.Request) -> web.Response:
        ready = not self.draining and all(r.ready for r in self.engine.models.values())
        return web.json_response({"ready": ready}, status=200 if ready else 503)

    async def model_metadata(self, request: web.Request) -> web.Response:
        runtime = await self._settled_runtime(request)
        signature = runtime.signature
        assert signature is not None
        return web.json_response(
            {
                "name": runtime.served_name,
                "versions": self.engine.versions_of(runtime),
                "platform": getattr(runtime, "platform", "onnxruntime_onnx"),
                "inputs": [t.as_json() for t in signature.inputs],
                "outputs": [t.as_json() for t in signature.outputs],
            }
        )

    async def model_ready(self, request: web.Request) -> web.Response:
        runtime = await self._settled_runtime(request)
        ready = runtime.ready and not self.draining
        return web.json_response({"name": runtime.served_name, "ready": ready}, status=200 if ready else 503)

    async def model_config(self, request: web.Request) -> web.Response:
        """Triton's model configuration, which perf_analyzer reads before it sends anything."""
        return web.json_response(self.triton_config(await self._settled_runtime(request)))

    @staticmethod
    def triton_config(runtime: ModelRuntime) -> dict[str, Any]:
        """Triton's model configuration of a model (or pipeline), for HTTP and gRPC alike."""
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
            "name": runtime.served_name,
            "platform": getattr(runtime, "platform", "onnxruntime_onnx"),
            "backend": "onnxruntime",
            "max_batch_size": runtime.config.max_batch_size if batching else 0,
            "input": tensors(signature.inputs),
            "output": tensors(signature.outputs),
            "parameters": {"sla_ms": {"string_value": str(runtime.sla_ms)}},
        }
        if batching:
            config["dynamic_batching"] = {}
            levels = getattr(runtime.config, "priority_levels", 1)
            if levels > 1:  # Triton's fields of its priority queue, where the model has levels
                config["dynamic_batching"] = {"priority_levels": levels, "default_priority_level": runtime.config.default_level}
        graph = getattr(runtime, "graph", None)
        if graph is not None:
            # Triton's ensemble always lists its steps; perf_analyzer reads them to find the
            # composing models (it crashed on an "ensemble" without them).
            config["backend"] = ""
            config["ensemble_scheduling"] = {"step": ensemble_steps(graph.table)}
        return config

    async def infer(self, request: web.Request) -> web.Response:
        """One infer request; it ends in exactly one outcome, accounted for in /metrics."""
        # time.perf_counter, as every timestamp of the engine: uvloop's loop.time() has 1 ms
        # resolution and stands still within a loop iteration.
        arrival = time.perf_counter()
        # Whether the drain had begun when the request came, not once a reload's swap let it go
        # on: one that waited out the swap from before SIGTERM was answered 503, "no new requests".
        admitted = not self.draining
        runtime = await self._settled_runtime(request)
        self.engine.received(runtime)
        outcome, result = "internal_error", None
        record = record_of(request)
        try:
            response, outcome, result = await self._infer(request, runtime, arrival, admitted)
            return response
        except BodyTimedOut:
            outcome = "timeout"
            raise
        except (InvalidRequest, web.HTTPException) as error:
            outcome = "too_large" if error.status == 413 else "invalid"
            record.name_from_body(getattr(error, "request_id", None))
            raise
        except (asyncio.CancelledError, ConnectionError):
            outcome = "client_gone"
            raise
        finally:
            record.outcome = outcome
            self.engine.record(runtime, outcome, arrival, result)

    async def _infer(
        self, request: web.Request, runtime: ModelRuntime, arrival: float, admitted: bool
    ) -> tuple[web.Response, str, Result | None]:
        assert runtime.signature is not None
        if not admitted:
            return error_response(503, "the gateway is shutting down; no new requests"), "shutdown", None
        chunks = await _read_body(request, self.request_timeout_s, self.inflating, arrival)
        parsed = await self.off_loop(
            sum(len(chunk) for chunk in chunks),
            _parse_chunks,
            chunks,
            request.headers.get("Inference-Header-Content-Length"),
            runtime.signature,
            runtime.config.max_batch_size,
            self.limits,
        )
        record = record_of(request)
        record.name_from_body(parsed.id)
        record.entered_queue()
        try:
            result, datatypes = await self.engine.answer(runtime, parsed, arrival)
        except RequestFailed as error:
            record.failed(str(error), error.dispatched)
            return error_response(error.status, str(error), error.headers), error.outcome, None
        record.served(result)
        parameters = result.parameters()
        payload, header_length = await self.off_loop(
            sum(output.nbytes for output in result.outputs.values()),
            encode_infer_response,
            runtime.served_name,
            parsed,
            result.outputs,
            datatypes,
            parameters,
            runtime.version,
        )
        # Inference-Header-Content-Length counts the JSON header's bytes before any compression,
        # as Triton's does and tritonclient reads it (it inflates the whole body first).
        headers = {} if header_length is None else {"Inference-Header-Content-Length": str(header_length)}
        if len(payload) >= self.compress_min_bytes and (coding := response_coding(_all_lines(request, "Accept-Encoding"))):
            # Here, not by aiohttp once the handler has returned: the time is the request's, in
            # its response time and statistics, as the encoding's is.
            payload = await self.off_loop(len(payload), compress, payload, coding, limit=COMPRESS_ON_LOOP_BYTES)
            headers["Content-Encoding"] = coding
        content_type = "application/json" if header_length is None else "application/octet-stream"
        return web.Response(body=payload, content_type=content_type, headers=headers), "success", result

    async def off_loop(self, size: int, function: Callable[..., T], *args: Any, limit: int = LARGE_BYTES) -> T:
        """``function(*args)``, in the codec thread when it works on more than ``limit`` bytes.

        A large request's checks run before its tensors are decoded and refuse it cheaply, but a
        60 MB body still takes a second to decode: meanwhile the loop answers the others, health
        probes included (protocol.py does that work in short steps, so the GIL is released often).
        """
        if size <= limit:
            return function(*args)
        return await asyncio.get_running_loop().run_in_executor(self.codec, function, *args)

    # -- admin ------------------------------------------------------------------------------
    async def admin_models(self, request: web.Request) -> web.Response:
        # As each is reached by its own route: not one being loaded or unloaded.
        return web.json_response({"models": [self.engine.describe(r) for r in self.engine.listed_models().values()]})

    async def admin_model(self, request: web.Request) -> web.Response:
        return web.json_response(self.engine.describe(self._model(request)))

    async def admin_pin_cores(self, request: web.Request) -> web.Response:
        """Pin a model's cores ({"cores": 0.5}) or hand them back to the policy ({"cores": null})."""
        runtime, body = await self._model_and_body(request)
        cores = body.get("cores", ...) if isinstance(body, dict) else ...
        # More than the node's cores is no pin the supervisor could grant.
        node_cores = self.engine.config.node.cpu_cores
        valid = cores is None or (not isinstance(cores, bool) and isinstance(cores, (int, float)) and 0 < cores <= node_cores)
        if cores is ... or not valid:
            raise InvalidRequest(
                f'the body must be {{"cores": N}} with N over 0 and at most the node\'s {node_cores:g} cores '
                '(node.cpu_cores), or {"cores": null}'
            )
        if self.engine.control is None:
            raise InvalidRequest("this dispatcher sets no cores: its workers' controllers do (pin them on the worker)")
        self.engine.control.pin(runtime.name, None if cores is None else float(cores))
        return web.json_response(self.engine.describe(runtime))

    async def admin_set_replicas(self, request: web.Request) -> web.Response:
        """How many workers run a model's CPU executor ({"replicas": 2}), or every one ({"replicas": null})."""
        runtime, body = await self._model_and_body(request)
        replicas = body.get("replicas", ...) if isinstance(body, dict) else ...
        if replicas is ... or not (replicas is None or (type(replicas) is int and replicas >= 1)):
            raise InvalidRequest('the body must be {"replicas": N} with N a whole number from 1, or {"replicas": null}')
        self.engine.set_replicas(runtime, replicas)
        return web.json_response(self.engine.describe(runtime))

    async def admin_set_dispatch_batch(self, request: web.Request) -> web.Response:
        """A planned CPU batch size ({"dispatch_batch": 4}; 1: none), at most the model's max_batch_size."""
        runtime, body = await self._model_and_body(request)
        rows = body.get("dispatch_batch", ...) if isinstance(body, dict) else ...
        if type(rows) is not int:
            raise InvalidRequest('the body must be {"dispatch_batch": N} with N a whole number from 1')
        self.engine.set_dispatch_batch(runtime, rows)
        return web.json_response(self.engine.describe(runtime))

    # -- Triton's model repository extension ------------------------------------------------------
    async def repository_index(self, request: web.Request) -> web.Response:
        body = await self._json_body(request) if request.can_read_body else {}
        ready_only = body.get("ready", False) if isinstance(body, dict) else False
        if not isinstance(ready_only, bool):
            raise InvalidRequest("'ready' must be true or false")
        return web.json_response(repository_index(self.engine, ready_only))

    async def repository_load(self, request: web.Request) -> web.Response:
        self._refuse_while_draining()
        body = await self._json_body(request) if request.can_read_body else {}
        parameters = body.get("parameters", {}) if isinstance(body, dict) else None
        if not isinstance(parameters, dict):
            raise InvalidRequest("'parameters' must be an object")
        await load_from_repository(self.engine, request.match_info["model"], parameters.get("config"), parameters)
        return web.json_response({})

    async def repository_unload(self, request: web.Request) -> web.Response:
        self._refuse_while_draining()
        # Triton's body ({"parameters": {"unload_dependents": ...}}) is read as load's is: a body
        # that is not a JSON object is refused, not ignored.
        body = await self._json_body(request) if request.can_read_body else {}
        if not isinstance(body, dict) or not isinstance(body.get("parameters", {}), dict):
            raise InvalidRequest("the body must be a JSON object, its 'parameters' an object")
        await self.engine.unload_model(request.match_info["model"])
        return web.json_response({})

    def _refuse_while_draining(self) -> None:
        if self.draining:
            raise InvalidRequest("the gateway is shutting down; no model is loaded or unloaded now", status=503)

    async def admin_cluster(self, request: web.Request) -> web.Response:
        if self.engine.cluster is None:
            raise InvalidRequest("this gateway serves alone: it has no cluster ([cluster] in its config)")
        return web.json_response(self.engine.cluster.describe())

    async def _json_body(self, request: web.Request) -> object:
        # orjson, not json: it refuses NaN and Infinity, which are not JSON, and nesting past
        # 1024 levels, where json.loads raises RecursionError.
        try:
            return orjson.loads(joined(await _read_body(request, self.request_timeout_s, self.inflating)))
        except orjson.JSONDecodeError as error:
            raise InvalidRequest(f"the body is not valid JSON: {error}") from None

    async def admin_history(self, request: web.Request) -> web.Response:
        """One entry per control period: requests, mean response time, SLA, cores demanded and granted."""
        runtime = self._model(request)
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
        runtime, body = await self._model_and_body(request)
        sla = body.get("sla_ms") if isinstance(body, dict) else None
        low, high = SLA_MS_RANGE
        if isinstance(sla, bool) or not isinstance(sla, (int, float)) or not low <= sla <= high:
            raise InvalidRequest(
                f'the body must be {{"sla_ms": N}} with N from {low:g} to {high:.0f} milliseconds (a microsecond to a day)'
            )
        self.engine.set_sla(runtime, float(sla))
        return web.json_response(self.engine.describe(runtime))

    async def admin_live(self, request: web.Request) -> web.Response:
        """The live page's per-second series (gateway/ui/live.py)."""
        return web.json_response(live_document(self.engine, seconds_asked(request.query)))

    async def ui_page(self, request: web.Request) -> web.Response:
        return web.Response(text=read_asset(PAGE), content_type="text/html")

    async def ui_asset(self, request: web.Request) -> web.Response:
        name = request.path.removeprefix("/ui/")
        return web.Response(text=read_asset(name), content_type=ASSETS[name])

    async def openapi(self, request: web.Request) -> web.Response:
        return web.json_response(openapi_document(__version__))

    async def metrics(self, request: web.Request) -> web.Response:
        """The gateway's own series, then Triton's per-model ones (gateway/metrics.py)."""
        triton = triton_exposition(self.engine.triton_totals()).encode()
        body = generate_latest(self.engine.metrics.registry) + triton
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def build_app(engine: Engine, tracer: RequestTracer | None = None) -> web.Application:
    """The gateway's app; with ``tracer``, each infer request's spans go to it (gateway/tracing.py)."""
    server = engine.config.server
    observed = observe(tracer)
    app = web.Application(
        middlewares=[observed, errors_as_json, bearer_guard(server.admin_token, server.data_token)],
        client_max_size=server.max_body_bytes,
    )
    app[ENGINE] = engine
    h = app[HANDLERS] = Handlers(engine)
    # The route table (gateway/routes.py), which the OpenAPI document is built from too. A GET
    # answers HEAD as well, as aiohttp's web.get does.
    expect = functools.partial(expect_continue, observed=observed)
    app.add_routes(
        [
            web.get(r.path, getattr(h, r.handler), expect_handler=expect)
            if r.method == "GET"
            else web.route(r.method, r.path, getattr(h, r.handler), expect_handler=expect)
            for r in ROUTES
        ]
    )

    async def close_when_draining(request: web.Request, response: web.StreamResponse) -> None:
        # Once draining, every answer ends its connection (Go's Server.Shutdown does the same),
        # so that no client sends its next request on a connection about to close. aiohttp 3.14
        # has written the Connection header of force_close() before this hook: set both.
        if h.draining:
            response.force_close()
            response.headers["Connection"] = "close"

    app.on_response_prepare.append(close_when_draining)
    return app


def run(config: GatewayConfig) -> None:
    """Run the gateway on uvloop where it is installed (it serves about a third more requests per core)."""
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    # While the codec thread decodes a large body, the loop waits up to the GIL's switch interval
    # (5 ms by default) each time it wakes; a probe wakes it a few times. 1 ms keeps the loop's
    # answers prompt, for a few more switches of a thread that is rarely busy.
    sys.setswitchinterval(min(sys.getswitchinterval(), 0.001))
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(serve(config))


async def serve(config: GatewayConfig) -> None:
    """Start the executors, then the HTTP server; run until SIGINT or SIGTERM."""
    # Heard before the engine makes the executors' groups and socket folder (gateway/stopping.py).
    stop = stop_on_signals()
    engine = Engine(config, GatewayMetrics())
    if not await start_unless_stopped(engine.start(), stop, engine.stop):
        log.info("stopped while starting")
        return
    tracer = start_tracing(config.tracing)
    app = build_app(engine, tracer)
    # What start-up made (modules, models, metrics: 74,000 objects) lives as long as the gateway:
    # frozen out of the collector's reach, a full collection walks only what serving made since.
    # A full collection stalls the event loop, and every request in flight: 82-166 ms without the
    # freeze, 44 ms with it, at 400 requests/s on the developers' 2-core VM (benchmarks/gc_pauses.py).
    # The cost: reference cycles among start-up's objects are never freed, should a model loaded
    # at start-up be unloaded later (its objects freed by reference counting still are).
    gc.collect()
    gc.freeze()
    # handler_cancellation: a client that disconnects cancels its handler, so its request leaves
    # the queue at once (aiohttp 3.9+ lets handlers run on by default).
    runner = web.AppRunner(
        app, access_log=None, handle_signals=False, handler_cancellation=True, shutdown_timeout=HANDLER_SHUTDOWN_S
    )
    await runner.setup()
    try:
        connections, listener = await listen(runner, config)
    except OSError as error:
        await engine.stop()
        raise SystemExit(f"cannot listen on {config.server.host}:{config.server.port}: {error}") from None
    log.info(
        "serving %d model(s) on http://%s:%d, at most %d connections",
        len(engine.models),
        config.server.host,
        listener.sockets[0].getsockname()[1],  # port 0: the one the system chose
        connections.table.max_connections,
    )
    grpc_server = None
    if config.server.grpc_port:
        from gateway.grpc_server import start_grpc

        try:
            grpc_server = await start_grpc(app[HANDLERS], config.server.host, config.server.grpc_port, tracer)
        except (OSError, RuntimeError) as error:
            listener.close()
            await engine.stop()
            raise SystemExit(f"cannot listen on {config.server.host}:{config.server.grpc_port} (gRPC): {error}") from None
        log.info("serving KServe v2 gRPC on %s:%d", config.server.host, config.server.grpc_port)
    await stop.wait()
    stop.clear()
    # Drain: readiness goes false and new requests are answered 503 while the accepted ones
    # finish, for at most drain_timeout_s (a second signal cuts it short); every answer from now
    # on closes its connection. Then stop listening, end what is left (answered 503), give the
    # open connections CLOSE_GRACE_S to be answered and closed, and only then close the HTTP
    # side: its handlers are waiting on exactly those requests.
    app[HANDLERS].draining = True
    log.info("shutting down: draining %d request(s) for at most %g s", engine.active, config.server.drain_timeout_s)
    drained = asyncio.ensure_future(engine.drain(config.server.drain_timeout_s))
    signalled = asyncio.ensure_future(stop.wait())
    await asyncio.wait({drained, signalled}, return_when=asyncio.FIRST_COMPLETED)
    signalled.cancel()
    if not (drained.done() and drained.result()):
        drained.cancel()
        log.warning("shutting down with %d request(s) unfinished: they are answered 503", engine.active)
    listener.close()
    # The engine's stop answers what is left 503 while both protocols give their calls the grace
    # to carry those answers (gRPC's stop cancels the calls it still holds after it: stopped
    # first, it cancelled the requests left by the drain unanswered, counted as clients gone).
    closing = [engine.stop(), connections.close_all(CLOSE_GRACE_S)]
    if grpc_server is not None:
        closing.append(grpc_server.stop(CLOSE_GRACE_S))
    await asyncio.gather(*closing)
    await runner.cleanup()
    if tracer is not None:
        tracer.shutdown()


async def listen(
    runner: web.AppRunner, config: GatewayConfig, address: tuple[str, int] | None = None, listeners: int | None = None
) -> tuple[Connections, asyncio.Server]:
    """Listen as aiohttp's TCPSite does, with each connection a ``GatewayConnection``.

    The cap on connections is kept under the descriptor limit, and each connection's head has its
    deadline (gateway/connections.py). ``address``: other than the server's (a worker's HTTP
    port); ``listeners``: the process's listening sockets that share its descriptors.
    """
    server = config.server
    assert runner.server is not None, "runner.setup() makes the server"
    manager = runner.server
    host, port = address or (server.host, server.port)
    listeners = listeners or (2 if server.grpc_port else 1)
    # A client that reads none of its answers for a request's whole time is closed (nginx's send_timeout).
    cap = connection_cap(server.max_connections, descriptor_limit(), listeners)
    connections = Connections(server.header_timeout_s, cap, server.request_timeout_ms / 1000)
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(
        # The access log (--access-log) is written only where gateway/logs.py enabled it.
        # auto_decompress off: a compressed body is inflated by _read_body, capped and off the loop.
        lambda: JsonErrorConnection(
            manager, connections, loop=loop, access_log=ACCESS_LOG, access_log_class=AccessLog, auto_decompress=False
        ),
        host,
        port,
        backlog=128,  # aiohttp's TCPSite default
    )
    return connections, listener


def ensemble_steps(table: PipelineTable) -> list[dict[str, Any]]:
    """A pipeline's model steps as Triton's ``ensemble_scheduling.step``: each model's inputs and
    outputs mapped to the pipeline's tensors (its own inputs and outputs by their names, a step's
    tensor as "STEP/NAME"). A function step runs no model, so Triton's form has no place for it:
    the tensors it gives appear as the steps' inputs it feeds."""
    named = {output.source: output.name for output in table.outputs}
    sources = [o.source for o in table.outputs if o.source] + [s for step in table.steps for s in step.inputs.values()]
    read_from = [s.partition("/") for s in sources]
    steps = []
    for step in table.steps:
        if step.model is None:
            continue
        inputs = {name: _ensemble_tensor(source, named) for name, source in step.inputs.items()}
        read = {tensor for source, _, tensor in read_from if source == step.name}
        outputs = {name: named.get(f"{step.name}/{name}", f"{step.name}/{name}") for name in sorted(read)}
        steps.append({"model_name": step.model, "model_version": -1, "input_map": inputs, "output_map": outputs})
    return steps


def _ensemble_tensor(source: str, named: dict[str, str]) -> str:
    """The ensemble's name of a step's input: the pipeline's input by its own name, a step's tensor
    as "STEP/NAME", or as the pipeline's output it also is (``named``: what its step's
    ``output_map`` calls it; as "STEP/NAME", the input read a tensor that no step gave)."""
    step, _, tensor = source.partition("/")
    return tensor if step == PIPELINE_INPUT else named.get(source, source)
