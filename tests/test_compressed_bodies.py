"""Request bodies in gzip or deflate (tritonclient's request_compression_algorithm): inflated up
to max_body_bytes and no further, off the event loop; a body that does not inflate is a 400 that
leaves neither a traceback nor a broken connection; a coding the gateway cannot undo is a 415.
Infer responses compressed in the coding the client's Accept-Encoding weighs highest
(tritonclient's response_compression_algorithm)."""

from __future__ import annotations

import gzip
import http.client
import json
import shutil
import socket
import zlib

import numpy as np
import onnxruntime as ort
import pytest
import requests
import tritonclient.http as triton

from gateway.content_coding import (
    COMPRESS_ON_LOOP_BYTES,
    BadCoding,
    BodyTooLarge,
    UnsupportedCoding,
    codings_of,
    decode,
    response_coding,
)
from tests.helpers import run_gateway

MAX_BODY_BYTES = 8 << 20
GOOD = json.dumps({"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.5] * 512}]}).encode()


# -- the codings, pure ----------------------------------------------------------------------------


def test_gzip_members_and_both_kinds_of_deflate_are_undone():
    assert decode(gzip.compress(b"abc") + gzip.compress(b"def"), ["gzip"], 100) == b"abcdef"
    assert decode(zlib.compress(b"abc"), ["deflate"], 100) == b"abc"
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    assert decode(raw.compress(b"abc") + raw.flush(), ["deflate"], 100) == b"abc"
    # Codings listed in the order they were applied are undone last first.
    assert decode(gzip.compress(zlib.compress(b"abc")), codings_of("deflate, gzip"), 100) == b"abc"
    assert codings_of("") == [] and codings_of("identity") == [] and codings_of("X-GZIP") == ["x-gzip"]


def test_a_bomb_is_inflated_one_byte_past_the_limit_and_no_further():
    bomb = gzip.compress(bytes(64 << 20))  # 64 MiB of zeros in about 64 KiB
    with pytest.raises(BodyTooLarge, match="inflates to more than 1048576 bytes"):
        decode(bomb, ["gzip"], 1 << 20)
    assert len(decode(gzip.compress(bytes(1 << 20)), ["gzip"], 1 << 20)) == 1 << 20  # exactly the limit


def test_bytes_not_in_their_coding_are_named():
    with pytest.raises(BadCoding, match="not valid gzip"):
        decode(b"this is not gzip", ["gzip"], 100)
    with pytest.raises(BadCoding, match="ends before its stream does"):
        decode(gzip.compress(b"abc" * 100)[:-12], ["gzip"], 1000)
    with pytest.raises(BadCoding, match="bytes follow the end of its stream"):
        decode(zlib.compress(b"abc") + b"tail", ["deflate"], 100)
    with pytest.raises(UnsupportedCoding, match="Content-Encoding 'br' is not supported"):
        codings_of("br")


def test_a_response_is_compressed_in_the_coding_the_client_weighs_highest():
    assert response_coding(None) is None and response_coding("") is None and response_coding("identity") is None
    assert response_coding("gzip") == "gzip" and response_coding("X-GZIP") == "gzip"
    assert response_coding("deflate") == "deflate"
    assert response_coding("gzip, deflate") == "gzip"  # alike: gzip
    assert response_coding("gzip;q=0.5, deflate") == "deflate"
    assert response_coding("gzip; Q=0.8 , deflate;q=0.9") == "deflate"
    assert response_coding("gzip;q=0") is None and response_coding("*;q=0") is None
    assert response_coding("*") == "gzip" and response_coding("*, gzip;q=0") == "deflate"
    assert response_coding("br") is None  # none the gateway makes
    assert response_coding("identity;q=1, gzip;q=0.5") is None  # identity weighed above
    # A weight that is no qvalue leaves its item out, not the header.
    assert response_coding("gzip;q=1.5, deflate;q=0.1") == "deflate"
    assert response_coding("gzip;q=abc") is None and response_coding("gzip;q=0.1234") is None
    assert response_coding("gzip;q=1.000") == "gzip" and response_coding("gzip;level=9;q=0.2") == "gzip"
    # Digits of other scripts are no qvalue (str.isdigit takes them; float() does not).
    assert response_coding("gzip;q=0.\u00b2, deflate;q=0.1") == "deflate" and response_coding("gzip;q=\u0661") is None


# -- served ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, example_models):
    folder = tmp_path_factory.mktemp("compressed")
    shutil.copy(example_models / "mlp.onnx", folder / "mlp.onnx")
    (folder / "config.toml").write_text(
        f'[server]\nmax_body_bytes = {MAX_BODY_BYTES}\n[node]\ncpu_cores = 1.0\n[control]\npolicy = "fixed"\n'
        '[models.mlp]\npath = "mlp.onnx"\nsla_ms = 1000\nmax_batch_size = 64\ncpu = { cores = 0.5, threads = 1 }\n'
    )
    with run_gateway(folder / "config.toml") as running:
        yield running


def _outcomes(gateway) -> dict[str, int]:
    return requests.get(f"{gateway.base}/admin/models/mlp", timeout=10).json()["stats"]["outcomes"]


def test_tritonclient_compresses_its_requests_and_is_answered(gateway, example_models):
    client = triton.InferenceServerClient(gateway.url)
    array = np.random.default_rng(3).random((2, 512), dtype=np.float32)
    expected = ort.InferenceSession(str(example_models / "mlp.onnx")).run(None, {"x": array})[0]
    for algorithm in ("gzip", "deflate"):
        for binary in (True, False):
            tensor = triton.InferInput("x", [2, 512], "FP32")
            tensor.set_data_from_numpy(array, binary_data=binary)
            result = client.infer("mlp", [tensor], request_compression_algorithm=algorithm)
            np.testing.assert_allclose(result.as_numpy("y"), expected, rtol=1e-5, atol=1e-6)


def test_a_gzip_bomb_is_a_413_and_the_gateway_goes_on(gateway):
    """4 MiB of gzip that inflate to 4 GiB: aiohttp inflated all of it on the event loop, also
    past the limit while it drained the body, and the client never saw its 413."""
    member = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    one_gib = b"".join(member.compress(zeros) for _ in range(1024)) + member.flush()
    bomb = one_gib * 4
    before = _outcomes(gateway)
    response = requests.post(f"{gateway.base}/v2/models/mlp/infer", data=bomb, headers={"Content-Encoding": "gzip"}, timeout=60)
    assert response.status_code == 413, response.text
    assert f"inflates to more than {MAX_BODY_BYTES} bytes" in response.json()["error"]
    after = _outcomes(gateway)
    assert after.get("too_large", 0) == before.get("too_large", 0) + 1, after
    assert requests.post(f"{gateway.base}/v2/models/mlp/infer", data=GOOD, timeout=10).status_code == 200


def test_a_body_that_does_not_inflate_is_a_400_on_a_connection_that_goes_on(gateway):
    """It was a 400, then aiohttp drained the body, failed again, logged an ERROR with its
    traceback and closed the connection without saying so."""
    connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
    before = _outcomes(gateway)
    for _ in range(3):
        connection.request("POST", "/v2/models/mlp/infer", body=b"this is not gzip", headers={"Content-Encoding": "gzip"})
        response = connection.getresponse()
        assert response.status == 400
        assert "the request body is not valid gzip" in json.loads(response.read())["error"]
    connection.request("POST", "/v2/models/mlp/infer", body=GOOD)
    assert connection.getresponse().status == 200  # the same connection
    connection.close()
    after = _outcomes(gateway)
    assert after.get("invalid", 0) == before.get("invalid", 0) + 3 and after.get("internal_error", 0) == 0
    assert "Unhandled exception" not in gateway.output() and "Traceback" not in gateway.output()


def test_a_coding_the_gateway_cannot_undo_is_a_415_naming_it(gateway):
    response = requests.post(f"{gateway.base}/v2/models/mlp/infer", data=GOOD, headers={"Content-Encoding": "br"}, timeout=10)
    assert response.status_code == 415
    assert response.json()["error"] == "Content-Encoding 'br' is not supported; the gateway takes gzip and deflate"


def test_a_content_encoding_over_two_header_lines_is_read_whole(gateway):
    """RFC 9110 5.3: two lines of a list header are one line with a comma between. Its first line
    alone was read: a body gzipped twice was inflated once (400), and a br on the second line
    after an identity on the first was taken for none (the br bytes parsed as the body)."""
    twice = gzip.compress(gzip.compress(GOOD))
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        for codings, body, status in ((("gzip", "gzip"), twice, 200), (("identity", "br"), GOOD, 415)):
            lines = "".join(f"Content-Encoding: {coding}\r\n" for coding in codings)
            head = f"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{lines}\r\n"
            sock.sendall(head.encode() + body)
            response = http.client.HTTPResponse(sock)
            response.begin()
            assert response.status == status, (codings, response.read())
            response.read()


def _post(gateway, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """The status, headers and body bytes exactly as sent (http.client inflates nothing)."""
    connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=30)
    try:
        connection.request("POST", "/v2/models/mlp/infer", body=body, headers=headers)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def _rows(example_models, rows: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """An input of ``rows`` rows, the MLP's answer to it, and its JSON request."""
    array = np.random.default_rng(rows).random((rows, 512), dtype=np.float32)
    expected = ort.InferenceSession(str(example_models / "mlp.onnx")).run(None, {"x": array})[0]
    request = {"inputs": [{"name": "x", "shape": [rows, 512], "datatype": "FP32", "data": array.ravel().tolist()}]}
    return array, expected, request


@pytest.fixture(scope="module")
def compressing_all(tmp_path_factory, example_models):
    folder = tmp_path_factory.mktemp("compressing")
    shutil.copy(example_models / "mlp.onnx", folder / "mlp.onnx")
    (folder / "config.toml").write_text(
        '[server]\ncompress_min_bytes = 0\n[node]\ncpu_cores = 1.0\n[control]\npolicy = "fixed"\n'
        '[models.mlp]\npath = "mlp.onnx"\nsla_ms = 1000\nmax_batch_size = 64\ncpu = { cores = 0.5, threads = 1 }\n'
    )
    with run_gateway(folder / "config.toml") as running:
        yield running


@pytest.mark.parametrize("rows", [2, 64])
def test_an_answer_is_compressed_as_asked_and_tritonclient_reads_it(compressing_all, example_models, rows):
    """With compress_min_bytes = 0, every answer asked for. Over COMPRESS_ON_LOOP_BYTES (the JSON
    answers, and 64 rows' binary one) it is compressed in the codec thread; 2 rows' binary answer
    (4 KiB) on the event loop."""
    gateway = compressing_all
    array, expected, request = _rows(example_models, rows)
    body = json.dumps(request).encode()
    plain_status, plain_headers, plain = _post(gateway, body, {})
    assert plain_status == 200 and "content-encoding" not in plain_headers
    assert len(plain) > COMPRESS_ON_LOOP_BYTES
    inflate = {"gzip": gzip.decompress, "deflate": zlib.decompress}  # deflate: a zlib stream
    for accept, coding in (("gzip", "gzip"), ("deflate", "deflate"), ("gzip;q=0.4, deflate;q=0.6", "deflate")):
        status, headers, sent = _post(gateway, body, {"Accept-Encoding": accept})
        assert status == 200 and headers["content-encoding"] == coding, (accept, headers)
        assert int(headers["content-length"]) == len(sent) < len(plain)
        outputs = json.loads(inflate[coding](sent))["outputs"]
        answered = np.asarray(outputs[0]["data"], dtype=np.float32).reshape(rows, 512)
        np.testing.assert_allclose(answered, expected, rtol=1e-5, atol=1e-6)
    # Refused by weight: sent as it is.
    status, headers, sent = _post(gateway, body, {"Accept-Encoding": "gzip;q=0, identity"})
    assert status == 200 and "content-encoding" not in headers
    assert json.loads(sent)["outputs"][0]["data"] == json.loads(plain)["outputs"][0]["data"]
    # Binary outputs: the header's length counts the JSON header before compression, as
    # Triton's does; tritonclient inflates the whole body and then splits it there.
    client = triton.InferenceServerClient(gateway.url)
    for algorithm in ("gzip", "deflate"):
        for binary in (True, False):
            tensor = triton.InferInput("x", [rows, 512], "FP32")
            tensor.set_data_from_numpy(array, binary_data=True)
            output = triton.InferRequestedOutput("y", binary_data=binary)
            result = client.infer("mlp", [tensor], outputs=[output], response_compression_algorithm=algorithm)
            np.testing.assert_allclose(result.as_numpy("y"), expected, rtol=1e-5, atol=1e-6)
    binary_request = json.dumps(
        {"inputs": request["inputs"], "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}
    ).encode()
    status, headers, sent = _post(gateway, binary_request, {"Accept-Encoding": "gzip"})
    assert status == 200 and headers["content-encoding"] == "gzip"
    whole = gzip.decompress(sent)
    assert (len(whole) > COMPRESS_ON_LOOP_BYTES) == (rows == 64)
    header_length = int(headers["inference-header-content-length"])
    assert json.loads(whole[:header_length])["outputs"][0]["parameters"]["binary_data_size"] == rows * 512 * 4
    answered = np.frombuffer(whole[header_length:], dtype=np.float32).reshape(rows, 512)
    np.testing.assert_allclose(answered, expected, rtol=1e-5, atol=1e-6)


def test_an_answer_under_compress_min_bytes_is_sent_as_it_is(gateway, example_models):
    """The default, 64 KiB: python-requests and aiohttp ask for gzip with every request."""
    for rows, compressed in ((2, False), (64, True)):
        _, expected, request = _rows(example_models, rows)
        status, headers, sent = _post(gateway, json.dumps(request).encode(), {"Accept-Encoding": "gzip, deflate"})
        assert status == 200 and (headers.get("content-encoding") == "gzip") == compressed, (rows, headers)
        outputs = json.loads(gzip.decompress(sent) if compressed else sent)["outputs"]
        answered = np.asarray(outputs[0]["data"], dtype=np.float32).reshape(rows, 512)
        np.testing.assert_allclose(answered, expected, rtol=1e-5, atol=1e-6)
    # A weight the gateway cannot read leaves its item out: the answer is served (it was a 500).
    status, headers, sent = _post(gateway, json.dumps(request).encode(), {"Accept-Encoding": "gzip;q=0.\u00b2"})
    assert status == 200 and "content-encoding" not in headers, sent[:200]
