"""OpenTelemetry spans of each infer request: the gateway in process with an in-memory exporter
(the five phases, their attributes and parents, a caller's traceparent, over HTTP and gRPC), `gateway serve` sending
them by OTLP/HTTP to a collector the test runs, the [tracing] table's errors, and a gateway that
runs and never imports OpenTelemetry without the extra."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from tritonclient.grpc import service_pb2, service_pb2_grpc

from gateway.config import ConfigError, load_config
from gateway.engine import Engine
from gateway.metrics import GatewayMetrics
from gateway.observe import RequestRecord
from gateway.server import ENGINE, HANDLERS, build_app
from gateway.tracing import GRPC_SERVICE, INFER_ROUTE_SPAN, PHASES, RequestTracer, request_spans
from tests.helpers import ROOT, free_port, run_gateway

ROW = [0.25] * 512  # one row of the example MLP's input x[N, 512]
MODEL = '[models.mlp]\npath = "mlp.onnx"\nsla_ms = 1000\nmax_batch_size = 8\ncpu = { cores = 0.5, threads = 1 }\n'
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


def infer_body(rows: int = 1) -> dict:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 512], "data": ROW * rows}]}


def write_config(folder: Path, extra: str = "") -> Path:
    path = folder / "config.toml"
    path.write_text(f'[node]\ncpu_cores = 1.0\n[control]\npolicy = "fixed"\n{extra}\n{MODEL}')
    return path


@pytest.fixture
async def traced(tmp_models: Path) -> AsyncIterator[tuple[TestClient, InMemorySpanExporter]]:
    """The gateway's app and engine in process, its spans kept in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    engine = Engine(load_config(write_config(tmp_models)), GatewayMetrics())
    await engine.start()
    try:
        async with TestClient(TestServer(build_app(engine, RequestTracer(provider)))) as client:
            yield client, exporter
    finally:
        await engine.stop()


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    named = {span.name: span for span in spans}
    assert len(named) == len(spans), [s.name for s in spans]
    return named


async def test_five_phases_under_the_request_span(traced: tuple[TestClient, InMemorySpanExporter]) -> None:
    client, exporter = traced
    response = await client.post("/v2/models/mlp/infer", json=infer_body(rows=3), headers={"X-Request-ID": "trace-me-1"})
    assert response.status == 200, await response.text()

    spans = by_name(exporter.get_finished_spans())
    assert set(spans) == {INFER_ROUTE_SPAN, *PHASES}
    root = spans[INFER_ROUTE_SPAN]
    assert root.parent is None and root.kind is SpanKind.SERVER
    trace_id = root.context.trace_id
    assert all(span.context.trace_id == trace_id for span in spans.values())
    # receive, queue, dispatch and reply are the request's phases; execute is part of dispatch.
    for name in ("receive", "queue", "dispatch", "reply"):
        assert spans[name].parent.span_id == root.context.span_id, name
    assert spans["execute"].parent.span_id == spans["dispatch"].context.span_id

    for span in spans.values():
        assert span.attributes["gateway.model"] == "mlp", span.name
        assert span.attributes["gateway.request_id"] == "trace-me-1", span.name
        assert span.status.status_code is not StatusCode.ERROR, span.name
    for name in (INFER_ROUTE_SPAN, "dispatch", "execute"):
        assert spans[name].attributes["gateway.batch_size"] == 3, name
        assert spans[name].attributes["gateway.device"] == "cpu", name
        assert spans[name].attributes["gateway.executor"] == "cpu-mlp", name
    assert root.attributes["http.response.status_code"] == 200 and root.attributes["gateway.outcome"] == "success"

    # The phases follow one another within the request's span; execute lies within dispatch.
    order = [spans[name] for name in ("receive", "queue", "dispatch", "reply")]
    assert order[0].start_time == root.start_time and order[-1].end_time == root.end_time
    for before, after in zip(order, order[1:], strict=False):
        assert before.end_time == after.start_time, (before.name, after.name)
    execute, dispatch = spans["execute"], spans["dispatch"]
    assert dispatch.start_time <= execute.start_time <= execute.end_time == dispatch.end_time


async def test_a_callers_traceparent_is_the_parent(traced: tuple[TestClient, InMemorySpanExporter]) -> None:
    client, exporter = traced
    traceparent = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
    response = await client.post("/v2/models/mlp/infer", json=infer_body(), headers={"traceparent": traceparent})
    assert response.status == 200, await response.text()

    spans = by_name(exporter.get_finished_spans())
    root = spans[INFER_ROUTE_SPAN]
    assert root.parent is not None and root.parent.is_remote
    assert root.parent.trace_id == int(TRACE_ID, 16) and root.parent.span_id == int(CALLER_SPAN, 16)
    assert {span.context.trace_id for span in spans.values()} == {int(TRACE_ID, 16)}


async def test_a_refused_request_ends_in_its_phase(traced: tuple[TestClient, InMemorySpanExporter]) -> None:
    """A body the model refuses never enters the queue: the request's span and receive alone, both errors."""
    client, exporter = traced
    response = await client.post("/v2/models/mlp/infer", json={"inputs": [{"name": "nope"}]})
    assert response.status == 400

    spans = by_name(exporter.get_finished_spans())
    assert set(spans) == {INFER_ROUTE_SPAN, "receive"}
    assert spans[INFER_ROUTE_SPAN].status.status_code is StatusCode.ERROR
    assert spans["receive"].status.status_code is StatusCode.ERROR
    assert spans[INFER_ROUTE_SPAN].attributes["gateway.outcome"] == "invalid"


@pytest.fixture
async def traced_grpc(tmp_models: Path) -> AsyncIterator[tuple[service_pb2_grpc.GRPCInferenceServiceStub, InMemorySpanExporter]]:
    """The gateway's gRPC service and engine in process, its spans kept in memory."""
    from gateway.grpc_server import start_grpc

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    engine = Engine(load_config(write_config(tmp_models)), GatewayMetrics())
    await engine.start()
    tracer = RequestTracer(provider)
    port = free_port()
    server = await start_grpc(build_app(engine, tracer)[HANDLERS], "127.0.0.1", port, tracer)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield service_pb2_grpc.GRPCInferenceServiceStub(channel), exporter
    finally:
        await server.stop(None)
        await engine.stop()


def grpc_request(model: str = "mlp", request_id: str = "", width: int = 512) -> service_pb2.ModelInferRequest:
    tensor = service_pb2.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, width])
    row = np.full((1, width), 0.25, np.float32).tobytes()
    return service_pb2.ModelInferRequest(model_name=model, id=request_id, inputs=[tensor], raw_input_contents=[row])


def spans_of(exporter: InMemorySpanExporter, request_id: str) -> dict[str, ReadableSpan]:
    return by_name(tuple(s for s in exporter.get_finished_spans() if s.attributes["gateway.request_id"] == request_id))


async def test_grpc_requests_are_traced_as_http_ones(
    traced_grpc: tuple[service_pb2_grpc.GRPCInferenceServiceStub, InMemorySpanExporter],
) -> None:
    """A gRPC infer request, of a call or of a stream, has the spans of an HTTP one, named by its
    method; its traceparent metadata joins the caller's trace, its x-request-id metadata names it
    (over the message's id), and a refusal ends in its phase (gRPC infer was traced not at all)."""
    stub, exporter = traced_grpc
    traceparent = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
    metadata = (("traceparent", traceparent), ("x-request-id", "grpc-call-1"))
    call = stub.ModelInfer(grpc_request(request_id="the-message-id"), metadata=metadata)
    await call
    assert ("x-request-id", "grpc-call-1") in tuple(await call.trailing_metadata())
    answers = [a async for a in stub.ModelStreamInfer(iter([grpc_request(request_id="in-a-stream")]))]
    assert [a.error_message for a in answers] == [""]
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.ModelInfer(grpc_request(request_id="too-narrow", width=7))
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT

    called = spans_of(exporter, "grpc-call-1")
    assert set(called) == {f"{GRPC_SERVICE}/ModelInfer", *PHASES}
    root = called[f"{GRPC_SERVICE}/ModelInfer"]
    assert root.kind is SpanKind.SERVER and root.parent is not None and root.parent.is_remote
    assert root.parent.trace_id == int(TRACE_ID, 16) and root.parent.span_id == int(CALLER_SPAN, 16)
    assert {span.context.trace_id for span in called.values()} == {int(TRACE_ID, 16)}
    for name in ("receive", "queue", "dispatch", "reply"):
        assert called[name].parent.span_id == root.context.span_id, name
    assert called["execute"].parent.span_id == called["dispatch"].context.span_id
    assert root.attributes["rpc.system"] == "grpc" and root.attributes["rpc.method"] == "ModelInfer"
    assert root.attributes["rpc.grpc.status_code"] == 0 and root.attributes["gateway.outcome"] == "success"
    assert root.attributes["gateway.executor"] == "cpu-mlp" and root.status.status_code is not StatusCode.ERROR

    streamed = spans_of(exporter, "in-a-stream")
    assert set(streamed) == {f"{GRPC_SERVICE}/ModelStreamInfer", *PHASES}
    assert streamed[f"{GRPC_SERVICE}/ModelStreamInfer"].parent is None

    failed = spans_of(exporter, "too-narrow")
    assert set(failed) == {f"{GRPC_SERVICE}/ModelInfer", "receive"}
    assert all(span.status.status_code is StatusCode.ERROR for span in failed.values())
    assert failed[f"{GRPC_SERVICE}/ModelInfer"].attributes["rpc.grpc.status_code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]


async def test_a_refused_expectation_is_traced(traced: tuple[TestClient, InMemorySpanExporter]) -> None:
    """An Expect other than 100-continue is answered 417 before any middleware: it had no span."""
    client, exporter = traced
    headers = {"Expect": "bogus", "X-Request-ID": "expects-2"}
    response = await client.post("/v2/models/mlp/infer", json=infer_body(), headers=headers)
    assert response.status == 417 and response.headers["X-Request-ID"] == "expects-2"

    spans = by_name(exporter.get_finished_spans())
    assert set(spans) == {INFER_ROUTE_SPAN, "receive"}
    assert spans[INFER_ROUTE_SPAN].attributes["http.response.status_code"] == 417
    assert all(span.status.status_code is StatusCode.ERROR for span in spans.values())


def failed_record(dispatched: float | None) -> RequestRecord:
    """A request that was queued at 10.001 s and timed out at 10.021 s (answered 504 at 10.022 s)."""
    record = RequestRecord("late-1", True, "slow", start=10.0, parsed=10.001)
    record.failed("timed out after 20 ms while its batch ran; the result is discarded", dispatched)
    record.waited, record.end, record.status, record.outcome = 10.021, 10.022, 504, "timeout"
    return record


def test_a_request_that_fails_while_its_batch_runs_ends_in_dispatch() -> None:
    """A request that failed once its batch had begun (timed out as it ran) was traced as if it
    never left the queue: its queue span ran on to the timeout, the error, and it had no dispatch."""
    spans = {span.name: span for span in request_spans(failed_record(dispatched=10.002))}
    assert list(spans) == ["request", "receive", "queue", "dispatch"]
    assert (spans["queue"].start, spans["queue"].end, spans["queue"].error) == (10.001, 10.002, None)
    dispatch = spans["dispatch"]
    assert (dispatch.parent, dispatch.start, dispatch.end) == ("request", 10.002, 10.021)
    assert dispatch.error == "timed out after 20 ms while its batch ran; the result is discarded"
    assert spans["request"].error == dispatch.error and spans["request"].end == 10.022

    # One that timed out waiting in the queue still ends there.
    spans = {span.name: span for span in request_spans(failed_record(dispatched=None))}
    assert list(spans) == ["request", "receive", "queue"]
    assert spans["queue"].end == 10.021 and spans["queue"].error is not None


async def test_a_request_that_times_out_while_its_batch_runs_is_traced_so(
    traced: tuple[TestClient, InMemorySpanExporter],
) -> None:
    """The engine gave its handler no batch start: served, such a request was still drawn as if
    it never left the queue. Its executor is paused (SIGSTOP) once it has the batch."""
    client, exporter = traced
    executor = client.server.app[ENGINE].executors["cpu-mlp"]
    body = {**infer_body(), "parameters": {"timeout": 300_000}}  # 0.3 s, in Triton's microseconds
    os.kill(executor.pid, signal.SIGSTOP)
    try:
        response = await client.post("/v2/models/mlp/infer", json=body, headers={"X-Request-ID": "late-in-batch"})
    finally:
        os.kill(executor.pid, signal.SIGCONT)
    assert response.status == 504 and "while its batch ran" in (await response.text())

    spans = by_name(exporter.get_finished_spans())
    assert set(spans) == {INFER_ROUTE_SPAN, "receive", "queue", "dispatch"}
    assert spans["queue"].status.status_code is not StatusCode.ERROR
    assert spans["queue"].end_time == spans["dispatch"].start_time
    assert spans["dispatch"].status.status_code is StatusCode.ERROR


class Collector(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver of traces: keeps each request's body."""

    bodies: list[tuple[str, str, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Collector.bodies.append((self.path, self.headers.get("Content-Type", ""), body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[str]:
    Collector.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    finally:
        server.shutdown()
        server.server_close()


def test_serve_sends_spans_over_otlp_http(tmp_models: Path, collector: str) -> None:
    """`gateway serve` with [tracing]: a request's spans reach the collector by OTLP/HTTP (sent
    at the latest when the gateway stops), in the caller's trace, under the configured service name."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    tracing = f'[tracing]\nenabled = true\notlp_endpoint = "{collector}"\nservice_name = "gw-under-test"\nsample_ratio = 0.0\n'
    config = write_config(tmp_models, tracing)
    with run_gateway(config) as gateway:
        url = f"{gateway.base}/v2/models/mlp/infer"
        # A ratio of 0 records no trace begun here; a caller's sampled traceparent is followed.
        assert requests.post(url, json=infer_body(), timeout=30).status_code == 200
        traced = requests.post(url, json=infer_body(), headers={"traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01"}, timeout=30)
        assert traced.status_code == 200
    assert gateway.process.returncode == 0, gateway.output()

    spans, services = [], set()
    for path, content_type, body in Collector.bodies:
        assert path == "/v1/traces" and content_type == "application/x-protobuf"
        export = ExportTraceServiceRequest.FromString(body)
        for resource_spans in export.resource_spans:
            services |= {a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"}
            spans += [span for scope in resource_spans.scope_spans for span in scope.spans]
    assert services == {"gw-under-test"}
    assert sorted(span.name for span in spans) == sorted([INFER_ROUTE_SPAN, *PHASES])
    assert {span.trace_id.hex() for span in spans} == {TRACE_ID}


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ("sample_ratio = 1.5", "tracing.sample_ratio: must be between 0 and 1, got 1.5"),
        ('otlp_endpoint = "collector:4318"', "tracing.otlp_endpoint: must be an http:// or https:// URL"),
        ('service_name = ""', "tracing.service_name: "),
        ("enable = true", "tracing.enable: unknown key (known: enabled, otlp_endpoint, sample_ratio, service_name)"),
        ('enabled = "yes"', "tracing.enabled: must be true or false, got str 'yes'"),
    ],
)
def test_tracing_config_errors_name_file_and_key(tmp_models: Path, table: str, problem: str) -> None:
    config = write_config(tmp_models, f"[tracing]\n{table}\n")
    with pytest.raises(ConfigError) as error:
        load_config(config)
    assert str(error.value).startswith(f"{config}: {problem}")


def test_runs_without_the_extra_and_says_what_is_missing(tmp_models: Path) -> None:
    """With OpenTelemetry not importable, the server imports, a config without tracing loads and
    builds the app, one that enables tracing is refused naming the key and the extra; and nothing
    of the gateway imports OpenTelemetry while tracing is off."""
    off = write_config(tmp_models)
    on = tmp_models / "on.toml"
    shutil.copy(off, on)
    on.write_text(off.read_text() + "\n[tracing]\nenabled = true\n")
    script = textwrap.dedent(
        f"""
        import importlib.abc, sys

        class NoOpenTelemetry(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "opentelemetry":
                    raise ModuleNotFoundError(f"No module named {{name!r}}")

        sys.meta_path.insert(0, NoOpenTelemetry())
        import gateway.cli, gateway.server, schedulers.dispatch
        from types import SimpleNamespace
        from gateway.config import ConfigError, load_config
        config = load_config({str(off)!r})
        gateway.server.build_app(SimpleNamespace(config=config))
        assert gateway.server.start_tracing(config.tracing) is None
        try:
            load_config({str(on)!r})
        except ConfigError as error:
            print(error)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"{on}: tracing.enabled: true needs the tracing extra, and opentelemetry-api, opentelemetry-sdk, "
        "opentelemetry-exporter-otlp-proto-http cannot be imported: pip install 'sla-gateway[tracing]'"
    )

    # With the extra installed, a gateway with tracing off still never imports it.
    script = (
        "import sys, gateway.cli, gateway.server, gateway.engine, schedulers.dispatch\n"
        f"from gateway.config import load_config\nload_config({str(off)!r})\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    # The pure decision code never even names it.
    for folder in ("schedulers", "controllers", "supervisor"):
        assert not [p for p in (ROOT / folder).rglob("*.py") if "opentelemetry" in p.read_text()], folder


async def test_a_slow_upload_is_the_receive_phase_not_queue_time(traced: tuple[TestClient, InMemorySpanExporter]) -> None:
    """A body sent over 0.6 s to an idle model: its queue time (the answer's queue_ms, the
    statistics' queue, nv_inference_queue_duration_us) counted from the request's arrival held
    the upload, while the queue span, from the request's entry into the queue, held none of it."""
    import asyncio

    import orjson

    client, exporter = traced
    body = orjson.dumps(infer_body())

    async def trickle():
        for start in range(0, len(body), len(body) // 4 + 1):
            yield body[start : start + len(body) // 4 + 1]
            await asyncio.sleep(0.2)

    response = await client.post("/v2/models/mlp/infer", data=trickle(), headers={"Content-Type": "application/json"})
    assert response.status == 200, await response.text()
    queue_ms = (await response.json())["parameters"]["queue_ms"]
    spans = by_name(exporter.get_finished_spans())
    receive_ms = (spans["receive"].end_time - spans["receive"].start_time) / 1e6
    assert receive_ms >= 500 and queue_ms < receive_ms / 2, (receive_ms, queue_ms)
    statistics = await (await client.get("/v2/models/mlp/stats")).json()
    (model,) = statistics["model_stats"]
    assert model["inference_stats"]["queue"]["ns"] / 1e6 == pytest.approx(queue_ms, abs=0.01)


async def test_a_refused_request_is_named_by_its_body_id(traced: tuple[TestClient, InMemorySpanExporter]) -> None:
    """The body's id named an accepted request only: refused 400, the request the operator must
    look up went by an id of the gateway's making (over gRPC it kept its own)."""
    client, exporter = traced
    body = {"id": "client-named-42", "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 5], "data": [0.0] * 10}]}
    response = await client.post("/v2/models/mlp/infer", json=body)
    assert response.status == 400 and "shape" in (await response.json())["error"]
    assert response.headers["X-Request-ID"] == "client-named-42"
    root = by_name(exporter.get_finished_spans())[INFER_ROUTE_SPAN]
    assert root.attributes["gateway.request_id"] == "client-named-42"
