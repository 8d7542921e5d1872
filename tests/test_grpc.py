"""The KServe v2 gRPC service through tritonclient.grpc (sync and aio): every example model's
outputs against onnxruntime's, health, metadata, config and statistics, refusals with their
codes and the HTTP words, the data token as metadata, and the typed contents of the protocol."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.grpc.aio as triton_aio
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.cluster import wait_for
from tests.helpers import EXAMPLES, free_port, run_gateway, write_config
from tests.perf_analyzer import run_perf_analyzer_for_test

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
    # Both typed and raw contents: the protocol allows one or the other (the typed ones were dropped).
    with grpc.insecure_channel(grpc_gateway.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        both = service_pb2.ModelInferRequest(model_name="mlp", inputs=[tensor], raw_input_contents=[array.tobytes()])
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(both)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input 'x': contents must not be given when raw_input_contents are" in refused.value.details()


def test_a_streams_refusals_carry_their_requests_ids(grpc_gateway):
    """A stream's answers come in the order they end: a refusal without its request's id (as
    Triton's carries it) could not be told apart from another."""
    tensor = service_pb2.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 512])
    row = np.zeros((1, 512), np.float32).tobytes()
    requests_sent = [
        service_pb2.ModelInferRequest(model_name="mlp", id="good", inputs=[tensor], raw_input_contents=[row]),
        service_pb2.ModelInferRequest(model_name="mlp", id="short", inputs=[tensor], raw_input_contents=[row[:-4]]),
        service_pb2.ModelInferRequest(model_name="nope", id="nowhere", inputs=[tensor], raw_input_contents=[row]),
    ]
    with grpc.insecure_channel(grpc_gateway.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        answers = list(stub.ModelStreamInfer(iter(requests_sent), timeout=30))
    by_id = {a.infer_response.id: a for a in answers}
    assert sorted(by_id) == ["good", "nowhere", "short"]
    assert by_id["good"].error_message == "" and by_id["good"].infer_response.model_name == "mlp"
    assert "unknown model 'nope'" in by_id["nowhere"].error_message
    assert by_id["short"].error_message and by_id["short"].infer_response.model_name == "mlp"
    # Each answer is its request's last, marked as Triton marks it: a client that asked for empty
    # final responses (tritonclient's enable_empty_final_response) read on for the mark forever.
    assert all(a.infer_response.parameters["triton_final_response"].bool_param for a in answers), answers


def test_tensors_in_shared_memory_are_refused_naming_the_region(grpc_gateway):
    """An output asked into a shared-memory region was answered inline, as if no region had been
    named; an input in one was refused as "needs 2048 bytes, got 0"."""
    import tritonclient.http as triton_http

    for client, module in (
        (triton_grpc.InferenceServerClient(grpc_gateway.grpc_url), triton_grpc),
        (triton_http.InferenceServerClient(grpc_gateway.url), triton_http),
    ):
        output = module.InferRequestedOutput("y")
        output.set_shared_memory("out_region", 40)
        with pytest.raises(InferenceServerException) as refused:
            client.infer("mlp", [_tensor("x", np.zeros((1, 512), np.float32), module)], outputs=[output])
        assert "output 'y' names shared-memory region 'out_region': shared memory is not served here" in refused.value.message()
        tensor = module.InferInput("x", [1, 512], "FP32")
        tensor.set_shared_memory("in_region", 2048)
        with pytest.raises(InferenceServerException) as refused:
            client.infer("mlp", [tensor])
        assert "input 'x' names shared-memory region 'in_region'" in refused.value.message(), refused.value.message()


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
        # The forms HTTP takes: the scheme in any case, spaces around the token (gRPC wanted
        # exactly "Bearer TOKEN"); the wrong token in them is still refused.
        for form in ("bearer s3cret-data-token", "BEARER  s3cret-data-token "):
            answer = client.infer("mlp", [_tensor("x", np.zeros((1, 512), np.float32))], headers={"authorization": form})
            assert answer.as_numpy("y").shape == (1, 512)
            with pytest.raises(InferenceServerException) as wrong:
                client.infer("mlp", [_tensor("x", np.zeros((1, 512), np.float32))], headers={"authorization": form + "x"})
            assert wrong.value.status() == "StatusCode.UNAUTHENTICATED"
        # A stream is refused as a call is.
        tensor = service_pb2.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 512])
        request = service_pb2.ModelInferRequest(
            model_name="mlp", inputs=[tensor], raw_input_contents=[np.zeros((1, 512), np.float32).tobytes()]
        )
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stream = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter([request]))
            with pytest.raises(grpc.RpcError) as unauthenticated:
                list(stream)
        assert unauthenticated.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_typed_values_out_of_their_datatype_are_refused_as_over_http():
    """int_contents carries INT8 as int32, so 300 is a valid field: the parser must refuse it."""
    from gateway.grpc_server import as_http_request
    from gateway.protocol import InvalidRequest

    for datatype, field, value in (("INT8", "int_contents", 300), ("UINT8", "uint_contents", 1000)):
        tensor = service_pb2.ModelInferRequest.InferInputTensor(name="x", datatype=datatype, shape=[1, 1])
        getattr(tensor.contents, field).append(value)
        with pytest.raises(InvalidRequest, match=f"input 'x': a value is outside the range of {datatype}"):
            as_http_request(service_pb2.ModelInferRequest(model_name="m", inputs=[tensor]))


def test_classification_is_refused_over_grpc_as_over_http(grpc_gateway):
    client = triton_grpc.InferenceServerClient(grpc_gateway.grpc_url)
    with pytest.raises(InferenceServerException) as refused:
        client.infer(
            "mlp", [_tensor("x", np.zeros((1, 512), np.float32))], outputs=[triton_grpc.InferRequestedOutput("y", class_count=2)]
        )
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "the classification extension is not supported" in refused.value.message()


def test_a_call_its_client_gives_up_on_is_counted_as_gone(grpc_gateway):
    """A passed deadline or a cancel ends the call's task: client_gone, as an HTTP client that left."""

    before = grpc_gateway.admin("mlp")["stats"]["outcomes"]
    tensor = service_pb2.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 512])
    request = service_pb2.ModelInferRequest(
        model_name="mlp", inputs=[tensor], raw_input_contents=[np.zeros((1, 512), np.float32).tobytes()]
    )
    executor = grpc_gateway.executor_pid("mlp")
    os.kill(executor, signal.SIGSTOP)  # no call can end but by its client (well within the hang timeout)
    try:
        with grpc.insecure_channel(grpc_gateway.grpc_url) as channel:
            # Connected first, and deadlines long enough to reach the server on a slow machine: a
            # call whose deadline passed on its way, or cancelled before the server saw it, is no
            # call of the gateway's to count.
            grpc.channel_ready_future(channel).result(timeout=10)
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            for _ in range(3):
                with pytest.raises(grpc.RpcError) as late:
                    stub.ModelInfer(request, timeout=0.5)
                assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            gone = before.get("client_gone", 0) + 3
            wait_for(lambda: grpc_gateway.admin("mlp")["stats"]["outcomes"].get("client_gone", 0) >= gone, 10, "three gone")
            in_flight = grpc_gateway.admin("mlp")["stats"]["in_flight"]
            calls = [stub.ModelInfer.future(request) for _ in range(3)]
            wait_for(lambda: grpc_gateway.admin("mlp")["stats"]["in_flight"] >= in_flight + 3, 10, "the three calls received")
            assert all(call.cancel() for call in calls)
    finally:
        os.kill(executor, signal.SIGCONT)
    deadline = time.monotonic() + 30
    while (
        time.monotonic() < deadline
        and grpc_gateway.admin("mlp")["stats"]["outcomes"].get("client_gone", 0) < before.get("client_gone", 0) + 6
    ):
        time.sleep(0.2)
    outcomes = grpc_gateway.admin("mlp")["stats"]["outcomes"]
    assert outcomes.get("client_gone", 0) - before.get("client_gone", 0) == 6, outcomes
    assert outcomes.get("internal_error", 0) == before.get("internal_error", 0), outcomes


def test_calls_not_served_say_why_and_leave_no_traceback(grpc_gateway):
    with grpc.insecure_channel(grpc_gateway.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for call, request in (
            (stub.SystemSharedMemoryStatus, service_pb2.SystemSharedMemoryStatusRequest()),
            (stub.CudaSharedMemoryRegister, service_pb2.CudaSharedMemoryRegisterRequest(name="r")),
            (stub.TraceSetting, service_pb2.TraceSettingRequest()),
            (stub.LogSettings, service_pb2.LogSettingsRequest()),
        ):
            with pytest.raises(grpc.RpcError) as refused:
                call(request)
            assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
            assert "is not served by this gateway" in refused.value.details()
    assert "NotImplementedError" not in grpc_gateway.output()


def test_the_same_calls_over_http_say_why_too(grpc_gateway):
    """HTTP answered a bare 404 "Not Found" (perf_analyzer --shared-memory system printed only
    "Unable to init infer data manager: Not Found")."""
    import tritonclient.http as triton_http

    client = triton_http.InferenceServerClient(grpc_gateway.url)
    for call, words in (
        (client.get_system_shared_memory_status, "system shared memory is not served by this gateway"),
        (lambda: client.register_cuda_shared_memory("r", b"handle", 0, 4), "CUDA shared memory is not served"),
        (client.get_trace_settings, "Triton's trace settings is not served"),
        (lambda: client.get_trace_settings("mlp"), "traces go to OpenTelemetry"),
        (client.get_log_settings, "logs are set by gateway serve's --log-format"),
    ):
        with pytest.raises(InferenceServerException) as refused:
            call()
        assert refused.value.status() == "501" and words in refused.value.message(), refused.value


def test_a_model_not_served_is_not_ready_as_triton_answers(grpc_gateway):
    """Triton's ModelReady answers ready=false for a model or version it does not serve; the
    gateway raised NOT_FOUND, so that polling is_model_ready after an unload raised."""
    client = triton_grpc.InferenceServerClient(grpc_gateway.grpc_url)
    assert client.is_model_ready("mlp")
    assert not client.is_model_ready("no_such_model") and not client.is_model_ready("mlp", "7")


def test_a_stream_of_requests_is_answered_each_once(grpc_gateway):
    """tritonclient's start_stream / async_stream_infer (perf_analyzer --streaming): every
    request answered with its id, a refused one with its error, and the stream goes on."""
    import queue

    answers: queue.Queue = queue.Queue()
    client = triton_grpc.InferenceServerClient(grpc_gateway.grpc_url)
    before = grpc_gateway.admin("mlp")["stats"]["outcomes"]
    rng = np.random.default_rng(8)
    arrays = {f"r{i}": rng.random((1, 512), dtype=np.float32) for i in range(12)}
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for request_id, array in arrays.items():
            client.async_stream_infer("mlp", [_tensor("x", array)], request_id=request_id)
        client.async_stream_infer("mlp", [_tensor("x", np.zeros((1, 7), np.float32))], request_id="bad")
        client.async_stream_infer("nope", [_tensor("x", np.zeros((1, 512), np.float32))], request_id="nowhere")
        got = [answers.get(timeout=30) for _ in range(len(arrays) + 2)]
    finally:
        client.stop_stream()
    session = ort.InferenceSession(str(EXAMPLES / "models" / "mlp.onnx"))
    served = {result.get_response().id: result for result, error in got if error is None}
    assert set(served) == set(arrays)
    for request_id, result in served.items():
        expected = session.run(None, {"x": arrays[request_id]})[0]
        np.testing.assert_allclose(result.as_numpy("y"), expected, rtol=1e-4, atol=1e-5)
    errors = sorted(error.message() for result, error in got if error is not None)
    assert len(errors) == 2
    assert "input 'x' has shape [1, 7]" in errors[0] and "unknown model 'nope'" in errors[1]
    after = grpc_gateway.admin("mlp")["stats"]["outcomes"]
    assert after["success"] - before.get("success", 0) == len(arrays)
    assert after["invalid"] - before.get("invalid", 0) == 1


def test_perf_analyzer_streams_over_grpc(grpc_gateway):
    """perf_analyzer -i grpc --streaming: its requests are all answered, none refused."""
    before = grpc_gateway.admin("mlp")["stats"]["outcomes"]
    _, sent = run_perf_analyzer_for_test(
        "-m", "mlp", "-u", grpc_gateway.grpc_url, "-i", "grpc", "--streaming", "--concurrency-range", "4"
    )
    after = grpc_gateway.admin("mlp")["stats"]["outcomes"]
    assert sent > 0 and after["success"] - before.get("success", 0) >= sent
    assert {k: v - before.get(k, 0) for k, v in after.items() if k != "success" and v != before.get(k, 0)} == {}


def test_a_stream_whose_client_does_not_read_is_held_back(grpc_gateway):
    """A client that sends and never reads: the gateway reads no more of its stream once a bound
    of its requests wait to be answered (it read and served all of them, buffering the answers
    without end); once the client reads, every request is answered."""
    from gateway.grpc_server import STREAM_IN_FLIGHT

    sent = 3 * STREAM_IN_FLIGHT
    tensor = service_pb2.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 512])
    request = service_pb2.ModelInferRequest(
        model_name="mlp", inputs=[tensor], raw_input_contents=[np.zeros((1, 512), np.float32).tobytes()]
    )

    def received() -> int:
        return int(grpc_gateway.admin("mlp")["stats"]["requests"])

    before = received()
    with grpc.insecure_channel(grpc_gateway.grpc_url) as channel:
        answers = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter([request] * sent))
        last, steady_since = -1, time.monotonic()
        while time.monotonic() - steady_since < 2.0:  # until the gateway stops taking requests
            time.sleep(0.25)
            now = received() - before
            if now != last:
                last, steady_since = now, time.monotonic()
        assert STREAM_IN_FLIGHT <= last < sent, last
        got = [answer for answer, _ in zip(answers, range(sent), strict=False)]
    assert len(got) == sent and not any(answer.error_message for answer in got)


def test_an_answer_to_a_call_that_has_ended_leaves_no_error_in_the_log(caplog):
    """A client's deadline that passed as its answer was written left grpc.aio's ERROR and
    traceback ("ExecuteBatchError raised in core by servicer method") in the log, three times in a
    20-minute soak; grpc's other lines still pass."""
    import logging

    import gateway.grpc_server  # noqa: F401  (it sets the filter on grpc's logger)

    grpc_log = logging.getLogger("grpc._cython.cygrpc")
    with caplog.at_level(logging.ERROR, logger="grpc._cython.cygrpc"):
        grpc_log.error("ExecuteBatchError raised in core by servicer method [/inference.GRPCInferenceService/ModelInfer]")
        grpc_log.error("something else went wrong")
    assert [r.getMessage() for r in caplog.records] == ["something else went wrong"]


def test_a_second_gateway_on_a_grpc_port_in_use_exits_saying_so(grpc_gateway, tmp_models):
    """gRPC binds with SO_REUSEPORT by default: a second gateway on the same gRPC port started,
    and the two answered the calls between them. Its HTTP port taken, a gateway exits; so now
    for its gRPC port."""
    (tmp_models / "config.toml").write_text("[models.mlp]\npath = 'mlp.onnx'\nsla_ms = 100\n")
    port = grpc_gateway.grpc_url.rpartition(":")[2]
    second = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", str(tmp_models / "config.toml"), "--port", str(free_port())]
        + ["--grpc-port", port],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert second.returncode == 1, second.stderr[-2000:]
    assert f"cannot listen on 127.0.0.1:{port} (gRPC)" in second.stderr


def _tile_model(path):
    """x[N, 4] -> x repeated 10,000 times along its row: an answer of 160 kB a row."""
    from onnx import TensorProto, helper, numpy_helper

    from tests.helpers import save_model

    graph = helper.make_graph(
        [helper.make_node("Tile", ["x", "reps"], ["y"])],
        "tile",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 40000])],
        [numpy_helper.from_array(np.array([1, 10000], np.int64), "reps")],
    )
    return save_model(graph, path)


@pytest.fixture(scope="module")
def small_messages_gateway(tmp_path_factory, example_models):
    """Requests of at most 200 kB; a model whose answers are larger (tile), a slow one (busy: a
    few tens of ms a request, one at a time) and a fast one (mlp) on executors of their own."""
    from tests.helpers import busy_model

    folder = tmp_path_factory.mktemp("small_messages")
    _tile_model(folder / "tile.onnx")
    busy_model(folder / "busy.onnx")
    shutil.copy(example_models / "mlp.onnx", folder / "mlp.onnx")
    config = folder / "config.toml"
    config.write_text(
        '[server]\nmax_body_bytes = 200000\n[node]\ncpu_cores = 2.0\n[control]\npolicy = "fixed"\n'
        '[models.tile]\npath = "tile.onnx"\nsla_ms = 5000\ncpu = { cores = 0.5, threads = 1 }\n'
        '[models.busy]\npath = "busy.onnx"\nsla_ms = 60000\nmax_batch_size = 1\ncpu = { cores = 0.3, threads = 1 }\n'
        '[models.mlp]\npath = "mlp.onnx"\nsla_ms = 5000\ncpu = { cores = 0.5, threads = 1 }\n'
    )
    port = free_port()
    with run_gateway(config, args=["--grpc-port", str(port)]) as gateway:
        gateway.grpc_url = f"127.0.0.1:{port}"
        yield gateway


def _raw_request(model: str, request_id: str, array: np.ndarray) -> service_pb2.ModelInferRequest:
    tensor = service_pb2.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=list(array.shape))
    return service_pb2.ModelInferRequest(model_name=model, id=request_id, inputs=[tensor], raw_input_contents=[array.tobytes()])


def test_an_answer_larger_than_the_largest_request_goes_out(small_messages_gateway):
    """max_body_bytes bounded answers too: a stream whose one answer was larger failed as a whole
    (RESOURCE_EXHAUSTED), the requests after it never answered, every one counted as served.
    Triton's server sends up to 2 GiB, as HTTP's answer here has no bound."""
    gateway = small_messages_gateway
    before = gateway.admin("tile")["stats"]["outcomes"].get("success", 0)
    rows = {"s1": 1, "s2": 2, "s3": 1, "s4": 1}  # s2's answer: 320 kB
    arrays = {request_id: np.full((n, 4), i, np.float32) for i, (request_id, n) in enumerate(rows.items())}
    with grpc.insecure_channel(gateway.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        answers = list(stub.ModelStreamInfer(iter([_raw_request("tile", i, a) for i, a in arrays.items()]), timeout=60))
        alone = stub.ModelInfer(_raw_request("tile", "unary", arrays["s2"]), timeout=60)
    assert sorted(a.infer_response.id for a in answers) == sorted(rows) and not any(a.error_message for a in answers)
    for answer in [*(a.infer_response for a in answers), alone]:
        y = np.frombuffer(answer.raw_output_contents[0], np.float32).reshape(list(answer.outputs[0].shape))
        x = arrays[answer.id if answer.id in arrays else "s2"]
        assert np.array_equal(y, np.tile(x, (1, 10000)))
    assert gateway.admin("tile")["stats"]["outcomes"]["success"] - before == len(rows) + 1


def test_a_half_closed_stream_answers_each_request_as_it_ends(small_messages_gateway):
    """Once the client had sent its last request (tritonclient.grpc.aio's stream_infer half-closes
    when its iterator ends), every answer was held back until the stream's slowest request ended:
    the fast model's answer came after all of the slow model's work."""
    gateway = small_messages_gateway
    slow = 40
    before = gateway.admin("busy")["stats"]["outcomes"].get("success", 0)
    requests = [_raw_request("busy", f"slow{i}", np.full((1, 1, 8, 8), 0.5, np.float32)) for i in range(slow)]
    requests.append(_raw_request("mlp", "fast", np.zeros((1, 512), np.float32)))
    served_when_fast_came = None
    with grpc.insecure_channel(gateway.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        answers = []
        for answer in stub.ModelStreamInfer(iter(requests), timeout=120):  # half-closed after the last
            answers.append(answer)
            if answer.infer_response.id == "fast":
                served_when_fast_came = gateway.admin("busy")["stats"]["outcomes"].get("success", 0) - before
    assert len(answers) == slow + 1 and not any(a.error_message for a in answers)
    assert served_when_fast_came is not None and served_when_fast_came < slow, served_when_fast_came


def test_typed_values_that_their_shape_does_not_hold_are_refused_before_any_is_read():
    """5,000,000 strings for a shape of [1] were converted on the loop (3.7 s, 600 MB) before the
    parser refused them."""
    from gateway.grpc_server import as_http_request
    from gateway.protocol import InvalidRequest

    tensor = service_pb2.ModelInferRequest.InferInputTensor(name="s", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.extend([b"ab"] * 3)
    with pytest.raises(InvalidRequest, match=r"input 's': its contents hold 3 values, and its shape \[1\] has 1 elements"):
        as_http_request(service_pb2.ModelInferRequest(model_name="m", inputs=[tensor]))
    # Converted piece by piece, values of every kind come out as one call would make them.
    from gateway.grpc_server import PIECE_VALUES

    many = 2 * PIECE_VALUES + 3
    strings = service_pb2.ModelInferRequest.InferInputTensor(name="s", datatype="BYTES", shape=[many])
    strings.contents.bytes_contents.extend([str(i).encode() for i in range(many)])
    numbers = service_pb2.ModelInferRequest.InferInputTensor(name="n", datatype="INT16", shape=[many])
    values = [i % 60000 - 30000 for i in range(many)]
    numbers.contents.int_contents.extend(values)
    body, length = as_http_request(service_pb2.ModelInferRequest(model_name="m", inputs=[strings, numbers]))
    from executors.tensors import encode_bytes_elements

    expected_strings = encode_bytes_elements(np.array([str(i).encode() for i in range(many)], dtype=np.object_))
    assert body[length:] == expected_strings + np.array(values, np.int16).tobytes()


def test_a_message_that_is_no_protobuf_is_refused_as_invalid(small_messages_gateway, caplog):
    """grpc answered UNKNOWN ("Unexpected <class 'DecodeError'>") and logged a traceback for each;
    in a stream, such a message gets its own error answer and the stream goes on."""
    gateway = small_messages_gateway
    with grpc.insecure_channel(gateway.grpc_url) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as refused:
            infer(b"\xff\xff\xff", timeout=10)
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        good = _raw_request("mlp", "good", np.zeros((1, 512), np.float32)).SerializeToString()
        answers = [service_pb2.ModelStreamInferResponse.FromString(a) for a in stream(iter([b"\xff\xff\xff", good]), timeout=30)]
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "the message is no valid ModelInferRequest" in refused.value.details()
    assert len(answers) == 2
    assert sorted(bool(a.error_message) for a in answers) == [False, True]
    assert any(a.infer_response.id == "good" and not a.error_message for a in answers)
    assert "DecodeError" not in gateway.output()


def test_an_answer_over_what_one_grpc_message_carries_is_refused_saying_so(monkeypatch):
    import gateway.grpc_server as grpc_server

    monkeypatch.setattr(grpc_server, "MAX_MESSAGE_BYTES", grpc_server.ANSWER_HEAD_BYTES + 100)
    assert grpc_server.why_answer_too_large(service_pb2.ModelInferResponse(raw_output_contents=[b"x" * 60, b"y" * 40])) is None
    reason = grpc_server.why_answer_too_large(service_pb2.ModelInferResponse(raw_output_contents=[b"x" * 60, b"y" * 41]))
    assert reason is not None and "outputs take 101 bytes" in reason and "over HTTP" in reason


def test_typed_values_are_read_once_each_and_large_strings_count_as_large():
    """Each piece was cut from the field anew (islice from its start), reading the first values
    again for every piece: quadratic, 8 s for 16 MiB, the GIL held throughout. And strings were
    counted 8 bytes each: 60 MB of them were parsed on the event loop."""
    from gateway.grpc_server import PIECE_VALUES, _typed_contents, rough_size
    from gateway.protocol import LARGE_BYTES

    class Counted(list):
        read = 0

        def __iter__(self):
            for value in super().__iter__():
                Counted.read += 1
                yield value

    many = 4 * PIECE_VALUES + 5
    tensor = service_pb2.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[many])
    values = Counted(float(i) for i in range(many))
    assert _typed_contents(tensor, values) == np.arange(many, dtype=np.float32).tobytes()
    assert Counted.read == many
    strings = service_pb2.ModelInferRequest.InferInputTensor(name="s", datatype="BYTES", shape=[20])
    strings.contents.bytes_contents.extend([b"x" * 100_000] * 20)
    assert rough_size(service_pb2.ModelInferRequest(model_name="m", inputs=[strings])) > LARGE_BYTES
    # Many short strings cost by their number: 520,000 held the loop 0.5 s.
    short = service_pb2.ModelInferRequest.InferInputTensor(name="s", datatype="BYTES", shape=[150_000])
    short.contents.bytes_contents.extend([b""] * 150_000)
    assert rough_size(service_pb2.ModelInferRequest(model_name="m", inputs=[short])) > LARGE_BYTES
