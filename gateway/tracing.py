"""OpenTelemetry spans of each infer request, sent with OTLP over HTTP (``[tracing]`` in the config).

An optional extra (``pip install 'sla-gateway[tracing]'``): this module imports OpenTelemetry
only once tracing is switched on, so the gateway runs without it, and the scheduling code never
sees it. The spans are written when the request has been answered, from the timestamps its
``RequestRecord`` holds (gateway/observe.py), so that the event loop does no tracing work while
a request waits and the spans tell the same times as the request log:

    POST /v2/models/{model}/infer    the whole request (kind SERVER), a child of the caller's
    │                                span when the request carries a W3C traceparent (over gRPC,
    │                                inference.GRPCInferenceService/ModelInfer, traceparent metadata)
    ├── receive                      its body read, checked and decoded
    ├── queue                        in the model's queue, until the dispatch core started its batch
    ├── dispatch                     the batch: inputs stacked, sent to the executor, run, answered
    │   └── execute                  the executor's own compute time, ending when its answer arrived
    └── reply                        the result taken up by the handler and encoded

Each span has the model and the request id; dispatch, execute and the request's span also the
batch size, the device (cpu or gpu) and the executor. A request refused or failed ends at the
phase where it ended, that span and the request's marked as errors. ``request_spans`` is that
plan as data (no OpenTelemetry); ``RequestTracer`` writes it through a tracer provider.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.config import TracingConfig
    from gateway.observe import RequestRecord

# What the extra brings: the API, the SDK and the OTLP/HTTP exporter.
PACKAGES = {
    "opentelemetry.trace": "opentelemetry-api",
    "opentelemetry.sdk.trace": "opentelemetry-sdk",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter": "opentelemetry-exporter-otlp-proto-http",
}
PHASES = ("receive", "queue", "dispatch", "execute", "reply")
# The request's span is named as OpenTelemetry's HTTP conventions name a server span: method and route.
INFER_ROUTE = "/v2/models/{model}/infer"
INFER_ROUTE_SPAN = f"POST {INFER_ROUTE}"
# Over gRPC, as OpenTelemetry's RPC conventions name a server span: the service, then the method.
GRPC_SERVICE = "inference.GRPCInferenceService"
INSTRUMENTATION = "sla-gateway"
# At shutdown, how long the spans not yet sent may take to leave: an unreachable collector must
# not hold the gateway's exit (its exporter retries for up to 10 s).
FLUSH_TIMEOUT_S = 2.0

Attribute = str | int | float | bool


@dataclass(frozen=True)
class PlannedSpan:
    """A span to write: ``parent`` is another planned span's name, or None for the request's own."""

    name: str
    start: float  # time.perf_counter seconds
    end: float
    parent: str | None
    attributes: dict[str, Attribute] = field(default_factory=dict)
    error: str | None = None  # the span ended the request with this error


def missing_packages() -> list[str]:
    """The packages of the tracing extra that cannot be imported here."""
    missing = []
    for module, package in PACKAGES.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(package)
    return missing


def request_spans(record: RequestRecord) -> list[PlannedSpan]:
    """The request's span, then its phases, up to the one where it ended."""
    end = record.end if record.end is not None else time.perf_counter()
    result = record.result
    common: dict[str, Attribute] = {"gateway.model": record.model, "gateway.request_id": record.id}
    served: dict[str, Attribute] = {}
    if result is not None:
        served = {
            "gateway.batch_size": result.batch_size,
            "gateway.device": result.executed_on,
            "gateway.executor": result.executor,
        }
    failure = None
    if record.status is None:
        failure = "the client left before its answer"
    elif record.status >= 400:
        failure = record.error or f"answered {record.status}" + (f" ({record.outcome})" if record.outcome else "")
    attributes = {**common, **served, **_protocol_attributes(record)}
    if record.outcome is not None:
        attributes["gateway.outcome"] = record.outcome
    spans = [PlannedSpan("request", record.start, end, None, attributes, failure)]

    if record.parsed is None:  # it ended before it could be queued: refused, invalid, or left
        return [*spans, PlannedSpan("receive", record.start, end, "request", dict(common), failure)]
    spans.append(PlannedSpan("receive", record.start, record.parsed, "request", dict(common)))
    if result is None:
        until = record.waited if record.waited is not None else end
        if record.dispatched is None:  # it ended in the queue: refused, timed out, or left
            spans.append(PlannedSpan("queue", record.parsed, until, "request", dict(common), failure))
            return spans
        # It failed once its batch had begun (timed out while it ran, its executor failed): the
        # queue ended there, and the batch's round trip ended with the error.
        began = min(max(record.parsed, record.dispatched), until)
        spans.append(PlannedSpan("queue", record.parsed, began, "request", dict(common)))
        spans.append(PlannedSpan("dispatch", began, until, "request", dict(common), failure))
        return spans
    started = max(record.parsed, result.started)
    compute_start = max(started, result.ended - result.compute_ms / 1000)
    spans += [
        PlannedSpan("queue", record.parsed, started, "request", dict(common)),
        PlannedSpan("dispatch", started, result.ended, "request", {**common, **served}),
        PlannedSpan(
            "execute", compute_start, result.ended, "dispatch", {**common, **served, "gateway.compute_ms": result.compute_ms}
        ),
        PlannedSpan("reply", result.ended, end, "request", dict(common), failure),
    ]
    return spans


def request_span_name(record: RequestRecord) -> str:
    """The request's own span's name: its route over HTTP, its method over gRPC."""
    return INFER_ROUTE_SPAN if record.rpc_method is None else f"{GRPC_SERVICE}/{record.rpc_method}"


def _protocol_attributes(record: RequestRecord) -> dict[str, Attribute]:
    """What OpenTelemetry's HTTP or RPC conventions say of the request's span."""
    if record.rpc_method is None:
        attributes: dict[str, Attribute] = {"http.request.method": "POST", "http.route": INFER_ROUTE}
        if record.status is not None:
            attributes["http.response.status_code"] = record.status
        return attributes
    attributes = {"rpc.system": "grpc", "rpc.service": GRPC_SERVICE, "rpc.method": record.rpc_method}
    if record.rpc_code is not None:
        attributes["rpc.grpc.status_code"] = record.rpc_code
    return attributes


class RequestTracer:
    """Writes each answered request's spans through an OpenTelemetry tracer provider."""

    def __init__(self, provider: Any):
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self._tracer = provider.get_tracer(INSTRUMENTATION)
        # W3C Trace Context alone: a caller's traceparent (and tracestate) make the request's
        # span its child, whatever propagators the process has set globally.
        self._propagator = TraceContextTextMapPropagator()
        # The records' times are time.perf_counter seconds; spans take nanoseconds since the epoch.
        self._epoch_offset_ns = time.time_ns() - time.perf_counter_ns()

    def _ns(self, seconds: float) -> int:
        return int(seconds * 1e9) + self._epoch_offset_ns

    def trace(self, record: RequestRecord, carrier: Mapping[str, str]) -> None:
        """The request's spans, children of the caller's span that ``carrier`` (its HTTP headers
        or gRPC metadata) names in W3C ``traceparent`` and ``tracestate``, if it does."""
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind, Status, StatusCode

        caller = self._propagator.extract(carrier=carrier)
        plan = request_spans(record)
        spans: dict[str, Any] = {}
        for planned in plan:
            if planned.parent is None:
                name = request_span_name(record)
                context, kind = caller, SpanKind.SERVER
            else:
                name, context, kind = planned.name, trace.set_span_in_context(spans[planned.parent]), SpanKind.INTERNAL
            span = self._tracer.start_span(
                name, context=context, kind=kind, attributes=planned.attributes, start_time=self._ns(planned.start)
            )
            if planned.error is not None:
                span.set_status(Status(StatusCode.ERROR, planned.error))
            spans[planned.name] = span
        # Children end before their parents, as they would have, had the spans been written live.
        for planned in reversed(plan):
            spans[planned.name].end(end_time=self._ns(planned.end))

    def shutdown(self) -> None:
        """Send what is left, for at most ``FLUSH_TIMEOUT_S``, then stop."""
        flusher = threading.Thread(target=self.provider.shutdown, name="gateway-tracing-shutdown", daemon=True)
        flusher.start()
        flusher.join(FLUSH_TIMEOUT_S)


def start_tracing(config: TracingConfig) -> RequestTracer | None:
    """The tracer of ``[tracing]``: spans sampled at ``sample_ratio`` (a caller's traceparent
    decides for its own requests), sent in batches by OTLP/HTTP; None when tracing is off."""
    if not config.enabled:
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    provider = TracerProvider(
        resource=Resource.create({"service.name": config.service_name}),
        sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)),
    )
    # The batch processor sends from a thread of its own: the event loop never waits on the collector.
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=config.otlp_endpoint)))
    return RequestTracer(provider)
