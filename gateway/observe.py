"""What the gateway tells of each request: its id, its line in the request log, its spans.

Every HTTP request gets an id: the client's ``X-Request-ID`` when it gives a usable one, for an
infer request without one the KServe body's ``id``, else one made here; the response carries it
back in ``X-Request-ID``. An infer request also carries a ``RequestRecord``, on which the handler
notes when each phase ended (read and checked, waited for, answered). Once the request is
answered, the record becomes one line of the request log (gateway/logs.py) and, with tracing on,
the request's spans (gateway/tracing.py): both are written from the same timestamps (``report``).
A gRPC infer request has its record too (gateway/grpc_server.py), named by its ``x-request-id``
metadata or its message's ``id``, its trace context in its metadata.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gateway.logs import REQUEST_ID_KEY, REQUEST_LOG, REQUEST_START_KEY, log_request

if TYPE_CHECKING:
    from gateway.engine import Result
    from gateway.tracing import RequestTracer

REQUEST_ID_HEADER = "X-Request-ID"
# Heroku's router takes ids of 20 to 200 characters and replaces the others; here any length up
# to 200 is taken (a KServe body's id is often short), in visible ASCII only, so that a client's
# id can break neither a response header nor a line of the text log.
_USABLE_ID = re.compile(r"[\x21-\x7e]{1,200}")
# gateway/routes.py names the infer route's handler so: its requests get a record.
INFER_HANDLER = "infer"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]


def usable_request_id(value: object) -> str | None:
    """``value`` as a request id, or None when it is not one (not a string, empty, too long, not visible ASCII)."""
    return value if isinstance(value, str) and _USABLE_ID.fullmatch(value) else None


def new_request_id() -> str:
    # 128 random bits in 32 hex digits, as uuid4().hex without building a UUID on every request.
    return os.urandom(16).hex()


@dataclass
class RequestRecord:
    """One infer request's id and the times (time.perf_counter, as the engine's) its phases ended."""

    id: str
    id_given: bool  # the client named it (header or body): a body's id does not replace it then
    model: str
    start: float  # the request reached the gateway's handlers
    parsed: float | None = None  # its body read and checked: it entered the model's queue
    waited: float | None = None  # its result, or its error, reached the handler
    result: Result | None = None  # what it was served with: device, executor, batch, timings
    error: str | None = None  # why it failed once queued
    dispatched: float | None = None  # the dispatch core began its batch, of one that failed after (a Result says it)
    outcome: str | None = None  # how it ended, as /metrics counts it; None: it never reached a served model
    status: int | None = None  # the HTTP status answered (over gRPC, the one its code stands for); None: the client left first
    end: float | None = None  # the handler returned its response
    rpc_method: str | None = None  # the gRPC method that carried it (ModelInfer, ModelStreamInfer); None: HTTP
    rpc_code: int | None = None  # the gRPC status code answered, as its number

    def name_from_body(self, body_id: object) -> None:
        """The KServe body's ``id`` names the request, when the client sent no usable header."""
        usable = usable_request_id(body_id)
        if usable is not None and not self.id_given:
            self.id, self.id_given = usable, True

    def entered_queue(self) -> None:
        self.parsed = time.perf_counter()

    def served(self, result: Result) -> None:
        self.waited, self.result = time.perf_counter(), result

    def failed(self, message: str, dispatched: float | None = None) -> None:
        """It failed once queued: with ``dispatched``, once its batch had begun (timed out while
        it ran, its executor failed, the model refused the input)."""
        self.waited, self.error, self.dispatched = time.perf_counter(), message, dispatched

    @property
    def total_ms(self) -> float | None:
        return None if self.end is None else (self.end - self.start) * 1000

    def fields(self) -> dict[str, Any]:
        """The request log's fields: what a line says of the request."""
        result = self.result
        total = self.total_ms
        return {
            "model": self.model,
            "id": self.id,
            "protocol": "http" if self.rpc_method is None else "grpc",
            "status": self.status,
            "outcome": self.outcome,
            "executed_on": result.executed_on if result else None,
            "executor": result.executor if result else None,
            "batch_size": result.batch_size if result else None,
            "queue_ms": round(result.queue_ms, 3) if result else None,
            "compute_ms": round(result.compute_ms, 3) if result else None,
            "total_ms": round(total, 3) if total is not None else None,
        }


def report(record: RequestRecord, tracer: RequestTracer | None, carrier: Mapping[str, str]) -> None:
    """The request's line of the request log and, with a tracer, its spans, once it has been
    answered or its client has left; ``carrier`` holds its caller's trace context (traceparent)."""
    record.end = time.perf_counter()
    if REQUEST_LOG.isEnabledFor(logging.INFO):  # off in text: no fields built for nothing
        log_request(record.fields())
    if tracer is not None:
        tracer.trace(record, carrier)


_RECORD = web.RequestKey("request_record", RequestRecord)


def record_of(request: web.Request) -> RequestRecord:
    """The record of an infer request (``observe``'s middleware made it)."""
    return request[_RECORD]


def observe(tracer: RequestTracer | None) -> Middleware:
    """The outermost middleware: every response carries ``X-Request-ID``; every infer request,
    answered or left by its client, is logged and, with a tracer, traced."""

    @web.middleware
    async def observed(request: web.Request, handler: Handler) -> web.StreamResponse:
        start = request[REQUEST_START_KEY] = time.perf_counter()
        given = usable_request_id(request.headers.get(REQUEST_ID_HEADER))
        id_ = request[REQUEST_ID_KEY] = given or new_request_id()
        record = None
        if getattr(request.match_info.handler, "__name__", None) == INFER_HANDLER:
            record = request[_RECORD] = RequestRecord(id_, given is not None, request.match_info.get("model", ""), start)
        response: web.StreamResponse | None = None
        try:
            response = await handler(request)
            return response
        finally:
            if record is not None:
                id_ = record.id  # the body's id may have named it meanwhile
            request[REQUEST_ID_KEY] = id_
            if response is not None and not response.prepared:
                response.headers[REQUEST_ID_HEADER] = id_
            if record is not None:
                record.status = response.status if response is not None else None
                report(record, tracer, request.headers)

    return observed
