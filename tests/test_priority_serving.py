"""Priorities served: one CPU executor kept saturated by closed-loop clients of two levels;
level 1 waits less in the queue than level 2, and level 2 still completes. A priority the model
does not have, or one that is not a number, is refused 400 (HTTP) or INVALID_ARGUMENT (gRPC)
with the parameter named."""

from __future__ import annotations

import json
import shutil
import statistics
import threading

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from tests.helpers import free_port, run_gateway

ANSWERS = 12  # of each level
LOAD_CAP_S = 120.0  # a machine too slow for that many fails
JSON = {"Content-Type": "application/json"}


SHAPE = [1, 3, 128, 128]


def body(priority: int | None) -> dict:
    data = np.random.default_rng(1).random(SHAPE, dtype=np.float32).ravel().tolist()
    request = {"inputs": [{"name": "x", "shape": SHAPE, "datatype": "FP32", "data": data}]}
    if priority is not None:
        request["parameters"] = {"priority": priority}
    return request


@pytest.fixture(scope="module")
def saturated(tmp_path_factory, example_models):
    folder = tmp_path_factory.mktemp("priority")
    shutil.copy(example_models / "ppocr_det.onnx", folder / "ppocr_det.onnx")
    # The text detector at a fixed 0.1 core, batches of one: tens of ms a request, so seven
    # closed-loop clients keep a queue.
    (folder / "config.toml").write_text(
        """
[node]
cpu_cores = 2.0
[control]
policy = "fixed"
[models.ppocr_det]
path = "ppocr_det.onnx"
sla_ms = 2000
max_batch_size = 1
priority_levels = 2
priority_bound_ms = 2000
cpu = { cores = 0.1, min_cores = 0.1, threads = 1 }
"""
    )
    port = free_port()
    with run_gateway(folder / "config.toml", args=["--grpc-port", str(port)]) as gateway:
        gateway.grpc_url = f"127.0.0.1:{port}"
        yield gateway


def test_the_higher_level_waits_less_and_the_lower_still_completes(saturated):
    answers: dict[int, list[tuple[int, float]]] = {1: [], 2: []}
    enough = threading.Event()
    lock = threading.Lock()

    def client(level: int) -> None:
        # Encoded once: 49,152 floats in JSON cost the client tens of ms a request, on the
        # gateway's two cores.
        payload = json.dumps(body(level))
        with requests.Session() as session:
            while not enough.is_set():
                response = session.post(f"{saturated.base}/v2/models/ppocr_det/infer", data=payload, headers=JSON, timeout=60)
                queue_ms = response.json()["parameters"]["queue_ms"] if response.status_code == 200 else -1.0
                with lock:
                    answers[level].append((response.status_code, queue_ms))
                    if min(len(answers[1]), len(answers[2])) >= ANSWERS:
                        enough.set()

    # Until each level has ANSWERS answers: counted, not timed (a slow machine gave the one
    # level-1 client 8 answers in 5 s).
    threads = [threading.Thread(target=client, args=(level,)) for level in (1, 2, 2, 2, 2, 2, 2)]
    for thread in threads:
        thread.start()
    enough.wait(LOAD_CAP_S)
    enough.set()
    for thread in threads:
        thread.join()
    high, low = answers[1], answers[2]
    assert len(high) >= ANSWERS and len(low) >= ANSWERS, (len(high), len(low))
    assert {status for status, _ in high + low} == {200}  # level 2 still completes
    # Served FIFO both would wait about the same: behind the other six clients' requests; level 1
    # passes them.
    high_ms, low_ms = statistics.median(q for _, q in high), statistics.median(q for _, q in low)
    assert high_ms < 0.5 * low_ms, (high_ms, low_ms)


def test_a_bad_priority_is_refused_naming_it(saturated):
    url = f"{saturated.base}/v2/models/ppocr_det/infer"
    for priority, words in ((3, "priority levels 1 to 2"), ("high", "parameter 'priority'"), (-1, "parameter 'priority'")):
        response = requests.post(url, json=body(priority), timeout=30)
        assert response.status_code == 400 and words in response.json()["error"], response.text
    assert requests.post(url, json=body(0), timeout=30).status_code == 200  # 0: the model's default level
    client = triton_grpc.InferenceServerClient(saturated.grpc_url)
    tensor = triton_grpc.InferInput("x", SHAPE, "FP32")
    tensor.set_data_from_numpy(np.zeros(SHAPE, dtype=np.float32))
    with pytest.raises(InferenceServerException) as caught:
        client.infer("ppocr_det", [tensor], priority=3)
    assert caught.value.status() == str(grpc.StatusCode.INVALID_ARGUMENT) and "priority levels 1 to 2" in caught.value.message()
    assert client.infer("ppocr_det", [tensor], priority=1).as_numpy("sigmoid_0.tmp_0") is not None


def test_the_models_config_says_its_priority_levels_as_tritons_does(saturated):
    """dynamic_batching was {} whatever priority_levels the model had."""
    config = requests.get(f"{saturated.base}/v2/models/ppocr_det/config", timeout=10).json()
    assert config["dynamic_batching"] == {"priority_levels": 2, "default_priority_level": 2}, config
    over_grpc = triton_grpc.InferenceServerClient(saturated.grpc_url).get_model_config("ppocr_det", as_json=True)
    batching = over_grpc["config"]["dynamic_batching"]
    assert int(batching["priority_levels"]) == 2 and int(batching["default_priority_level"]) == 2, batching
