"""The KServe v2 gRPC service through tritonclient.grpc (sync and aio): every example model's
outputs against onnxruntime's, health, metadata, config and statistics, refusals with their
codes and the HTTP words, the data token as metadata, and the typed contents of the protocol."""

from __future__ import annotations

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.grpc.aio as triton_aio
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.helpers import EXAMPLES, free_port, run_gateway, write_config

# Free dimensions: a batch of 2, and 32 for the others (PP-OCR's detector needs multiples of 32).
SHAPES = {"mlp": [2, 512], "cnn_small": [2, 3, 32, 32], "cnn_large": [2, 3, 64, 64], "ppocr_det": [1, 3, 64, 96]}


@pytest.fixture(scope="module")
def grpc_gateway(example_models):
    port = free_port()
    with run_gateway(EXAMPLES / "config.toml", args=["--grpc-port", str(port)]) as gateway:
        gateway.grpc_url = f"127.0.0.1:{port}"
        yield gateway


def _tensor(name: str, array: np.ndarray, module=triton_grpc):
    tensor = module.InferInput(name, list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    return tensor


def test_every_example_model_answers_as_onnxruntime_does(grpc_gateway):
    client = triton_grpc.InferenceServerClient(grpc_gateway.grpc_url)
    assert client.is_server_live() and client.is_server_ready()
    metadata = client.get_server_metadata(as_json=True)
    assert "statistics" in metadata["extensions"]
    rng = np.random.default_rng(5)
    for model, shape in SHAPES.items():
        assert client.is_model_ready(model)
        model_metadata = client.get_model_metadata(model, as_json=True)
        (spec,), output = model_metadata["inputs"], model_metadata["outputs"][0]["name"]
        config = client.get_model_config(model, as_json=True)["config"]
        assert config["name"] == model and [i["name"] for i in config["input"]] == [spec["name"]]
        array = rng.random(shape, dtype=np.float32)
        result = client.infer(model, [_tensor(spec["name"], array)], request_id=f"r-{model}")
        expected = ort.InferenceSession(str(EXAMPLES / "models" / f"{model}.onnx")).run(None, {spec["name"]: array})[0]
        np.testing.assert_allclose(result.as_numpy(output), expected, rtol=1e-4, atol=1e-5)
        response = result.get_response(as_json=True)
        assert response["id"] == f"r-{model}" and response["parameters"]["executed_on"]["string_param"] == "cpu"
    stats = client.get_inference_statistics("mlp", as_json=True)["model_stats"][0]
    assert int(stats["inference_stats"]["success"]["count"]) >= 1 and stats["name"] == "mlp"
    everything = client.get_inference_statistics(as_json=True)["model_stats"]
    assert {s["name"] for s in everything} == set(SHAPES)


async def test_the_aio_client_too(grpc_gateway):
    client = triton_aio.InferenceServerClient(grpc_gateway.grpc_url)
    try:
        array = np.random.default_rng(6).random((3, 512), dtype=np.float32)
        results = [await client.infer("mlp", [_tensor("x", array, triton_aio)]) for _ in range(5)]
        expected = ort.InferenceSession(str(EXAMPLES / "models" / "mlp.onnx")).run(None, {"x": array})[0]
        for result in results:
            np.testing.assert_allclose(result.as_numpy("y"), expected, rtol=1e-4, atol=1e-5)
    finally:
        await client.close()


def test_refusals_carry_their_code_and_the_http_words(grpc_gateway):
    client = triton_grpc.InferenceServerClient(grpc_gateway.grpc_url)
    with pytest.raises(InferenceServerException) as wrong_shape:
        client.infer("mlp", [_tensor("x", np.zeros((1, 7), np.float32))])
    assert wrong_shape.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "input 'x' has shape [1, 7]; the model expects [any, 512]" in wrong_shape.value.message()
    with pytest.raises(InferenceServerException) as unknown:
        client.infer("nope", [_tensor("x", np.zeros((1, 512), np.float32))])
    assert unknown.value.status() == "StatusCode.NOT_FOUND" and "unknown model 'nope'" in unknown.value.message()
    with pytest.raises(InferenceServerException) as no_version:
        client.infer("mlp", [_tensor("x", np.zeros((1, 512), np.float32))], model_version="7")
    assert no_version.value.status() == "StatusCode.NOT_FOUND"
    assert "model 'mlp' has no version '7'; served versions: 1" in no_version.value.message()
    with pytest.raises(InferenceServerException) as too_many:
        client.infer("mlp", [_tensor("x", np.zeros((33, 512), np.float32))])
    assert "batch dimension 33 is outside 1..32" in too_many.value.message()
    # The refusals are counted as HTTP's are.
    outcomes = grpc_gateway.admin("mlp")["stats"]["outcomes"]
    assert outcomes.get("invalid", 0) >= 2


def test_typed_contents_are_taken_as_raw_ones(grpc_gateway):
    """The protocol lets a client send values in typed fields rather than raw bytes."""
    array = np.arange(512, dtype=np.float32).reshape(1, 512) / 512
    tensor = service_pb2.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 512])
    tensor.contents.fp32_contents.extend(array.ravel().tolist())
    with grpc.insecure_channel(grpc_gateway.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        response = stub.ModelInfer(service_pb2.ModelInferRequest(model_name="mlp", inputs=[tensor]))
    got = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(list(response.outputs[0].shape))
    expected = ort.InferenceSession(str(EXAMPLES / "models" / "mlp.onnx")).run(None, {"x": array})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_the_data_token_is_metadata_and_health_stays_open(tmp_models):
    config = tmp_models / "config.toml"
    write_config(config, {"mlp": {"path": "mlp.onnx", "sla_ms": 50, "max_batch_size": 8}})
    config.write_text('[server]\ndata_token = "s3cret-data-token"\n' + config.read_text())
    port = free_port()
    with run_gateway(config, args=["--grpc-port", str(port)]):
        client = triton_grpc.InferenceServerClient(f"127.0.0.1:{port}")
        assert client.is_server_live()
        with pytest.raises(InferenceServerException) as refused:
            client.infer("mlp", [_tensor("x", np.zeros((1, 512), np.float32))])
        assert refused.value.status() == "StatusCode.UNAUTHENTICATED"
        result = client.infer(
            "mlp", [_tensor("x", np.zeros((1, 512), np.float32))], headers={"authorization": "Bearer s3cret-data-token"}
        )
        assert result.as_numpy("y").shape == (1, 512)
