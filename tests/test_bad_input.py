"""Every client mistake gets a 4xx with a JSON error that names it; the gateway keeps serving."""

from __future__ import annotations

import json

import numpy as np
import pytest
import requests

from tests.helpers import run_gateway, write_config

GOOD = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.0] * 512}]}


def _tensor(**changes):
    tensor = {"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.0] * 512}
    tensor.update(changes)
    return {"inputs": [tensor]}


CASES = {
    "malformed JSON": (b'{"inputs": [', 400, "not valid JSON"),
    "not an object": (b"[1, 2]", 400, "JSON object"),
    "no inputs": (json.dumps({"inputs": []}).encode(), 400, "'inputs'"),
    "wrong tensor name": (json.dumps(_tensor(name="z")).encode(), 400, "unknown input 'z'"),
    "input given twice": (
        json.dumps({"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.0] * 512}] * 2}).encode(),
        400,
        "given twice",
    ),
    "wrong shape": (json.dumps(_tensor(shape=[1, 511], data=[0.0] * 511)).encode(), 400, "has shape [1, 511]"),
    "wrong rank": (json.dumps(_tensor(shape=[512])).encode(), 400, "has shape [512]"),
    "wrong datatype": (json.dumps(_tensor(datatype="INT32")).encode(), 400, "datatype 'INT32'"),
    "data does not match shape": (json.dumps(_tensor(data=[0.0] * 500)).encode(), 400, "needs 512 elements"),
    "data of the wrong kind": (json.dumps(_tensor(data=["a"] * 512)).encode(), 400, "strings"),
    "ragged data": (json.dumps(_tensor(data=[[0.0] * 256, [0.0] * 255])).encode(), 400, "ragged"),
    "no data": (json.dumps({"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32"}]}).encode(), 400, "neither 'data'"),
    "batch over max_batch_size": (json.dumps(_tensor(shape=[33, 512], data=[0.0] * 33 * 512)).encode(), 400, "max_batch_size"),
    "unknown output": (json.dumps({**GOOD, "outputs": [{"name": "nope"}]}).encode(), 400, "unknown output 'nope'"),
    # As Triton refuses it: answered, the response held the tensor twice.
    "output asked for twice": (
        json.dumps({**GOOD, "outputs": [{"name": "y"}, {"name": "y"}]}).encode(),
        400,
        "output 'y' is requested more than once",
    ),
    "negative dimension": (json.dumps(_tensor(shape=[-1, 512])).encode(), 400, "non-negative"),
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, example_models):
    folder = tmp_path_factory.mktemp("bad-input")
    (folder / "mlp.onnx").write_bytes((example_models / "mlp.onnx").read_bytes())
    config = write_config(folder / "config.toml", {"mlp": {"path": "mlp.onnx", "sla_ms": 100, "max_batch_size": 32}})
    # A small body limit, so that "body over the size limit" is cheap to send.
    config.write_text("[server]\nmax_body_bytes = 100000\n\n" + config.read_text())
    with run_gateway(config) as gateway:
        yield gateway


def _still_serving(gateway) -> None:
    response = requests.post(f"{gateway.base}/v2/models/mlp/infer", json=GOOD, timeout=10)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_infer_body_is_a_clear_400(gateway, case):
    body, status, words = CASES[case]
    response = requests.post(
        f"{gateway.base}/v2/models/mlp/infer", data=body, headers={"Content-Type": "application/json"}, timeout=10
    )
    assert response.status_code == status, response.text
    assert words in response.json()["error"]
    _still_serving(gateway)


def test_an_empty_list_of_outputs_asks_for_every_output(gateway):
    """As Triton reads it (and as the gRPC path read an empty repeated field): it answered none."""
    response = requests.post(f"{gateway.base}/v2/models/mlp/infer", json={**GOOD, "outputs": []}, timeout=10)
    assert response.status_code == 200, response.text
    assert [output["name"] for output in response.json()["outputs"]] == ["y"]


def test_unknown_model_is_404(gateway):
    response = requests.post(f"{gateway.base}/v2/models/nope/infer", json=GOOD, timeout=10)
    assert response.status_code == 404
    assert "unknown model 'nope'" in response.json()["error"]
    assert requests.get(f"{gateway.base}/v2/models/nope", timeout=10).status_code == 404
    # A version the model does not have is named as such, not as an unknown model.
    response = requests.get(f"{gateway.base}/v2/models/mlp/versions/7", timeout=10)
    assert response.status_code == 404
    assert response.json()["error"] == "model 'mlp' has no version '7'; served versions: 1"


def test_body_over_the_limit_is_413(gateway):
    body = json.dumps(_tensor(shape=[32, 512], data=np.random.default_rng(1).random(32 * 512).tolist())).encode()
    assert len(body) > 100000
    response = requests.post(f"{gateway.base}/v2/models/mlp/infer", data=body, timeout=10)
    assert response.status_code == 413
    assert "body size" in response.json()["error"].lower()
    _still_serving(gateway)


def test_binary_data_that_does_not_fit(gateway):
    header = json.dumps(
        {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "parameters": {"binary_data_size": 2048}}]}
    )
    raw = np.zeros(100, np.float32).tobytes()
    response = requests.post(
        f"{gateway.base}/v2/models/mlp/infer",
        data=header.encode() + raw,
        headers={"Inference-Header-Content-Length": str(len(header))},
        timeout=10,
    )
    assert response.status_code == 400
    assert "runs past the end" in response.json()["error"]
    bad_length = requests.post(
        f"{gateway.base}/v2/models/mlp/infer", data=b"{}", headers={"Inference-Header-Content-Length": "99"}, timeout=10
    )
    assert bad_length.status_code == 400 and "does not fit" in bad_length.json()["error"]
    _still_serving(gateway)


def test_invalid_requests_are_counted(gateway):
    requests.post(f"{gateway.base}/v2/models/mlp/infer", data=b"nope", timeout=10)
    outcomes = gateway.admin("mlp")["stats"]["outcomes"]
    assert outcomes["invalid"] >= 1
    assert 'gateway_requests_total{model="mlp",outcome="invalid"}' in gateway.metrics()
