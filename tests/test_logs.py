"""`gateway serve --log-format json --access-log`: one JSON object per line, one request line per
infer request (HTTP or gRPC), the request id from the client or made here and returned in
X-Request-ID, and a malformed request that is one WARNING, not an ERROR with a traceback."""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests
from tritonclient.grpc import service_pb2, service_pb2_grpc

from gateway.logs import FIELDS, JsonFormatter, TextFormatter
from tests.helpers import ROOT, Gateway, free_port, metric_value, run_gateway

ROW = [0.5] * 512  # one row of the example MLP's input x[N, 512]


def infer_body(rows: int = 1, **extra: object) -> dict:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 512], "data": ROW * rows}], **extra}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, example_models: Path) -> Iterator[Gateway]:
    folder = tmp_path_factory.mktemp("logs")
    shutil.copy(example_models / "mlp.onnx", folder / "mlp.onnx")
    config = folder / "config.toml"
    config.write_text(
        '[node]\ncpu_cores = 1.0\n[control]\npolicy = "fixed"\n'
        '[models.mlp]\npath = "mlp.onnx"\nsla_ms = 1000\nmax_batch_size = 8\ncpu = { cores = 0.5, threads = 1 }\n'
    )
    grpc_port = free_port()
    with run_gateway(config, args=["--log-format", "json", "--access-log", "--grpc-port", str(grpc_port)]) as running:
        running.grpc_url = f"127.0.0.1:{grpc_port}"
        yield running


def log_entries(gateway: Gateway) -> list[dict]:
    """Every line of the gateway's output, each of which must be one JSON object."""
    entries = []
    for number, line in enumerate(gateway.output().splitlines(), 1):
        entry = json.loads(line)  # raises on any line that is not JSON
        assert isinstance(entry, dict), f"line {number} is not a JSON object: {line}"
        assert {"time", "level", "logger", "message"} <= entry.keys(), line
        entries.append(entry)
    return entries


def wait_for_entries(gateway: Gateway, wanted: Callable[[list[dict]], bool], what: str) -> list[dict]:
    """The log entries once ``wanted(entries)`` holds: the access log is written after the response."""
    deadline = time.monotonic() + 10
    while True:
        entries = log_entries(gateway)
        if wanted(entries):
            return entries
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} never appeared in the log:\n{gateway.output()}")
        time.sleep(0.05)


def request_lines(entries: list[dict], request_id: str) -> list[dict]:
    return [e for e in entries if e["logger"] == "gateway.request" and e.get("id") == request_id]


def test_request_ids_round_trip_into_header_and_log_line(gateway: Gateway) -> None:
    url = f"{gateway.base}/v2/models/mlp/infer"
    by_header = requests.post(url, json=infer_body(), headers={"X-Request-ID": "client-id-7"}, timeout=30)
    by_body = requests.post(url, json=infer_body(id="body-id-8"), timeout=30)
    # A client's header wins over its body's id, which the protocol still echoes in the body.
    both = requests.post(url, json=infer_body(id="body-id-9"), headers={"X-Request-ID": "header-id-9"}, timeout=30)
    made = requests.post(url, json=infer_body(rows=3), timeout=30)
    # An id that could break a header or a text log line is not taken: one is made instead.
    unusable = requests.post(url, json=infer_body(id="two words"), timeout=30)
    invalid = requests.post(url, json={"inputs": []}, headers={"X-Request-ID": "bad-body-1"}, timeout=30)
    health = requests.get(f"{gateway.base}/v2/health/live", headers={"X-Request-ID": "probe-1"}, timeout=30)

    for response in (by_header, by_body, both, made, unusable):
        assert response.status_code == 200, response.text
    assert by_header.headers["X-Request-ID"] == "client-id-7"
    assert by_body.headers["X-Request-ID"] == "body-id-8" and by_body.json()["id"] == "body-id-8"
    assert both.headers["X-Request-ID"] == "header-id-9" and both.json()["id"] == "body-id-9"
    generated = made.headers["X-Request-ID"]
    assert re.fullmatch(r"[0-9a-f]{32}", generated)
    assert re.fullmatch(r"[0-9a-f]{32}", unusable.headers["X-Request-ID"])
    assert unusable.headers["X-Request-ID"] != generated
    assert invalid.status_code == 400 and invalid.headers["X-Request-ID"] == "bad-body-1"
    assert health.headers["X-Request-ID"] == "probe-1"

    ids = ["client-id-7", "body-id-8", "header-id-9", generated, unusable.headers["X-Request-ID"], "bad-body-1"]
    entries = wait_for_entries(
        gateway,
        lambda entries: all(any(e["logger"] == "gateway.access" and e.get("id") == i for e in entries) for i in ids),
        "an access line of every request",
    )
    for request_id in ids:
        assert len(request_lines(entries, request_id)) == 1, request_id
    served = request_lines(entries, generated)[0]
    assert served["model"] == "mlp" and served["status"] == 200 and served["outcome"] == "success"
    assert served["executed_on"] == "cpu" and served["executor"] == "cpu-mlp" and served["batch_size"] == 3
    for key in ("queue_ms", "compute_ms", "total_ms"):
        assert isinstance(served[key], float) and served[key] >= 0, key
    assert served["queue_ms"] <= served["total_ms"]
    refused = request_lines(entries, "bad-body-1")[0]
    assert refused["status"] == 400 and refused["outcome"] == "invalid" and refused["executed_on"] is None
    # Health probes are no infer requests: in the access log only.
    assert not request_lines(entries, "probe-1")
    access = next(e for e in entries if e["logger"] == "gateway.access" and e.get("id") == "client-id-7")
    assert access["method"] == "POST" and access["path"] == "/v2/models/mlp/infer" and access["status"] == 200


def test_a_refused_expectation_keeps_its_request_id(gateway: Gateway) -> None:
    """An Expect other than 100-continue is answered 417 before any middleware runs: the answer
    lost its X-Request-ID, the access log its id, and the infer request its request line."""
    head = "POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nX-Request-ID: expects-1\r\nExpect: bogus\r\n"
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as conn:
        conn.sendall(f"{head}Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}".encode())
        answer = b""
        while chunk := conn.recv(4096):  # the gateway answers 417 and closes
            answer += chunk
    status_line, *headers = answer.split(b"\r\n\r\n")[0].decode().split("\r\n")
    assert " 417 " in status_line, answer
    assert "x-request-id: expects-1" in [h.lower() for h in headers], headers

    def logged(entries: list[dict]) -> bool:
        return any(e["logger"] == "gateway.access" and e.get("id") == "expects-1" for e in entries)

    entries = wait_for_entries(gateway, logged, "the 417's access line")
    (line,) = request_lines(entries, "expects-1")
    assert line["model"] == "mlp" and line["status"] == 417 and line["outcome"] is None, line


def test_a_client_that_leaves_has_its_access_line(gateway: Gateway) -> None:
    """aiohttp writes the access line after a response: a request whose client hung up first
    (its handler cancelled) had none. It has one now, status 499 (nginx's 'client closed request')."""
    body = json.dumps(infer_body()).encode()
    head = f"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nX-Request-ID: leaves-1\r\nContent-Length: {len(body)}\r\n\r\n"
    executor = gateway.executor_pid("mlp")
    os.kill(executor, signal.SIGSTOP)  # no request can end but by its client
    try:
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as conn:
            conn.sendall(head.encode() + body)
            deadline = time.monotonic() + 10
            while metric_value(gateway.metrics(), "gateway_requests_in_flight", model="mlp") < 1:
                assert time.monotonic() < deadline, "the request never reached its model"
                time.sleep(0.05)
    finally:
        os.kill(executor, signal.SIGCONT)

    def logged(entries: list[dict]) -> bool:
        return any(e["logger"] == "gateway.access" and e.get("id") == "leaves-1" for e in entries)

    entries = wait_for_entries(gateway, logged, "the access line of a request whose client left")
    (access,) = [e for e in entries if e["logger"] == "gateway.access" and e.get("id") == "leaves-1"]
    assert access["status"] == 499 and access["path"] == "/v2/models/mlp/infer" and access["bytes"] == 0, access
    assert request_lines(entries, "leaves-1")[0]["outcome"] == "client_gone"


def grpc_infer_request(model: str = "mlp", request_id: str = "", width: int = 512) -> service_pb2.ModelInferRequest:
    tensor = service_pb2.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, width])
    row = np.full((1, width), 0.5, np.float32).tobytes()
    return service_pb2.ModelInferRequest(model_name=model, id=request_id, inputs=[tensor], raw_input_contents=[row])


def test_grpc_infer_requests_have_their_request_lines(gateway: Gateway) -> None:
    """A gRPC infer request, of a call or of a stream, has its line of the request log as an HTTP
    one does (it had none), named by its x-request-id metadata over its message's id, or by an id
    made here that the call's trailing metadata carries back."""
    with grpc.insecure_channel(gateway.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        stub.ModelInfer(grpc_infer_request(request_id="grpc-message-1"), timeout=30)
        stub.ModelInfer(grpc_infer_request(request_id="not-this-one"), metadata=(("x-request-id", "grpc-meta-2"),), timeout=30)
        _, call = stub.ModelInfer.with_call(grpc_infer_request(), timeout=30)
        made = dict(call.trailing_metadata())["x-request-id"]
        for refused in (grpc_infer_request(request_id="grpc-narrow-3", width=7), grpc_infer_request("nope", "grpc-nope-4")):
            with pytest.raises(grpc.RpcError):
                stub.ModelInfer(refused, timeout=30)
        stream = [grpc_infer_request(request_id="grpc-stream-5"), grpc_infer_request(request_id="grpc-stream-6", width=7)]
        answers = list(stub.ModelStreamInfer(iter(stream), timeout=30))
    assert sorted(bool(a.error_message) for a in answers) == [False, True]
    assert re.fullmatch(r"[0-9a-f]{32}", made)

    ids = ["grpc-message-1", "grpc-meta-2", made, "grpc-narrow-3", "grpc-nope-4", "grpc-stream-5", "grpc-stream-6"]
    entries = wait_for_entries(
        gateway, lambda entries: all(request_lines(entries, i) for i in ids), "a request line of every gRPC request"
    )
    lines = {}
    for request_id in ids:
        (lines[request_id],) = request_lines(entries, request_id)
        assert lines[request_id]["protocol"] == "grpc", request_id
    assert not request_lines(entries, "not-this-one")
    for request_id in ("grpc-message-1", "grpc-meta-2", made, "grpc-stream-5"):
        served = lines[request_id]
        assert served["model"] == "mlp" and served["status"] == 200 and served["outcome"] == "success", served
        assert served["executor"] == "cpu-mlp" and served["batch_size"] == 1 and served["total_ms"] >= served["queue_ms"]
    # Refusals: the HTTP status their gRPC code stands for, as /metrics counts them.
    for request_id in ("grpc-narrow-3", "grpc-stream-6"):
        assert lines[request_id]["status"] == 400 and lines[request_id]["outcome"] == "invalid", lines[request_id]
    assert lines["grpc-nope-4"]["model"] == "nope" and lines["grpc-nope-4"]["status"] == 404
    assert lines["grpc-nope-4"]["outcome"] is None  # as an HTTP request for no model: no model counted it


def test_malformed_requests_are_one_warning_per_connection(gateway: Gateway) -> None:
    """A bad request line, an invalid header: aiohttp's parser refuses them. Each connection's
    is one WARNING line, with no ERROR and no traceback."""
    sent = [b"NOT AN HTTP REQUEST\r\n\r\nAGAIN NOT ONE\r\n\r\n", b"GET /v2 HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n\r\n"]
    for raw in sent:
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as conn:
            conn.sendall(raw)
            answer = b""
            while chunk := conn.recv(4096):  # the gateway answers 400 and closes
                answer += chunk
            assert answer.startswith(b"HTTP/1.") and b" 400 " in answer.split(b"\r\n")[0]

    def warned(entries: list[dict]) -> bool:
        return len([e for e in entries if "malformed HTTP request" in e["message"]]) >= 2

    entries = wait_for_entries(gateway, warned, "two malformed-request warnings")
    warnings = [e for e in entries if "malformed HTTP request" in e["message"]]
    assert len(warnings) == 2, warnings
    assert all(w["level"] == "WARNING" for w in warnings)
    assert "Invalid method" in warnings[0]["message"] and "Invalid header" in warnings[1]["message"]
    assert [e for e in entries if e["level"] in ("ERROR", "CRITICAL")] == []
    assert not any("exception" in e for e in entries)
    assert "Traceback" not in gateway.output()


def make_record(message: str, *args: object, fields: dict | None = None, exc_info: object = None) -> logging.LogRecord:
    record = logging.LogRecord("gateway.test", logging.INFO, __file__, 1, message, args, exc_info)  # type: ignore[arg-type]
    if fields is not None:
        setattr(record, FIELDS, fields)
    return record


def test_json_lines_stay_single_lines_and_valid() -> None:
    """A traceback, a newline in a message and header bytes that are not UTF-8 (aiohttp keeps
    them as lone surrogates) still make one line of valid JSON."""
    try:
        raise ValueError("boom")
    except ValueError:
        exc_info = sys.exc_info()
    record = make_record("two\nlines %s", "bad\udcff", fields={"id": "r-1", "total_ms": 1.5}, exc_info=exc_info)
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == "two\nlines bad\udcff"
    assert entry["id"] == "r-1" and entry["total_ms"] == 1.5
    assert "ValueError: boom" in entry["exception"]


def test_text_lines_carry_the_fields_after_the_message() -> None:
    fields = {"id": "r-2", "executed_on": None, "user_agent": 'curl "7" x', "total_ms": 1.5}
    line = TextFormatter().format(make_record("infer %s", "request", fields=fields))
    assert line.endswith('gateway.test INFO infer request id=r-2 executed_on=- user_agent="curl \\"7\\" x" total_ms=1.5')


def test_worker_logs_json_lines_too(gateway: Gateway) -> None:
    """`gateway worker --log-format json --access-log`: its records and its HTTP requests, each a JSON line."""
    listen, http_port = free_port(), free_port()
    env = dict(os.environ, GATEWAY_WORKER_TOKEN="a-worker-token-of-test")
    command = [sys.executable, "-m", "gateway.cli", "worker", str(gateway.config), "--listen", f"127.0.0.1:{listen}"]
    command += ["--http-port", str(http_port), "--log-format", "json", "--access-log"]
    with tempfile.TemporaryFile() as output:
        worker = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        try:
            deadline = time.monotonic() + 60
            while not _live(http_port):
                assert worker.poll() is None and time.monotonic() < deadline, "the worker did not come up"
                time.sleep(0.1)
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=30)
        output.seek(0)
        lines = output.read().decode().splitlines()
    entries = [json.loads(line) for line in lines]
    assert any(e["logger"] == "gateway.worker" and "listening on" in e["message"] for e in entries), lines
    assert any(e["logger"] == "gateway.access" and e["path"] == "/v2/health/live" and e["status"] == 200 for e in entries)


def _live(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/v2/health/live", timeout=5).status_code == 200
    except requests.ConnectionError:
        return False


def test_records_are_dropped_and_counted_while_nobody_reads_stderr() -> None:
    """A full queue (the writer thread stuck on a pipe nobody reads) drops records rather than
    grow without end; once the writer catches up, one warning says how many went, with no
    record after them (the warning waited for the next record: a quiet gateway never wrote it)."""
    from gateway.logs import DroppedRecords, _InProcessQueueHandler, _Writer

    class Kept(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.lines: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.lines.append(record.getMessage())

    records: queue.Queue[logging.LogRecord] = queue.Queue(4)
    dropped = DroppedRecords()
    handler, kept = _InProcessQueueHandler(records, dropped), Kept()
    logger = logging.getLogger("test.dropped")
    logger.addHandler(handler)
    logger.propagate = False
    writer = _Writer(records, kept, dropped)
    try:
        for i in range(10):  # the writer not started: stuck
            logger.warning("line %d", i)
        assert records.qsize() == 4 and dropped.count == 6
        writer.start()
        deadline = time.monotonic() + 10
        while len(kept.lines) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        notice = "6 log records were dropped: stderr was not read"
        # Written once the queue is half empty (2 of 4 left), before the rest of it.
        assert kept.lines == ["line 0", "line 1", notice, "line 2", "line 3"] and dropped.count == 0
    finally:
        writer.stop_within(5)
        logger.removeHandler(handler)


def test_executors_started_while_grpc_serves_leave_the_json_log_json(tmp_path: Path, example_models: Path) -> None:
    """gRPC's fork handlers wrote a raw line of their own to stderr each time an executor process
    started while the gRPC service ran (a model loaded, an executor replaced)."""
    shutil.copy(example_models / "mlp.onnx", tmp_path / "mlp.onnx")
    config = tmp_path / "config.toml"
    config.write_text(
        '[node]\ncpu_cores = 1.0\n[control]\npolicy = "fixed"\n'
        '[models.mlp]\npath = "mlp.onnx"\nsla_ms = 1000\ncpu = { cores = 0.5, threads = 1 }\n'
    )
    with run_gateway(config, args=["--log-format", "json", "--grpc-port", str(free_port())]) as running:
        for _ in range(2):
            loaded = requests.post(f"{running.base}/v2/repository/models/mlp/load", timeout=120)
            assert loaded.status_code == 200, loaded.text
        entries = log_entries(running)
    assert sum("started process" in e["message"] for e in entries) >= 3, entries


def _h2_frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def _hpack_literal(name: bytes, value: bytes) -> bytes:
    # A literal header field without indexing, its name new, neither part Huffman-coded (RFC 7541, 6.2.2).
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def send_grpc_call_with_a_bad_timeout(port: int) -> None:
    """A ServerLive call whose grpc-timeout header is no timeout, in raw HTTP/2: gRPC's core
    refuses the header and logs it, before any of the gateway's code sees the call."""
    headers = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/inference.GRPCInferenceService/ServerLive"),
        (b":authority", b"gateway"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        (b"grpc-timeout", b"garbage"),
    ]
    block = b"".join(_hpack_literal(name, value) for name, value in headers)
    settings, end_headers, end_stream = 0x4, 0x4, 0x1
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
            + _h2_frame(settings, 0, 0, b"")
            + _h2_frame(0x1, end_headers, 1, block)
            + _h2_frame(0x0, end_stream, 1, b"\x00" * 5)  # an empty message
        )
        # The call's answer (its trailers, or a reset): by then gRPC's core has read the header.
        received = b""
        while True:
            while len(received) >= 9 and len(received) >= 9 + int.from_bytes(received[:3], "big"):
                length, kind, flags = int.from_bytes(received[:3], "big"), received[3], received[4]
                stream = int.from_bytes(received[5:9], "big")
                if stream == 1 and (kind == 0x3 or flags & end_stream):
                    return
                received = received[9 + length :]
            chunk = conn.recv(65536)
            assert chunk, "the gateway closed the connection without answering the call"
            received += chunk


@pytest.mark.parametrize("verbosity", [None, "ERROR"])
def test_grpc_cores_own_lines_are_off_unless_asked_for(tmp_models: Path, verbosity: str | None) -> None:
    """gRPC's core wrote a raw line to stderr ('E1127 ... Error parsing 'grpc-timeout' metadata')
    for each malformed header of any client, token or not, breaking the JSON log. It is silent by
    default; GRPC_VERBOSITY set by the user still turns it on."""
    config = tmp_models / "config.toml"
    config.write_text(
        '[node]\ncpu_cores = 1.0\n[control]\npolicy = "fixed"\n'
        '[models.mlp]\npath = "mlp.onnx"\nsla_ms = 1000\ncpu = { cores = 0.5, threads = 1 }\n'
    )
    grpc_port = free_port()
    environment = {"GRPC_VERBOSITY": verbosity} if verbosity else {}
    args = ["--log-format", "json", "--grpc-port", str(grpc_port)]
    with run_gateway(config, extra_env=environment, args=args) as running:
        send_grpc_call_with_a_bad_timeout(grpc_port)
    raw = [line for line in running.output().splitlines() if not line.startswith("{")]
    if verbosity is None:
        assert raw == [], raw
    else:
        assert any("grpc-timeout" in line for line in raw), running.output()


LOG_AND_EXIT = """
import logging, sys
from gateway.logs import configure_logging
configure_logging("INFO", "json")
for number in range(int(sys.argv[1])):
    logging.getLogger("gateway.test").warning("line %d of a log nobody may read", number)
"""


def test_the_process_ends_when_nobody_reads_stderr() -> None:
    """At exit the writer thread is given a bounded time to write what is queued: stuck in write()
    on a pipe nobody reads, it held the process (SIGTERM never ended `gateway serve`). Read, every
    record queued is written before the process ends."""
    command = [sys.executable, "-c", LOG_AND_EXIT, "2000"]  # some 250 KB: past any pipe's buffer
    unread = subprocess.Popen(command, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        unread.wait(timeout=120)
    except subprocess.TimeoutExpired:
        unread.kill()
        unread.wait()
        raise AssertionError("the process did not end while nobody read its stderr") from None
    finally:
        assert unread.stderr is not None
        unread.stderr.close()
    assert unread.returncode == 0

    read = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert read.returncode == 0, read.stderr
    lines = [json.loads(line)["message"] for line in read.stderr.splitlines()]
    assert lines == [f"line {number} of a log nobody may read" for number in range(2000)]
