"""Hostile and odd requests: each a 4xx counted as `invalid`, never a 5xx or a silent wrong
answer, and none holding the event loop while it is refused or decoded."""

from __future__ import annotations

import json
import re
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import time

import numpy as np
import orjson
import pytest
import requests
from onnx import TensorProto, helper

from tests.helpers import ROOT, run_gateway, save_model

sys.path.insert(0, str(ROOT / "benchmarks"))
from large_body_probes import PROBER  # noqa: E402  (the benchmark's prober: one script for both)

TOKEN = "hostile-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NODE_CORES = 2.0
ROW = [0.5] * 512
GOOD = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": ROW}]}


def bytes_model(path):
    """text[N,3] -> same[N,3], strings: a BYTES input whose binary elements cost nothing to send."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["text"], ["same"])],
        "strings",
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["N", 3])],
        [helper.make_tensor_value_info("same", TensorProto.STRING, ["N", 3])],
    )
    return save_model(graph, path)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, example_models):
    folder = tmp_path_factory.mktemp("hostile")
    shutil.copy(example_models / "mlp.onnx", folder / "mlp.onnx")
    bytes_model(folder / "strings.onnx")
    # max_batch_size 4096 on the MLP: a valid request can be large (a 2048-row JSON tensor).
    (folder / "config.toml").write_text(
        f'[server]\nadmin_token = "{TOKEN}"\ndata_token = "{TOKEN}"\n\n'
        f"[node]\ncpu_cores = {NODE_CORES}\n\n"
        '[models.mlp]\npath = "mlp.onnx"\nsla_ms = 1000\nmax_batch_size = 4096\n\n'
        '[models.strings]\npath = "strings.onnx"\nsla_ms = 1000\nmax_batch_size = 32\n'
    )
    with run_gateway(folder / "config.toml") as running:
        yield running


def infer(gateway, body: bytes | dict, model: str = "mlp", headers: dict | None = None) -> requests.Response:
    kwargs = {"json": body} if isinstance(body, dict) else {"data": body}
    return requests.post(f"{gateway.base}/v2/models/{model}/infer", headers={**AUTH, **(headers or {})}, timeout=60, **kwargs)


def outcomes(gateway, model: str = "mlp") -> dict[str, int]:
    return requests.get(f"{gateway.base}/admin/models/{model}", headers=AUTH, timeout=10).json()["stats"]["outcomes"]


def refused(gateway, response: requests.Response, status: int, words: str, before: dict, model: str = "mlp") -> None:
    """A clear JSON error, counted as invalid (never internal_error), and the gateway still serving."""
    assert response.status_code == status, response.text
    assert words in response.json()["error"], response.json()
    after = outcomes(gateway, model)
    assert after.get("invalid", 0) == before.get("invalid", 0) + 1, after
    assert after.get("internal_error", 0) == 0, after
    assert infer(gateway, GOOD).status_code == 200


def raw_http(gateway, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send bytes as they are (no client library tidies them) and read the answer to its end."""
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


# -- item 2: large requests do not hold the event loop -------------------------------------------


# /v2/health/live every 20 ms until a line comes on stdin; then prints [latencies, failures].
# A fixed schedule, each latency counted from the time its probe was due: a probe held up by a
# stall counts every 20 ms it delayed, not once (no coordinated omission).
def binary_request(inputs: list[tuple[dict, bytes]], parameters: dict | None = None, pad_to: int = 0) -> tuple[bytes, int]:
    """A body of the binary tensor extension, and its JSON header's length (padded to ``pad_to``)."""
    header = json.dumps(
        {
            "inputs": [{**spec, "parameters": {"binary_data_size": len(raw)}} for spec, raw in inputs],
            **({"parameters": parameters} if parameters else {}),
        }
    ).encode()
    header = header.ljust(pad_to)
    return header + b"".join(raw for _, raw in inputs), len(header)


# Probes waited 1.3-3.7 s behind a body decoded on the event loop (on a 2-core VM; longer on a
# slower machine); a free loop answers in ms.
BLOCKED_LOOP_S = 0.65
# Half the probes wait under this while the loop is free (7-10 ms on the VM, 9 ms on CI's machine
# when its p99 was 326 ms); with the decoding put back on the loop, the median was 323 ms.
FREE_LOOP_MEDIAN_S = 0.1


def test_large_requests_do_not_hold_up_health_probes(gateway):
    """A 60 MB body of 15M empty BYTES elements and a 60 MB JSON tensor over max_batch_size are
    refused before anything is decoded, and a valid 2048-row JSON tensor is decoded off the loop:
    meanwhile /v2/health/live, probed every 20 ms, keeps answering.

    Before the fix the BYTES body was decoded on the loop first (3.7 s, each probe behind it
    waiting as long), and the JSON one parsed and converted (1.3 s). The bound below is half
    the shorter of those, far above what a probe takes on an idle machine (a few ms): it tells a
    blocked loop from a free one, and is no measure of speed (benchmarks are for that). A quarter
    was too tight for CI's machine, where the worker thread's 1 MB regex windows held the GIL
    long enough that the p99 of probes reached 326 ms (83-255 ms on the VM); they are now 128 KB (34-70 ms on the VM).
    """
    elements = 5_000_000 * 3
    many_strings, many_strings_length = binary_request(
        [({"name": "text", "shape": [5_000_000, 3], "datatype": "BYTES"}, b"\0\0\0\0" * elements)]
    )
    too_many_rows = orjson.dumps(
        {"inputs": [{"name": "x", "shape": [29296, 512], "datatype": "FP32", "data": [0.0] * (29296 * 512)}]}
    )
    rows = np.random.default_rng(0).random((2048, 512), dtype=np.float32)
    valid_large = orjson.dumps(
        {"inputs": [{"name": "x", "shape": [2048, 512], "datatype": "FP32", "data": rows.ravel()}]},
        option=orjson.OPT_SERIALIZE_NUMPY,
    )
    assert len(many_strings) > 59_000_000 and len(too_many_rows) > 59_000_000 and len(valid_large) > 10_000_000
    before = {model: outcomes(gateway, model) for model in ("mlp", "strings")}

    # The prober is a process of its own: this one holds the GIL while it builds and reads
    # bodies of tens of megabytes, which would delay probes that the gateway answered in time.
    prober = subprocess.Popen(
        [sys.executable, "-c", PROBER, gateway.base], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    answers: list[tuple[str, int]] = []
    try:
        assert prober.stdout is not None and prober.stdout.readline() == "started\n"
        started = time.monotonic()
        # A few of each, 100 ms apart, until at least 6 s (300 probes) have passed.
        rounds = 0
        while rounds < 2 or time.monotonic() - started < 6:
            rounds += 1
            response = infer(gateway, many_strings, "strings", {"Inference-Header-Content-Length": str(many_strings_length)})
            answers.append(("strings", response.status_code))
            assert "max_batch_size" in response.json()["error"]
            time.sleep(0.1)
            response = infer(gateway, too_many_rows)
            answers.append(("too many rows", response.status_code))
            assert "max_batch_size" in response.json()["error"]
            time.sleep(0.1)
            response = infer(gateway, valid_large)
            answers.append(("valid", response.status_code))
            output = response.json()["outputs"][0]
            assert output["shape"] == [2048, 512] and len(output["data"]) == 2048 * 512
            time.sleep(0.1)
    finally:
        report, _ = prober.communicate("stop\n", timeout=60)
    probes, failures = json.loads(report)
    assert not failures, failures[:3]
    assert answers == [("strings", 400), ("too many rows", 400), ("valid", 200)] * rounds
    probes.sort()
    p99 = probes[int(0.99 * len(probes))]
    median, worst = statistics.median(probes), probes[-1]
    summary = f"{len(probes)} probes: median {median * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, max {worst * 1e3:.1f} ms"
    assert len(probes) >= 250, summary
    assert median < FREE_LOOP_MEDIAN_S, summary
    assert p99 < BLOCKED_LOOP_S, summary
    assert outcomes(gateway, "strings").get("invalid", 0) == before["strings"].get("invalid", 0) + rounds
    assert outcomes(gateway, "mlp").get("invalid", 0) == before["mlp"].get("invalid", 0) + rounds


# -- item 5: each a 4xx, where it was a 5xx or a wrong answer -----------------------------------


@pytest.mark.parametrize("parameters", [5, "x", [1]])
def test_output_parameters_that_are_not_an_object(gateway, parameters):
    """Was a 500 counted as internal_error (``"classification" in 5``)."""
    before = outcomes(gateway)
    response = infer(gateway, {**GOOD, "outputs": [{"name": "y", "parameters": parameters}]})
    refused(gateway, response, 400, "output 'y': 'parameters' must be an object", before)


def test_a_value_out_of_the_datatype_range_is_refused(gateway):
    """1e39 does not fit FP32: it was accepted, run as infinity, and answered with nulls."""
    before = outcomes(gateway)
    response = infer(gateway, {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [1e39] + ROW[1:]}]})
    refused(gateway, response, 400, "input 'x': a value is outside the range of FP32", before)


def test_nan_outputs_are_null_in_valid_json(gateway):
    """NaN (binary inputs can carry it) comes back as null in a JSON output: still valid JSON,
    as the README says. (Documented behaviour; this passed before the fix as well.)"""
    nan_row = np.full((1, 512), np.nan, dtype=np.float32)
    body, length = binary_request([({"name": "x", "shape": [1, 512], "datatype": "FP32"}, nan_row.tobytes())])
    response = infer(gateway, body, headers={"Inference-Header-Content-Length": str(length)})
    assert response.status_code == 200, response.text

    def no_constants(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")

    data = json.loads(response.content, parse_constant=no_constants)["outputs"][0]["data"]
    assert data == [None] * 512


def test_authorization_that_is_not_utf8_is_a_wrong_token(gateway):
    """Was a 500: the guard encoded the header's surrogate escapes and failed."""
    before = outcomes(gateway)
    body = json.dumps(GOOD).encode()
    for path, method, payload in (("/v2/models/mlp/infer", "POST", body), ("/admin/models/mlp", "GET", b"")):
        status, headers, answer = raw_http(
            gateway,
            f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n".encode()
            + b"Authorization: Bearer \xff\xfe\xc3(\r\n"
            + f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload,
        )
        assert status == 401, answer
        assert headers["www-authenticate"] == "Bearer"
        assert "the bearer token is wrong" in json.loads(answer)["error"]
    assert outcomes(gateway).get("internal_error", 0) == 0
    assert outcomes(gateway) == before  # refused before the handler: no request was counted
    assert infer(gateway, GOOD).status_code == 200


@pytest.mark.parametrize("value", ["1_50", "+150", "\u0661\u0665\u0660".encode()], ids=["underscore", "plus", "arabic-indic"])
def test_inference_header_content_length_must_be_digits(gateway, value):
    """Python's int() reads "1_50", "+150" and Arabic-Indic digits as 150, so the request ran."""
    raw = np.zeros(512, np.float32).tobytes()
    body, length = binary_request([({"name": "x", "shape": [1, 512], "datatype": "FP32"}, raw)], pad_to=150)
    assert length == 150 and infer(gateway, body, headers={"Inference-Header-Content-Length": "150"}).status_code == 200
    before = outcomes(gateway)
    response = infer(gateway, body, headers={"Inference-Header-Content-Length": value})
    refused(gateway, response, 400, "Inference-Header-Content-Length must be a decimal number of bytes", before)


@pytest.mark.parametrize(
    ("parameters", "outputs", "words"),
    [
        ({"binary_data_output": "no"}, None, "parameter 'binary_data_output' must be true or false, got 'no'"),
        ({"binary_data_output": 0}, None, "parameter 'binary_data_output' must be true or false"),
        (None, [{"name": "y", "parameters": {"binary_data": "false"}}], "output 'y': parameter 'binary_data' must be true"),
    ],
    ids=["no", "zero", "output binary_data"],
)
def test_binary_flags_must_be_booleans(gateway, parameters, outputs, words):
    """The string "no" was read as true (Python's truth of a non-empty string): a binary answer."""
    before = outcomes(gateway)
    body = {**GOOD, **({"parameters": parameters} if parameters else {}), **({"outputs": outputs} if outputs else {})}
    refused(gateway, infer(gateway, body), 400, words, before)


def test_admin_sla_and_cores_are_bounded(gateway):
    """An SLA of 5e-324 or 1e308 ms and 1e9 cores were accepted."""
    url = f"{gateway.base}/admin/models/mlp"
    for sla in (5e-324, 0.0005, 1e308, 86_400_001):
        response = requests.put(f"{url}/sla", json={"sla_ms": sla}, headers=AUTH, timeout=10)
        assert response.status_code == 400, (sla, response.text)
        assert "sla_ms" in response.json()["error"] and "from 0.001 to 86400000 milliseconds" in response.json()["error"]
    for cores in (1e9, NODE_CORES + 0.5, 0, -1):
        response = requests.put(f"{url}/cores", json={"cores": cores}, headers=AUTH, timeout=10)
        assert response.status_code == 400, (cores, response.text)
        assert f"at most the node's {NODE_CORES:g} cores (node.cpu_cores)" in response.json()["error"]
    model = requests.get(url, headers=AUTH, timeout=10).json()
    assert model["sla_ms"] == 1000 and model["pinned_cores"] is None  # the refused ones changed nothing
    for bound in (0.001, 86_400_000):
        assert requests.put(f"{url}/sla", json={"sla_ms": bound}, headers=AUTH, timeout=10).status_code == 200
    assert requests.put(f"{url}/sla", json={"sla_ms": 1000}, headers=AUTH, timeout=10).status_code == 200
    pinned = requests.put(f"{url}/cores", json={"cores": NODE_CORES}, headers=AUTH, timeout=10)
    assert pinned.status_code == 200 and pinned.json()["pinned_cores"] == NODE_CORES
    assert requests.put(f"{url}/cores", json={"cores": None}, headers=AUTH, timeout=10).status_code == 200
    # Not JSON numbers, and nesting json.loads would have raised RecursionError (a 500) on.
    for body in (b'{"sla_ms": NaN}', b'{"sla_ms": Infinity}', b"[" * 100_000 + b"]" * 100_000):
        response = requests.put(f"{url}/sla", data=body, headers=AUTH, timeout=10)
        assert response.status_code == 400 and "not valid JSON" in response.json()["error"], response.text


PARSER_ERRORS = {
    "bad request line": b"GET /v2/health/live HTTP/1.1 and more\r\nHost: x\r\n\r\n",
    "invalid header name": b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n\r\n",
    "header over 8 KiB": b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 10_000 + b"\r\n\r\n",
    "chunk size not hex": b"POST /v2/health/live HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "not HTTP at all": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\0" * 64 + b"\r\n\r\n",  # a TLS hello
}


@pytest.mark.parametrize("name", sorted(PARSER_ERRORS))
def test_http_parser_errors_are_json(gateway, name):
    """aiohttp answered these from its connection, before any middleware, in text/plain."""
    status, headers, body = raw_http(gateway, PARSER_ERRORS[name])
    assert status == 400, body
    assert headers["content-type"].startswith("application/json"), (headers, body)
    assert json.loads(body)["error"].startswith("the HTTP request is malformed: ")
    assert re.fullmatch("[0-9a-f]{32}", headers.get("x-request-id", "")), headers  # as every answer does
    assert requests.get(f"{gateway.base}/v2/health/live", timeout=10).status_code == 200


def test_a_transfer_coding_other_than_chunked_is_a_501(gateway):
    """``Transfer-Encoding: gzip, chunked`` was taken as chunked: its gzip bytes were read as the
    body (a 400 "not valid JSON"), and a plain body so labelled was served."""
    body = json.dumps(GOOD).encode()
    chunked = b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
    status, _, answer = raw_http(
        gateway,
        b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + TOKEN.encode()
        + b"\r\nContent-Type: application/json\r\nTransfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n"
        + chunked,
    )
    assert status == 501 and "'gzip' is not served" in json.loads(answer)["error"], answer
    assert infer(gateway, GOOD).status_code == 200


def test_a_body_that_does_not_decompress_is_a_400(gateway):
    """Content-Encoding: gzip on bytes that are not gzip: was a 500 counted as internal_error."""
    before = outcomes(gateway)
    status, headers, body = raw_http(
        gateway,
        b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        + f"Authorization: Bearer {TOKEN}\r\nContent-Encoding: gzip\r\nContent-Length: 16\r\n\r\n".encode()
        + b"this is not gzip",
    )
    assert status == 400, body
    assert "the request body is not valid gzip" in json.loads(body)["error"]
    after = outcomes(gateway)
    assert after.get("invalid", 0) == before.get("invalid", 0) + 1 and after.get("internal_error", 0) == 0, after
    assert infer(gateway, GOOD).status_code == 200


def test_empty_bodies_are_a_400_each(gateway):
    """aiohttp shares one empty payload among all requests without a body: reading it must end
    every time (a loop on its readchunk() spun for ever from the second one on)."""
    for _ in range(3):
        response = requests.put(f"{gateway.base}/admin/models/mlp/sla", headers=AUTH, timeout=10)
        assert response.status_code == 400 and "not valid JSON" in response.json()["error"]
        response = requests.post(f"{gateway.base}/v2/models/mlp/infer", headers=AUTH, timeout=10)
        assert response.status_code == 400 and "not valid JSON" in response.json()["error"]
    assert infer(gateway, GOOD).status_code == 200


@pytest.mark.parametrize(("method", "path"), [("POST", "/v2/models/mlp/infer"), ("PUT", "/admin/models/mlp/sla")])
def test_an_unknown_expectation_is_a_json_417(gateway, method, path):
    """aiohttp answered it in text/plain before any middleware; the body is not waited for."""
    status, headers, body = raw_http(
        gateway, f"{method} {path} HTTP/1.1\r\nHost: x\r\nExpect: bogus\r\nContent-Length: 100\r\n\r\n".encode() + b"{" * 10
    )
    assert status == 417, body
    assert headers["content-type"].startswith("application/json"), (headers, body)
    assert json.loads(body)["error"] == "unknown expectation 'bogus': only 100-continue is supported"
    response = requests.post(
        f"{gateway.base}/v2/models/mlp/infer", data=json.dumps(GOOD), headers={**AUTH, "Expect": "100-continue"}, timeout=10
    )
    assert response.status_code == 200, response.text


def test_a_body_announced_over_the_limit_is_refused_before_100_continue(gateway):
    """A client that asks to continue with a body it says is over max_body_bytes is refused at
    once (RFC 9110 section 10.1.1): the gateway answered 100 Continue and let it send the body."""
    before = outcomes(gateway)
    status, headers, body = raw_http(
        gateway,
        b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode()
        + b"\r\nExpect: 100-continue\r\nContent-Length: 67108865\r\n\r\n",
    )  # fmt: skip
    assert status == 413, (status, body)
    assert json.loads(body)["error"] == "Maximum request body size 67108864 exceeded, actual body size 67108865"
    assert "x-request-id" in headers and headers.get("connection") == "close", headers
    assert outcomes(gateway).get("too_large", 0) == before.get("too_large", 0) + 1
    # Under the limit, the client is still asked to go on.
    response = requests.post(
        f"{gateway.base}/v2/models/mlp/infer", data=json.dumps(GOOD), headers={**AUTH, "Expect": "100-continue"}, timeout=10
    )
    assert response.status_code == 200, response.text


def test_bytes_that_are_no_utf8_text_are_refused_not_altered(gateway):
    """An ONNX model's BYTES input is a string tensor: the executor turned each byte that is no
    UTF-8 into U+FFFD and answered 200 with what the client never sent. Text and bytes that are
    UTF-8 still go through as they are."""
    elements = [b"\x89PNG\r\n\x1a\n\xff\xd8", "é".encode(), b"plain"]
    raw = b"".join(struct.pack("<I", len(e)) + e for e in elements)
    spec = {"name": "text", "shape": [1, 3], "datatype": "BYTES"}
    before = outcomes(gateway, "strings")
    body, length = binary_request([(spec, raw)])
    response = infer(gateway, body, "strings", {"Inference-Header-Content-Length": str(length)})
    refused(gateway, response, 400, "input 'text': element 0 is not UTF-8 text", before, "strings")
    body, length = binary_request([(spec, b"".join(struct.pack("<I", len(e)) + e for e in [b"a\x00b", *elements[1:]]))])
    answer = infer(gateway, body, "strings", {"Inference-Header-Content-Length": str(length)})
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == ["a\x00b", "é", "plain"]
