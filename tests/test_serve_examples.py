"""`gateway serve` with the example config, driven by the real tritonclient, against ONNX Runtime."""

from __future__ import annotations

import asyncio

import numpy as np
import onnxruntime as ort
import pytest
import requests
import tritonclient.http as triton
import tritonclient.http.aio as triton_aio

# A shape per example model for the test input (the detector takes any multiple of 32).
INPUT_SHAPES = {"mlp": [3, 512], "cnn_small": [2, 3, 32, 32], "cnn_large": [2, 3, 64, 64], "ppocr_det": [1, 3, 64, 96]}


def direct_run(path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, inputs), strict=True))


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("model", sorted(INPUT_SHAPES))
def test_every_example_model_matches_onnxruntime(example_gateway, example_models, model, binary):
    client = triton.InferenceServerClient(example_gateway.url)
    metadata = client.get_model_metadata(model)
    (spec,) = metadata["inputs"]
    data = np.random.default_rng(7).random(INPUT_SHAPES[model], dtype=np.float32)
    infer_input = triton.InferInput(spec["name"], data.shape, spec["datatype"])
    infer_input.set_data_from_numpy(data, binary_data=binary)
    outputs = [triton.InferRequestedOutput(o["name"], binary_data=binary) for o in metadata["outputs"]]

    result = client.infer(model, [infer_input], outputs=outputs, request_id=f"req-{model}")

    expected = direct_run(example_models / f"{model}.onnx", {spec["name"]: data})
    for name, want in expected.items():
        got = result.as_numpy(name)
        assert got.shape == want.shape
        assert np.allclose(got, want, rtol=1e-4, atol=1e-5)
    response = result.get_response()
    assert response["id"] == f"req-{model}"
    assert response["parameters"]["executed_on"] == "cpu"
    assert response["parameters"]["batch_size"] >= data.shape[0]
    assert response["parameters"]["compute_ms"] > 0
    assert response["parameters"]["queue_ms"] >= 0


def test_server_and_model_metadata_for_tritonclient(example_gateway):
    client = triton.InferenceServerClient(example_gateway.url)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("mlp")
    assert client.get_server_metadata()["extensions"]
    config = client.get_model_config("mlp")
    assert config["max_batch_size"] == 32
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [512]}]
    assert client.get_model_metadata("mlp", model_version="1")["inputs"][0]["shape"] == [-1, 512]


def test_requested_output_subset_and_versioned_path(example_gateway):
    body = {
        "id": "v",
        "inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [[0.5] * 512]}],
        "outputs": [{"name": "y"}],
    }
    response = requests.post(f"{example_gateway.base}/v2/models/mlp/versions/1/infer", json=body, timeout=10)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["id"] == "v" and [o["name"] for o in answer["outputs"]] == ["y"]
    assert len(answer["outputs"][0]["data"]) == 512


async def test_concurrent_requests_are_batched_without_changing_results(example_gateway, example_models):
    """Many requests at once: the executor runs batches of more than one, each answer still exact.

    On the MLP, whose CPU cost is mostly the fixed cost of a batch: a CPU batches only where that
    amortizes it (schedulers/cpu_batch.py), and cnn_large's learned profile is linear in the batch."""
    rng = np.random.default_rng(3)
    inputs = [rng.random((1, 512), dtype=np.float32) for _ in range(48)]
    client = triton_aio.InferenceServerClient(example_gateway.url, conn_limit=64)
    try:

        async def one(data: np.ndarray):
            infer_input = triton_aio.InferInput("x", data.shape, "FP32")
            infer_input.set_data_from_numpy(data)
            return await client.infer("mlp", [infer_input])

        results = await asyncio.gather(*(one(data) for data in inputs))
    finally:
        await client.close()
    expected = direct_run(example_models / "mlp.onnx", {"x": np.concatenate(inputs)})["y"]
    for i, result in enumerate(results):
        assert np.allclose(result.as_numpy("y"), expected[i : i + 1], rtol=1e-4, atol=1e-5)
    assert max(r.get_response()["parameters"]["batch_size"] for r in results) > 1
