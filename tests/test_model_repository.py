"""Triton's model repository extension (gateway/repository.py): a model loaded through
tritonclient while another serves under load, answering as onnxruntime does; unloaded with
requests in flight, each of which still gets an answer; the index, a bad config override, the
admin token, and the same calls over gRPC."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import shutil
import signal
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import requests
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
from onnx import numpy_helper
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.cluster import wait_for
from tests.helpers import busy_model, free_port, metric_value, run_gateway

MLP_BODY = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.25] * 512}]}


@pytest.fixture(scope="module")
def repository(tmp_path_factory, example_models):
    folder = tmp_path_factory.mktemp("repository")
    shutil.copy(example_models / "mlp.onnx", folder / "mlp.onnx")
    # Repository models: one by version folders (defaults for the rest), one with its config.toml.
    (folder / "mlp2" / "1").mkdir(parents=True)
    shutil.copy(example_models / "mlp.onnx", folder / "mlp2" / "1" / "model.onnx")
    (folder / "small").mkdir()
    shutil.copy(example_models / "cnn_small.onnx", folder / "small" / "cnn_small.onnx")
    (folder / "small" / "config.toml").write_text('path = "cnn_small.onnx"\nsla_ms = 500\nmax_batch_size = 4\n')
    # Two versions of one model: the MLP, and the MLP with its weights doubled.
    for version in ("1", "2"):
        (folder / "duo" / version).mkdir(parents=True)
    shutil.copy(example_models / "mlp.onnx", folder / "duo" / "1" / "model.onnx")
    doubled = onnx.load(str(example_models / "mlp.onnx"))
    for tensor in doubled.graph.initializer:
        array = numpy_helper.to_array(tensor)
        tensor.CopyFrom(numpy_helper.from_array((array * 2).astype(array.dtype), tensor.name))
    doubled.ir_version = 9
    onnx.save(doubled, str(folder / "duo" / "2" / "model.onnx"))
    (folder / "config.toml").write_text(
        """
[server]
admin_token = "an-admin-token-of-length"
[node]
cpu_cores = 2.0
[control]
policy = "fixed"
[models.mlp]
path = "mlp.onnx"
sla_ms = 200
cpu = { cores = 0.5, threads = 1 }
"""
    )
    grpc_port = free_port()
    with run_gateway(folder / "config.toml", args=["--grpc-port", str(grpc_port)]) as gateway:
        gateway.grpc_url = f"127.0.0.1:{grpc_port}"
        gateway.folder = folder
        yield gateway


ADMIN = {"Authorization": "Bearer an-admin-token-of-length"}


@contextlib.contextmanager
def _sending(url: str, body: dict, clients: int = 1) -> Iterator[list[tuple[int, str]]]:
    """``clients`` clients sending ``body`` to ``url``, each a request after each answer, while the
    block runs: the answers they got (status, text)."""
    answers: list[tuple[int, str]] = []
    done = threading.Event()

    def send() -> None:
        with requests.Session() as session:
            while not done.is_set():
                response = session.post(url, json=body, timeout=30)
                answers.append((response.status_code, response.text))

    senders = [threading.Thread(target=send) for _ in range(clients)]
    for sender in senders:
        sender.start()
    try:
        yield answers
    finally:
        done.set()
        for sender in senders:
            sender.join()


def queued(gateway, model: str) -> float:
    return metric_value(gateway.metrics(), "gateway_queue_length", model=model)


def index(gateway) -> dict[str, str]:
    response = requests.post(f"{gateway.base}/v2/repository/index", headers=ADMIN, timeout=10)
    assert response.status_code == 200, response.text
    return {e["name"]: e["state"] for e in response.json()}


def test_a_model_is_loaded_served_and_unloaded_while_another_serves(repository, example_models):
    base = repository.base
    client = triton.InferenceServerClient(repository.url, network_timeout=120)
    assert index(repository) == {"duo": "UNAVAILABLE", "mlp": "READY", "mlp2": "UNAVAILABLE", "small": "UNAVAILABLE"}
    assert requests.post(f"{base}/v2/models/mlp2/infer", json=MLP_BODY, timeout=10).status_code == 404

    with _sending(f"{base}/v2/models/mlp/infer", MLP_BODY) as serving:
        client.load_model("mlp2", headers=ADMIN)
        assert client.is_model_ready("mlp2")
        assert index(repository)["mlp2"] == "READY"
        array = np.random.default_rng(2).random((3, 512), dtype=np.float32)
        tensor = triton.InferInput("x", [3, 512], "FP32")
        tensor.set_data_from_numpy(array)
        expected = ort.InferenceSession(str(example_models / "mlp.onnx")).run(None, {"x": array})[0]
        np.testing.assert_allclose(client.infer("mlp2", [tensor]).as_numpy("y"), expected, rtol=1e-5, atol=1e-6)

        # Unloaded with requests to it in flight: each ends with an answer, none is lost. Each
        # sender goes on until it is told the model is gone (a fixed 40 each could all be
        # answered before the unload on a fast machine).
        in_flight: list[tuple[int, str]] = []
        sent = [0] * 4

        def send_to_mlp2(sender: int) -> None:
            deadline = time.monotonic() + 60
            with requests.Session() as session:
                while time.monotonic() < deadline:
                    sent[sender] += 1
                    response = session.post(f"{base}/v2/models/mlp2/infer", json=MLP_BODY, timeout=30)
                    in_flight.append((response.status_code, response.text))
                    if response.status_code == 404:
                        return

        senders = [threading.Thread(target=send_to_mlp2, args=(i,)) for i in range(4)]
        for sender in senders:
            sender.start()
        wait_for(lambda: len(in_flight) >= 8, 10, "mlp2 serving its senders")
        client.unload_model("mlp2", headers=ADMIN)
        for sender in senders:
            sender.join()
    assert len(in_flight) == sum(sent)
    assert [status for status, _ in in_flight].count(404) == 4, "a sender was never told the model is gone"
    statuses = {status for status, _ in in_flight}
    assert statuses <= {200, 404, 503} and 404 in statuses, statuses
    assert all("unloaded" in text or "unknown model" in text for status, text in in_flight if status != 200)
    after = requests.post(f"{base}/v2/models/mlp2/infer", json=MLP_BODY, timeout=10)
    assert after.status_code == 404 and "unknown model 'mlp2'" in after.json()["error"]
    assert index(repository)["mlp2"] == "UNAVAILABLE"
    assert serving and {status for status, _ in serving} == {200}  # the model that stayed served every request
    # Its cores went back: the supervisor's arithmetic has only mlp again.
    assert [m["name"] for m in requests.get(f"{base}/admin/models", headers=ADMIN, timeout=10).json()["models"]] == ["mlp"]


def test_a_bad_override_and_an_unknown_model_are_refused_naming_them(repository):
    client = triton.InferenceServerClient(repository.url)
    with pytest.raises(InferenceServerException, match=r"max_batch: unknown key"):
        client.load_model("small", headers=ADMIN, config=json.dumps({"max_batch": 3}))
    with pytest.raises(InferenceServerException, match=r"sla_ms: must be a positive number"):
        client.load_model("small", headers=ADMIN, config=json.dumps({"sla_ms": -5}))
    with pytest.raises(InferenceServerException, match=r"no model 'nothing' in the repository"):
        client.load_model("nothing", headers=ADMIN)
    # Nesting deeper than the parser's recursion is refused as not JSON, as in a body.
    with pytest.raises(InferenceServerException, match=r"parameter 'config' is not valid JSON"):
        client.load_model("small", headers=ADMIN, config="[" * 100_000 + "]" * 100_000)
    # A model's files in the request (Triton's file:VERSION/NAME) were ignored, and the model on
    # disk was loaded as if they were it: refused, over both protocols.
    files = {"file:1/model.onnx": b"not the model on disk"}
    with pytest.raises(InferenceServerException, match=r"parameter 'file:1/model.onnx': model files sent in a load"):
        client.load_model("small", headers=ADMIN, config=json.dumps({"sla_ms": 60}), files=files)
    grpc_client = triton_grpc.InferenceServerClient(repository.grpc_url)
    with pytest.raises(InferenceServerException, match=r"model files sent in a load request are not accepted") as refused:
        grpc_client.load_model(
            "small", headers={k.lower(): v for k, v in ADMIN.items()}, config=json.dumps({"sla_ms": 60}), files=files
        )
    assert refused.value.status() == str(grpc.StatusCode.INVALID_ARGUMENT)
    # The admin token is needed; tritonclient's own index call reads the same list.
    assert requests.post(f"{repository.base}/v2/repository/models/small/load", timeout=10).status_code == 401
    listed = {e["name"]: e["state"] for e in client.get_model_repository_index(headers=ADMIN)}
    assert listed["small"] == "UNAVAILABLE" and listed["mlp"] == "READY"
    assert index(repository)["small"] == "UNAVAILABLE"


def test_the_repository_over_grpc(repository, example_models):
    client = triton_grpc.InferenceServerClient(repository.grpc_url)
    metadata = {"authorization": "Bearer an-admin-token-of-length"}
    with pytest.raises(InferenceServerException) as refused:
        client.load_model("small")  # no admin token
    assert refused.value.status() == str(grpc.StatusCode.UNAUTHENTICATED)
    with grpc.insecure_channel(repository.grpc_url) as channel:  # a config that is not a string: named
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.RepositoryModelLoadRequest(model_name="small")
        request.parameters["config"].int64_param = 3
        with pytest.raises(grpc.RpcError) as not_text:
            stub.RepositoryModelLoad(request, metadata=tuple(metadata.items()))
    assert not_text.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "parameter 'config' must be a string" in not_text.value.details()
    client.load_model("small", headers=metadata, config=json.dumps({"sla_ms": 300}))
    states = {m.name: m.state for m in client.get_model_repository_index(headers=metadata).models}
    assert states["small"] == "READY"
    array = np.random.default_rng(4).random((2, 3, 32, 32), dtype=np.float32)
    tensor = triton_grpc.InferInput("x", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    expected = ort.InferenceSession(str(Path(repository.folder) / "small" / "cnn_small.onnx")).run(None, {"x": array})[0]
    np.testing.assert_allclose(client.infer("small", [tensor]).as_numpy("logits"), expected, rtol=1e-4, atol=1e-5)
    assert requests.get(f"{repository.base}/admin/models/small", headers=ADMIN, timeout=10).json()["sla_ms"] == 300
    client.unload_model("small", headers=metadata)
    with pytest.raises(InferenceServerException) as gone:
        client.infer("small", [tensor])
    assert gone.value.status() == str(grpc.StatusCode.NOT_FOUND)


def test_versions_are_served_side_by_side_the_latest_by_default(repository):
    client = triton.InferenceServerClient(repository.url)
    client.load_model("duo", headers=ADMIN)
    array = np.random.default_rng(6).random((2, 512), dtype=np.float32)
    folder = Path(repository.folder)
    by_version = {v: ort.InferenceSession(str(folder / "duo" / v / "model.onnx")).run(None, {"x": array})[0] for v in ("1", "2")}
    assert not np.allclose(by_version["1"], by_version["2"])
    tensor = triton.InferInput("x", [2, 512], "FP32")
    tensor.set_data_from_numpy(array)
    latest = client.infer("duo", [tensor])
    assert latest.get_response()["model_name"] == "duo" and latest.get_response()["model_version"] == "2"
    np.testing.assert_allclose(latest.as_numpy("y"), by_version["2"], rtol=1e-5, atol=1e-5)
    first = client.infer("duo", [tensor], model_version="1")
    assert first.get_response()["model_version"] == "1"
    np.testing.assert_allclose(first.as_numpy("y"), by_version["1"], rtol=1e-5, atol=1e-5)
    assert client.get_model_metadata("duo")["versions"] == ["1", "2"]
    missing = requests.post(f"{repository.base}/v2/models/duo/versions/3/infer", json=MLP_BODY, timeout=10)
    assert missing.status_code == 404 and "served versions: 1, 2" in missing.json()["error"]
    entries = requests.post(f"{repository.base}/v2/repository/index", headers=ADMIN, timeout=10).json()
    assert [(e["version"], e["state"]) for e in entries if e["name"] == "duo"] == [("1", "READY"), ("2", "READY")]
    # Statistics and Triton's series name the model and version clients use (they were
    # "duo.v2", version "1"); a request naming no version reads every version, as Triton's.
    http_stats = client.get_inference_statistics("duo", "2")["model_stats"]
    assert [(s["name"], s["version"], s["inference_count"]) for s in http_stats] == [("duo", "2", 2)]
    every = client.get_inference_statistics("duo")["model_stats"]
    assert [(s["name"], s["version"], s["inference_count"]) for s in every] == [("duo", "1", 2), ("duo", "2", 2)]
    grpc_client = triton_grpc.InferenceServerClient(repository.grpc_url)
    over_grpc = grpc_client.get_inference_statistics("duo", "1", as_json=True)["model_stats"]
    assert [(s["name"], s["version"], s["inference_count"]) for s in over_grpc] == [("duo", "1", "2")]
    assert len(grpc_client.get_inference_statistics("duo", as_json=True)["model_stats"]) == 2
    lines = repository.metrics().splitlines()
    assert 'nv_inference_count{model="duo",version="2"} 2' in lines
    assert 'nv_inference_count{model="duo",version="1"} 2' in lines
    assert client.get_model_config("duo", "1")["name"] == "duo"
    # The admin API reaches each version by the name its list gives (they were listed, then 404):
    # version 1's SLA is set there and version 2's is not; the plain name is the latest version.
    listed = [m["name"] for m in requests.get(f"{repository.base}/admin/models", headers=ADMIN, timeout=10).json()["models"]]
    assert {"duo.v1", "duo.v2"} <= set(listed)
    for key in ("duo.v1", "duo.v2"):
        assert requests.get(f"{repository.base}/admin/models/{key}", headers=ADMIN, timeout=10).json()["name"] == key
    sla = requests.put(f"{repository.base}/admin/models/duo.v1/sla", json={"sla_ms": 321}, headers=ADMIN, timeout=10)
    assert sla.status_code == 200, sla.text
    admin = {
        key: requests.get(f"{repository.base}/admin/models/{key}", headers=ADMIN, timeout=10).json() for key in ("duo.v1", "duo")
    }
    assert admin["duo.v1"]["sla_ms"] == 321 and admin["duo"]["name"] == "duo.v2" and admin["duo"]["sla_ms"] != 321
    client.unload_model("duo", headers=ADMIN)
    assert requests.get(f"{repository.base}/admin/models/duo.v1", headers=ADMIN, timeout=10).status_code == 404
    assert requests.post(f"{repository.base}/v2/models/duo/infer", json=MLP_BODY, timeout=10).status_code == 404
    assert requests.post(f"{repository.base}/v2/models/duo/versions/1/infer", json=MLP_BODY, timeout=10).status_code == 404


def test_a_versions_own_name_is_no_model_of_the_clients(repository, example_models):
    """A version runs under NAME.vN, a name a model may have too: it was served as a model of its
    own, unloading it broke its model, and a load under it (or of a model whose version took a
    served model's name) replaced the other model."""
    client = triton.InferenceServerClient(repository.url)
    client.load_model("duo", headers=ADMIN)
    clash = Path(repository.folder) / "duo.v1"
    clash.mkdir()
    shutil.copy(example_models / "mlp.onnx", clash / "mlp.onnx")
    (clash / "config.toml").write_text('path = "mlp.onnx"\nsla_ms = 500\n')
    try:
        assert requests.get(f"{repository.base}/v2/models/duo.v2/ready", timeout=10).status_code == 404
        unload = requests.post(f"{repository.base}/v2/repository/models/duo.v1/unload", headers=ADMIN, timeout=60)
        assert unload.status_code == 404 and "unknown model 'duo.v1'" in unload.json()["error"]
        assert client.is_model_ready("duo", "1")
        load = requests.post(f"{repository.base}/v2/repository/models/duo.v1/load", headers=ADMIN, timeout=60)
        assert load.status_code == 400
        assert load.json()["error"] == "'duo.v1' is the name of a version of model 'duo': rename the model"
        assert client.is_model_ready("duo", "1")
        # The other way round: a model named duo.v1 is served, then duo's versions are asked for.
        client.unload_model("duo", headers=ADMIN)
        client.load_model("duo.v1", headers=ADMIN)
        load = requests.post(f"{repository.base}/v2/repository/models/duo/load", headers=ADMIN, timeout=60)
        assert load.status_code == 400, load.text
        assert load.json()["error"] == "model 'duo.v1' is served: a version of 'duo' would take its name; rename one"
        assert client.is_model_ready("duo.v1")
        client.unload_model("duo.v1", headers=ADMIN)
    finally:
        shutil.rmtree(clash)


def _served_by(gateway, model: str) -> list[dict]:
    described = requests.get(f"{gateway.base}/admin/models/{model}", headers=ADMIN, timeout=10).json()
    return described["executors"]


def test_two_loads_of_one_model_at_once_leave_it_served_by_one_executor(repository):
    """Each load runs to its end before the next begins (the second a reload); at once, they
    started two executors of one id on one socket, and the model was broken for good."""
    answers: list[int] = []

    def load() -> None:
        url = f"{repository.base}/v2/repository/models/mlp2/load"
        answers.append(requests.post(url, headers=ADMIN, timeout=60).status_code)

    loaders = [threading.Thread(target=load) for _ in range(2)]
    for loader in loaders:
        loader.start()
    for loader in loaders:
        loader.join()
    assert answers == [200, 200]
    (executor,) = _served_by(repository, "mlp2")
    assert executor["state"] == "ready" and executor["restarts"] == 0
    for _ in range(5):
        response = requests.post(f"{repository.base}/v2/models/mlp2/infer", json=MLP_BODY, timeout=10)
        assert response.status_code == 200, response.text
    requests.post(f"{repository.base}/v2/repository/models/mlp2/unload", headers=ADMIN, timeout=60).raise_for_status()


def _cpu_group(gateway, executor_id: str) -> list[Path]:
    group = f"gateway-{gateway.process.pid}/{executor_id}"
    return [*Path("/sys/fs/cgroup").glob(f"cpu*/{group}"), *Path("/sys/fs/cgroup").glob(group)]  # v1, v2


def test_an_unload_its_client_leaves_still_ends_and_leaves_no_cpu_group(repository):
    """The client hangs up right after asking: the unload goes on to its end, so that the model
    is neither half served nor impossible to load again, and its executor's group goes with it."""
    for _ in range(3):
        requests.post(f"{repository.base}/v2/repository/models/mlp2/load", headers=ADMIN, timeout=60).raise_for_status()
        (executor,) = _served_by(repository, "mlp2")
        if executor["actuator"] != "affinity":
            assert _cpu_group(repository, executor["id"]), "no CPU group while loaded"
        with socket.create_connection(("127.0.0.1", repository.port), timeout=10) as sock:
            sock.sendall(
                b"POST /v2/repository/models/mlp2/unload HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
                b"Authorization: Bearer an-admin-token-of-length\r\n\r\n"
            )
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset, at once
        deadline = time.monotonic() + 30
        while index(repository)["mlp2"] != "UNAVAILABLE" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert index(repository)["mlp2"] == "UNAVAILABLE"
        assert requests.post(f"{repository.base}/v2/models/mlp2/infer", json=MLP_BODY, timeout=10).status_code == 404
        assert not _cpu_group(repository, executor["id"])
    requests.post(f"{repository.base}/v2/repository/models/mlp2/load", headers=ADMIN, timeout=60).raise_for_status()
    assert requests.post(f"{repository.base}/v2/models/mlp2/infer", json=MLP_BODY, timeout=10).status_code == 200
    requests.post(f"{repository.base}/v2/repository/models/mlp2/unload", headers=ADMIN, timeout=60).raise_for_status()


def _granted_cores(gateway) -> float:
    """The cores the executors' CPU groups allow at this moment, summed (cgroup v1)."""
    total = 0.0
    for group in Path("/sys/fs/cgroup/cpu").glob(f"gateway-{gateway.process.pid}/*/"):
        try:
            quota, period = (int((group / name).read_text()) for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
        except FileNotFoundError:  # an unloaded model's group, removed as it was read
            continue
        if quota > 0:
            total += quota / period
    return total


def test_a_model_loaded_beside_grants_that_fill_the_node_takes_its_cores_from_them_and_gives_them_back_once_stopped(
    repository,
):
    """It started on its configured cores before the node was refitted: 3.5 cores of quota on a
    node of 2 while it was profiled (and none at all before its hello). Unloaded, its cores went
    to the pinned model before its executor had stopped: 2.4-2.8 cores of quota while it stopped."""
    if not Path("/sys/fs/cgroup/cpu").is_dir():
        pytest.skip("no cgroup v1 cpu hierarchy here")
    pin = requests.put(f"{repository.base}/admin/models/mlp/cores", json={"cores": 2.0}, headers=ADMIN, timeout=10)
    assert pin.status_code == 200, pin.text
    assert _granted_cores(repository) == pytest.approx(2.0, abs=0.01)
    samples: dict[str, list[float]] = {"load": [], "unload": []}
    changing = "load"
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples[changing].append(_granted_cores(repository))
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        override = {"parameters": {"config": json.dumps({"cpu": {"cores": 1.5, "threads": 1}})}}
        loaded = requests.post(f"{repository.base}/v2/repository/models/small/load", json=override, headers=ADMIN, timeout=60)
        assert loaded.status_code == 200, loaded.text
        changing = "unload"
        unloaded = requests.post(f"{repository.base}/v2/repository/models/small/unload", headers=ADMIN, timeout=60)
        assert unloaded.status_code == 200, unloaded.text
    finally:
        done.set()
        sampler.join()
    # An unload takes a few samples' time (3 on the developers' VM, which saw 2.857 in each of
    # three runs of the old order); a machine slow to sample may see none, and passes.
    assert len(samples["load"]) > 20, len(samples["load"])
    for change, seen in samples.items():
        assert max(seen, default=0.0) <= 2.0 + 0.01, (change, max(seen))
    requests.put(f"{repository.base}/admin/models/mlp/cores", json={"cores": None}, headers=ADMIN, timeout=10).raise_for_status()


def test_an_unloaded_model_leaves_no_series_on_metrics(repository):
    """Its gauges went on showing the cores and SLA of executors that had stopped."""
    requests.post(f"{repository.base}/v2/repository/models/mlp2/load", headers=ADMIN, timeout=60).raise_for_status()
    assert requests.post(f"{repository.base}/v2/models/mlp2/infer", json=MLP_BODY, timeout=10).status_code == 200
    assert 'gateway_executor_cores{executor="cpu-mlp2.v1",model="mlp2.v1"}' in repository.metrics()  # version 1
    requests.post(f"{repository.base}/v2/repository/models/mlp2/unload", headers=ADMIN, timeout=60).raise_for_status()
    left = [line for line in repository.metrics().splitlines() if "mlp2" in line]
    assert left == []
    # Loaded again, its counters start from 0, as its statistics do.
    requests.post(f"{repository.base}/v2/repository/models/mlp2/load", headers=ADMIN, timeout=60).raise_for_status()
    assert requests.post(f"{repository.base}/v2/models/mlp2/infer", json=MLP_BODY, timeout=10).status_code == 200
    assert 'gateway_requests_total{model="mlp2.v1",outcome="success"} 1.0' in repository.metrics()
    requests.post(f"{repository.base}/v2/repository/models/mlp2/unload", headers=ADMIN, timeout=60).raise_for_status()


def _model_series(gateway, model: str) -> dict[str, float]:
    wanted = ("gateway_requests_received_total", "gateway_requests_total", "gateway_requests_in_flight")
    found = {}
    for line in gateway.metrics().splitlines():
        if line.startswith(wanted) and f'model="{model}"' in line:
            key, value = line.rsplit(" ", 1)
            found[key] = float(value)
    return found


def _in_flight(gateway, model: str) -> float:
    """Requests in flight on ``model``'s versions (``model``, ``model.vN``), as the metrics count them."""
    series = (f'gateway_requests_in_flight{{model="{model}"}}', f'gateway_requests_in_flight{{model="{model}.v')
    return sum(float(line.rsplit(" ", 1)[1]) for line in gateway.metrics().splitlines() if line.startswith(series))


def _straddling(gateway, method: str, path: str, body: bytes, meanwhile, split: int = 100, headers: str = "") -> bytes:
    """Send the request's head and the first ``split`` bytes of its body, let its handler find its
    model, run ``meanwhile()``, then send the rest: the head of the answer."""
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as sock:
        sock.sendall(
            f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{headers}"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[:split]
        )
        if path.endswith("/infer"):  # counted in flight once its handler has found its model
            model = path.split("/")[3]
            wait_for(lambda: _in_flight(gateway, model) == 1, 10, f"{path} in flight")
        else:  # an admin change shows nothing while it waits for its body
            time.sleep(0.3)
        meanwhile()
        sock.sendall(body[split:])
        return sock.recv(65536)


def test_a_request_still_arriving_at_an_unload_brings_no_series_back(repository):
    """Its handler had counted it received; it ended after the unload had dropped the model's
    series and made them again: in flight -1, an outcome beside no arrival, kept after a reload."""
    requests.post(f"{repository.base}/v2/repository/models/mlp2/load", headers=ADMIN, timeout=60).raise_for_status()

    def unload() -> None:
        assert _model_series(repository, "mlp2.v1")['gateway_requests_in_flight{model="mlp2.v1"}'] == 1  # counted received
        requests.post(f"{repository.base}/v2/repository/models/mlp2/unload", headers=ADMIN, timeout=60).raise_for_status()

    head = _straddling(repository, "POST", "/v2/models/mlp2/infer", json.dumps(MLP_BODY).encode(), unload)
    assert head.startswith(b"HTTP/1.1 503") and b"was unloaded" in head, head
    assert _model_series(repository, "mlp2.v1") == {}
    requests.post(f"{repository.base}/v2/repository/models/mlp2/load", headers=ADMIN, timeout=60).raise_for_status()
    assert _model_series(repository, "mlp2.v1") == {
        'gateway_requests_received_total{model="mlp2.v1"}': 0.0,
        'gateway_requests_in_flight{model="mlp2.v1"}': 0.0,
    }
    requests.post(f"{repository.base}/v2/repository/models/mlp2/unload", headers=ADMIN, timeout=60).raise_for_status()


def test_an_unload_with_a_body_that_is_not_json_is_refused(repository):
    response = requests.post(f"{repository.base}/v2/repository/models/mlp/unload", data=b"{bad", headers=ADMIN, timeout=10)
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]
    assert index(repository)["mlp"] == "READY"


def test_a_model_of_the_config_loads_again_once_unloaded(repository):
    unloaded = requests.post(f"{repository.base}/v2/repository/models/mlp/unload", headers=ADMIN, timeout=60)
    assert unloaded.status_code == 200, unloaded.text
    assert requests.post(f"{repository.base}/v2/models/mlp/infer", json=MLP_BODY, timeout=10).status_code == 404
    assert index(repository)["mlp"] == "UNAVAILABLE"
    loaded = requests.post(f"{repository.base}/v2/repository/models/mlp/load", headers=ADMIN, timeout=60)
    assert loaded.status_code == 200, loaded.text
    assert index(repository)["mlp"] == "READY"
    assert requests.post(f"{repository.base}/v2/models/mlp/infer", json=MLP_BODY, timeout=10).status_code == 200


def test_an_admin_change_that_waits_out_an_unload_is_a_404(repository):
    """Its handler found the model, then waited for its body while the model was unloaded: the
    change went to a model no longer served (a 500 for cores, a 200 for the SLA)."""
    requests.post(f"{repository.base}/v2/repository/models/mlp2/load", headers=ADMIN, timeout=60).raise_for_status()
    for path, body in (("sla", b'{"sla_ms": 77}'), ("cores", b'{"cores": 0.5}'), ("dispatch_batch", b'{"dispatch_batch": 2}')):

        def unload() -> None:
            unloaded = requests.post(f"{repository.base}/v2/repository/models/mlp2/unload", headers=ADMIN, timeout=60)
            assert unloaded.status_code == 200, unloaded.text

        token = "Authorization: Bearer an-admin-token-of-length\r\n"
        head = _straddling(repository, "PUT", f"/admin/models/mlp2/{path}", body, unload, split=0, headers=token)
        assert head.startswith(b"HTTP/1.1 404"), head
        assert b"unknown model 'mlp2'" in head
        requests.post(f"{repository.base}/v2/repository/models/mlp2/load", headers=ADMIN, timeout=60).raise_for_status()
    assert 'gateway_sla_seconds{model="mlp2"} 0.077' not in repository.metrics()
    requests.post(f"{repository.base}/v2/repository/models/mlp2/unload", headers=ADMIN, timeout=60).raise_for_status()


def test_a_request_still_arriving_at_a_reload_is_answered_503(repository):
    """Its handler looked the model up before the reload, which serves a new runtime under the
    name: the request ran there against the old one's signature and limits (8 rows under the new
    max_batch_size of 2 answered 200; another file's outputs, a 500)."""
    requests.post(f"{repository.base}/v2/repository/models/mlp2/load", headers=ADMIN, timeout=60).raise_for_status()
    rows = {"inputs": [{**MLP_BODY["inputs"][0], "shape": [8, 512], "data": [0.25] * 512 * 8}]}
    body = json.dumps(rows).encode()
    override = {"parameters": {"config": json.dumps({"max_batch_size": 2})}}

    def reload() -> None:
        answer = requests.post(f"{repository.base}/v2/repository/models/mlp2/load", json=override, headers=ADMIN, timeout=60)
        answer.raise_for_status()

    head = _straddling(repository, "POST", "/v2/models/mlp2/infer", body, reload)
    assert head.startswith(b"HTTP/1.1 503") and b"was unloaded before this request ran" in head, head
    again = requests.post(f"{repository.base}/v2/models/mlp2/infer", data=body, timeout=30)
    assert again.status_code == 400 and "max_batch_size" in again.text, again.text
    requests.post(f"{repository.base}/v2/repository/models/mlp2/unload", headers=ADMIN, timeout=60).raise_for_status()


def test_a_versions_own_name_is_no_model_while_its_versions_load_or_unload(repository):
    """The versions' names (NAME.vN) were known as such only once every version had loaded, and
    no more once the unload began: meanwhile duo.v1 answered as a model of its own."""
    seen: list[int] = []
    changing = threading.Event()

    def watch() -> None:
        while changing.is_set():
            seen.append(requests.get(f"{repository.base}/v2/models/duo.v1/ready", timeout=10).status_code)
            seen.append(requests.get(f"{repository.base}/v2/models/duo.v2/ready", timeout=10).status_code)

    for change in ("load", "unload"):
        changing.set()
        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            requests.post(f"{repository.base}/v2/repository/models/duo/{change}", headers=ADMIN, timeout=60).raise_for_status()
        finally:
            changing.clear()
            watcher.join()
    assert len(seen) > 10 and set(seen) == {404}, seen


def _live_requests(gateway, model: str) -> int | None:
    live = requests.get(f"{gateway.base}/admin/live?seconds=600", headers=ADMIN, timeout=10).json()
    found = [m for m in live["models"] if m["name"] == model]
    return sum(v or 0 for v in found[0]["series"]["requests"]) if found else None


SMALL_BODY = {"inputs": [{"name": "x", "shape": [1, 3, 32, 32], "datatype": "FP32", "data": [0.25] * 3072}]}


def test_a_reloaded_model_starts_its_live_seconds_anew(repository):
    """The live page's seconds of an unloaded model were kept: loaded again, it showed the
    requests of the one before (30 where its statistics and /metrics said 0)."""
    base = f"{repository.base}/v2/repository/models/small"
    requests.post(f"{base}/load", headers=ADMIN, timeout=60).raise_for_status()
    for _ in range(5):
        assert requests.post(f"{repository.base}/v2/models/small/infer", json=SMALL_BODY, timeout=30).status_code == 200
    wait_for(lambda: _live_requests(repository, "small") == 5, 5, "the five requests in small's live seconds")
    requests.post(f"{base}/unload", headers=ADMIN, timeout=60).raise_for_status()
    requests.post(f"{base}/load", headers=ADMIN, timeout=60).raise_for_status()
    try:
        time.sleep(1.2)  # a whole second since the reload
        assert _live_requests(repository, "small") == 0
    finally:
        requests.post(f"{base}/unload", headers=ADMIN, timeout=60).raise_for_status()


def test_a_model_being_unloaded_is_not_listed_where_its_route_answers_404(repository):
    """While an unload drained its queue, GET /admin/models and /admin/live listed the model, and
    /admin/models/{m} answered 404 "unknown model"."""
    base = f"{repository.base}/v2/repository/models/small"
    requests.post(f"{base}/load", headers=ADMIN, timeout=60).raise_for_status()
    pinned = requests.put(f"{repository.base}/admin/models/small/cores", json={"cores": 0.01}, headers=ADMIN, timeout=10)
    assert pinned.status_code == 200, pinned.text
    with concurrent.futures.ThreadPoolExecutor(max_workers=121) as pool:
        infer = f"{repository.base}/v2/models/small/infer"
        sent = [pool.submit(requests.post, infer, json=SMALL_BODY, timeout=60) for _ in range(120)]
        # A backlog behind a hundredth of a core (about a second for 40 here): a fixed sleep before
        # the unload found the queue already drained on a faster machine, and no UNLOADING to see.
        wait_for(lambda: queued(repository, "small") >= 40, 10, "40 of small's requests queued")
        unloading = pool.submit(requests.post, f"{base}/unload", headers=ADMIN, timeout=60)
        wait_for(lambda: index(repository).get("small") == "UNLOADING", 10, "small unloading")
        listed = [m["name"] for m in requests.get(f"{repository.base}/admin/models", headers=ADMIN, timeout=10).json()["models"]]
        live = requests.get(f"{repository.base}/admin/live?seconds=1", headers=ADMIN, timeout=10).json()
        still = index(repository).get("small")
        assert unloading.result().status_code == 200
        assert {f.result().status_code for f in sent} <= {200, 503}
    assert still == "UNLOADING", "the unload ended before the lists were read"
    assert "small" not in listed and "small" not in [m["name"] for m in live["models"]], (listed, live["models"])


def test_only_whole_numbers_in_ascii_are_versions(tmp_path):
    """ "²" passes str.isdigit() and not int(): every index and load was a 500. "١" was listed as
    version 1 and never found; "01" and "1" were both version 1."""
    from gateway.repository import scan

    for version in ("²", "١", "01", "1", "2", "v3"):
        (tmp_path / "odd" / version).mkdir(parents=True)
        (tmp_path / "odd" / version / "model.onnx").write_bytes(b"")
    assert scan(tmp_path)["odd"].versions == ("1", "2")


def test_a_repository_load_is_refused_what_the_config_refuses(repository):
    """A version folder of a name that the config refuses ("stats", dots only) was loaded: checked
    as "stats.v1" alone, and GET /v2/models/stats never reached it. A `path` in the override served
    another file under the model's name (the API names models, never files). A model that fails
    to start was refused with its executor's whole traceback."""
    made = []
    try:
        for name in ("stats", "..."):
            (repository.folder / name / "1").mkdir(parents=True)
            made.append(repository.folder / name)
            shutil.copy(repository.folder / "mlp.onnx", repository.folder / name / "1" / "model.onnx")
        refused = requests.post(f"{repository.base}/v2/repository/models/stats/load", headers=ADMIN, timeout=60)
        assert refused.status_code == 400 and "'stats' is taken" in refused.json()["error"], refused.text
        refused = requests.post(f"{repository.base}/v2/repository/models/.../load", headers=ADMIN, timeout=60)
        assert refused.status_code == 400 and "a path segment of dots only" in refused.json()["error"], refused.text
        override = {"parameters": {"config": json.dumps({"path": "mlp.onnx"})}}
        refused = requests.post(f"{repository.base}/v2/repository/models/small/load", json=override, headers=ADMIN, timeout=60)
        assert refused.status_code == 400 and "'path' cannot be overridden" in refused.json()["error"], refused.text
        (repository.folder / "broken" / "1").mkdir(parents=True)
        made.append(repository.folder / "broken")
        (repository.folder / "broken" / "1" / "model.onnx").write_bytes(b"not an ONNX model")
        refused = requests.post(f"{repository.base}/v2/repository/models/broken/load", headers=ADMIN, timeout=60)
        said = refused.json()["error"]
        assert refused.status_code == 400 and "Traceback" not in said and "\n" not in said, said
        assert said.startswith("model 'broken' failed to load: executor cpu-broken.v1 failed to start"), said
        assert "INVALID_PROTOBUF" in said, said
        # Triton's index gives a model whose load failed that failure as its reason ("unloaded" before).
        index = requests.post(f"{repository.base}/v2/repository/index", json={}, headers=ADMIN, timeout=10).json()
        (entry,) = [e for e in index if e["name"] == "broken"]
        assert entry["state"] == "UNAVAILABLE" and entry["reason"] == said, entry
        # A config.toml that is no UTF-8, or that holds a TOML date: 500s, a traceback in the log.
        for name, text, words in (
            ("latin", b'path = "m.onnx"\nsla_ms = 10 # caf\xe9\n', "codec can't decode"),
            ("dated", b'path = "m.onnx"\nsla_ms = 1979-05-27\n', "models.dated.sla_ms: is a date or a time"),
        ):
            (repository.folder / name).mkdir()
            made.append(repository.folder / name)
            shutil.copy(repository.folder / "mlp.onnx", repository.folder / name / "m.onnx")
            (repository.folder / name / "config.toml").write_bytes(text)
            refused = requests.post(f"{repository.base}/v2/repository/models/{name}/load", headers=ADMIN, timeout=60)
            assert refused.status_code == 400 and words in refused.json()["error"], refused.text
        # A name of 64 characters, valid, in version folders: checked as NAME.v1, it was too long.
        long_name = "r" * 64
        (repository.folder / long_name / "1").mkdir(parents=True)
        made.append(repository.folder / long_name)
        shutil.copy(repository.folder / "mlp.onnx", repository.folder / long_name / "1" / "model.onnx")
        loaded = requests.post(f"{repository.base}/v2/repository/models/{long_name}/load", headers=ADMIN, timeout=60)
        assert loaded.status_code == 200, loaded.text
        answer = requests.post(f"{repository.base}/v2/models/{long_name}/infer", json=MLP_BODY, timeout=10)
        assert answer.status_code == 200, answer.text
        requests.post(f"{repository.base}/v2/repository/models/{long_name}/unload", headers=ADMIN, timeout=60).raise_for_status()
    finally:
        for folder in made:
            shutil.rmtree(folder)


def _state(gateway, model: str) -> dict:
    return requests.get(f"{gateway.base}/admin/models/{model}", headers=ADMIN, timeout=10).json()


def test_a_reload_that_fails_leaves_the_model_served_as_it_was(repository):
    """As Triton's: the model served goes on serving while its successor starts, and a reload
    that fails leaves it as it was. Unloaded first, a model whose file had been replaced by a
    broken one was served no more (404) once the reload failed."""
    base = f"{repository.base}/v2/repository/models/small"
    requests.post(f"{base}/load", headers=ADMIN, timeout=60).raise_for_status()
    path = repository.folder / "small" / "cnn_small.onnx"
    good = path.read_bytes()
    url = f"{repository.base}/v2/models/small/infer"
    before = requests.post(url, json=SMALL_BODY, timeout=30).json()["outputs"]
    try:
        path.write_bytes(b"not an ONNX model")
        failed = requests.post(f"{base}/load", headers=ADMIN, timeout=60)
        assert failed.status_code == 400 and "model 'small' failed to load" in failed.json()["error"], failed.text
        answer = requests.post(url, json=SMALL_BODY, timeout=30)
        assert answer.status_code == 200 and answer.json()["outputs"] == before, answer.text
        assert index(repository)["small"] == "READY"
        executors = [e["id"] for e in _state(repository, "small")["executors"]]
        assert executors == ["cpu-small"], executors  # its own; the failed one's is gone
    finally:
        path.write_bytes(good)
        requests.post(f"{base}/unload", headers=ADMIN, timeout=60).raise_for_status()
    # Unloaded after it, the model's reason in the index is its unload, not the failed reload.
    listed = requests.post(f"{repository.base}/v2/repository/index", headers=ADMIN, timeout=10).json()
    assert next(e["reason"] for e in listed if e["name"] == "small") == "unloaded", listed


def test_a_reload_serves_the_model_while_its_successor_starts(repository):
    """Requests sent while the reload started and profiled the new executor were answered by the
    one it replaced, and those sent while that one drained wait for its successor: unloaded
    first, they got 404 until the new one was ready; then 404 while it drained."""
    base = f"{repository.base}/v2/repository/models/small"
    requests.post(f"{base}/load", headers=ADMIN, timeout=60).raise_for_status()
    # A twentieth of a core: the four clients keep a queue, which the swap drains while they send.
    pin = requests.put(f"{repository.base}/admin/models/small/cores", json={"cores": 0.05}, headers=ADMIN, timeout=10)
    pin.raise_for_status()
    with _sending(f"{repository.base}/v2/models/small/infer", SMALL_BODY, clients=4) as answers:
        time.sleep(0.2)
        began = len(answers)
        reloaded = requests.post(f"{base}/load", json={"parameters": {"config": '{"sla_ms": 400}'}}, headers=ADMIN, timeout=60)
        time.sleep(0.2)
    during = answers[began:]
    try:
        assert reloaded.status_code == 200, reloaded.text
        # None got 404; a request that had found the model it replaces before the swap and
        # reached it after is refused 503 (its body was checked against that model).
        statuses = Counter(status for status, _ in during)
        assert len(during) >= 10 and set(statuses) <= {200, 503} and statuses[200] >= 0.9 * len(during), statuses
        assert any('"cpu-small~2"' in text for _, text in during)  # some were answered by the successor
        assert all("was unloaded before this request ran" in text for status, text in during if status == 503)
        state = _state(repository, "small")
        assert state["sla_ms"] == 400 and [e["id"] for e in state["executors"]] == ["cpu-small~2"], state
        assert requests.post(f"{repository.base}/v2/models/small/infer", json=SMALL_BODY, timeout=30).status_code == 200
    finally:
        requests.post(f"{base}/unload", headers=ADMIN, timeout=60).raise_for_status()


def test_a_reload_the_nodes_cores_cannot_start_beside_the_model_is_refused_and_leaves_it_served(repository):
    base = f"{repository.base}/v2/repository/models/small"
    requests.post(f"{base}/load", headers=ADMIN, timeout=60).raise_for_status()
    try:
        override = {"parameters": {"config": json.dumps({"cpu": {"cores": 1.9, "min_cores": 1.9}})}}
        refused = requests.post(f"{base}/load", json=override, headers=ADMIN, timeout=60)
        assert refused.status_code == 400 and "unload that first" in refused.json()["error"], refused.text
        assert requests.post(f"{repository.base}/v2/models/small/infer", json=SMALL_BODY, timeout=30).status_code == 200
        assert [e["id"] for e in _state(repository, "small")["executors"]] == ["cpu-small"]
    finally:
        requests.post(f"{base}/unload", headers=ADMIN, timeout=60).raise_for_status()


def test_a_reload_keeps_the_sla_the_admin_api_set(repository):
    """README: a reload of a model of the config keeps its SLA: the one served, which the admin
    API may have set since (it went back to the config's)."""
    sla = f"{repository.base}/admin/models/mlp/sla"
    requests.put(sla, json={"sla_ms": 77}, headers=ADMIN, timeout=10).raise_for_status()
    try:
        requests.post(f"{repository.base}/v2/repository/models/mlp/load", headers=ADMIN, timeout=60).raise_for_status()
        assert _state(repository, "mlp")["sla_ms"] == 77
    finally:
        requests.put(sla, json={"sla_ms": 200}, headers=ADMIN, timeout=10).raise_for_status()


def test_a_versioned_model_reloaded_as_one_model_is_served_as_that_one_alone(repository):
    """Its folder given a config.toml, the model served in versions is loaded as one model: the
    versions were left serving its name beside a runtime that no request reached, and an unload
    then left that runtime behind."""
    base = f"{repository.base}/v2/repository/models/duo"
    requests.post(f"{base}/load", headers=ADMIN, timeout=120).raise_for_status()
    settings = repository.folder / "duo" / "config.toml"
    settings.write_text('path = "1/model.onnx"\nsla_ms = 70\n')
    try:
        requests.post(f"{base}/load", headers=ADMIN, timeout=120).raise_for_status()
        listed = requests.get(f"{repository.base}/admin/models", headers=ADMIN, timeout=10).json()["models"]
        assert sorted(m["name"] for m in listed) == ["duo", "mlp"], listed
        answer = requests.post(f"{repository.base}/v2/models/duo/infer", json=MLP_BODY, timeout=30).json()
        assert answer["parameters"]["executor"] == "cpu-duo", answer
        requests.post(f"{base}/unload", headers=ADMIN, timeout=60).raise_for_status()
        assert requests.post(f"{repository.base}/v2/models/duo/infer", json=MLP_BODY, timeout=30).status_code == 404
    finally:
        settings.unlink()


def test_sigterm_waits_for_a_load_in_progress(repository):
    """The last test of the module: it stops the gateway. A load under way when SIGTERM came was
    cut off with no answer; it is drained as a request is."""
    started = "executor cpu-small: started process"
    before = repository.output().count(started)  # an earlier test loaded it too
    answers: list[requests.Response] = []
    loader = threading.Thread(
        target=lambda: answers.append(
            requests.post(f"{repository.base}/v2/repository/models/small/load", headers=ADMIN, timeout=60)
        )
    )
    loader.start()
    deadline = time.monotonic() + 30
    while repository.output().count(started) == before and time.monotonic() < deadline:
        time.sleep(0.01)
    repository.process.send_signal(signal.SIGTERM)
    loader.join()
    assert answers[0].status_code == 200, answers[0].text
    assert repository.process.wait(timeout=30) == 0


def test_a_load_the_drain_cuts_short_is_answered_503(tmp_path, example_models):
    """README (Shutdown): what is left when the drain ends, a load included, is answered 503. It
    was answered 200 (its profiling failed quietly once its executor was stopped, and the model
    was added after the engine had stopped) or 400 (an executor stopped before it started)."""
    (tmp_path / "slow").mkdir()
    shutil.copy(example_models / "cnn_large.onnx", tmp_path / "slow" / "m.onnx")
    shutil.copy(example_models / "mlp.onnx", tmp_path / "mlp.onnx")
    # A twentieth of a core: its start and profiling take seconds, past the drain.
    (tmp_path / "slow" / "config.toml").write_text(
        'path = "m.onnx"\nsla_ms = 2000\ncpu = { cores = 0.02, threads = 1, min_cores = 0.01 }\n'
    )
    (tmp_path / "config.toml").write_text(
        '[server]\ndrain_timeout_s = 0.5\n[node]\ncpu_cores = 2\n[models.mlp]\npath = "mlp.onnx"\nsla_ms = 100\n'
        "cpu = { cores = 0.5, threads = 1 }\n"
    )
    answers: list[requests.Response] = []
    with run_gateway(tmp_path / "config.toml") as gateway:
        loader = threading.Thread(
            target=lambda: answers.append(requests.post(f"{gateway.base}/v2/repository/models/slow/load", timeout=60))
        )
        loader.start()
        deadline = time.monotonic() + 30
        while "executor cpu-slow: started process" not in gateway.output() and time.monotonic() < deadline:
            time.sleep(0.01)
        gateway.process.send_signal(signal.SIGTERM)
        loader.join()
        assert gateway.process.wait(timeout=30) == 0
    assert answers[0].status_code == 503, answers[0].text
    assert "model 'slow' was not loaded" in answers[0].json()["error"]
    assert "model slow: loaded" not in gateway.output()


def reload_in_its_swap(
    gateway, pool: concurrent.futures.Executor, batches: int, timeout_s: float
) -> tuple[list[concurrent.futures.Future], concurrent.futures.Future]:
    """A reload of ``mlp`` held in its swap: the model at a fiftieth of a core (1 ms of CPU each
    50 ms) with ``batches`` requests of 32 rows queued, so that the model it replaces drains for
    seconds, past its successor's start on a slow machine too. The queued requests and the reload."""
    rows = json.dumps({"inputs": [{"name": "x", "shape": [32, 512], "datatype": "FP32", "data": [0.25] * 32 * 512}]})
    requests.put(f"{gateway.base}/admin/models/mlp/cores", json={"cores": 0.02}, timeout=10).raise_for_status()
    url = f"{gateway.base}/v2/models/mlp/infer"
    infers = [pool.submit(requests.post, url, data=rows, timeout=timeout_s) for _ in range(batches)]
    time.sleep(1.0)
    reload = pool.submit(requests.post, f"{gateway.base}/v2/repository/models/mlp/load", timeout=timeout_s)
    wait_for(lambda: index(gateway)["mlp"] == "UNLOADING", 60, "the reload unloading the model it replaces")
    return infers, reload


def test_a_reload_the_drain_cuts_short_while_its_model_drains_is_answered_503(tmp_path, example_models):
    """stop() came while the model being replaced drained its queue: the reload was answered 200
    and its stopped executor joined the dispatch core after the engine had stopped."""
    shutil.copy(example_models / "mlp.onnx", tmp_path / "mlp.onnx")
    (tmp_path / "config.toml").write_text(
        '[server]\ndrain_timeout_s = 0.5\n[node]\ncpu_cores = 2\n[models.mlp]\npath = "mlp.onnx"\nsla_ms = 20\n'
        "max_batch_size = 32\ncpu = { cores = 1.0, threads = 1 }\n"
    )
    with run_gateway(tmp_path / "config.toml") as gateway:
        with concurrent.futures.ThreadPoolExecutor(102) as pool:
            infers, reload = reload_in_its_swap(gateway, pool, batches=100, timeout_s=60)  # about 5 s of draining
            waiting = pool.submit(requests.post, f"{gateway.base}/v2/models/mlp/infer", json=MLP_BODY, timeout=60)
            time.sleep(0.2)  # in the swap, waiting for the successor
            gateway.process.send_signal(signal.SIGTERM)
            answer = reload.result()
            statuses = {infer.result().status_code for infer in infers}
            waited = waiting.result()
        assert gateway.process.wait(timeout=30) == 0
    assert answer.status_code == 503 and "model 'mlp' was not loaded" in answer.json()["error"], answer.text
    # The request that waited for the swap: 503, the gateway shutting down (it got 404, "unknown model").
    assert waited.status_code == 503 and "shutting down" in waited.json()["error"], waited.text
    assert "model mlp: reloaded" not in gateway.output()
    assert statuses <= {200, 503}, statuses


def test_requests_that_wait_out_a_swap_from_before_sigterm_are_served_by_the_successor(tmp_path, example_models):
    """SIGTERM came while a reload's swap held requests that had arrived before it, and the
    successor came up inside the drain: they were answered 503, "no new requests", over HTTP and
    gRPC alike, though they had come before the drain began (the drain's refusal was read once
    the swap let them go on)."""
    shutil.copy(example_models / "mlp.onnx", tmp_path / "mlp.onnx")
    (tmp_path / "config.toml").write_text(
        '[server]\ndrain_timeout_s = 60\n[node]\ncpu_cores = 2\n[models.mlp]\npath = "mlp.onnx"\nsla_ms = 20\n'
        "max_batch_size = 32\ncpu = { cores = 1.0, threads = 1 }\n"
    )
    tensor = triton_grpc.InferInput("x", [1, 512], "FP32")
    tensor.set_data_from_numpy(np.full((1, 512), 0.25, dtype=np.float32))
    port = free_port()
    with run_gateway(tmp_path / "config.toml", args=["--grpc-port", str(port)]) as gateway:
        with concurrent.futures.ThreadPoolExecutor(64) as pool:
            infers, reload = reload_in_its_swap(gateway, pool, batches=60, timeout_s=120)
            over_http = pool.submit(requests.post, f"{gateway.base}/v2/models/mlp/infer", json=MLP_BODY, timeout=120)
            over_grpc = pool.submit(triton_grpc.InferenceServerClient(f"127.0.0.1:{port}").infer, "mlp", [tensor])
            time.sleep(0.3)  # both in the swap, waiting for the successor
            gateway.process.send_signal(signal.SIGTERM)
            assert reload.result().status_code == 200
            assert {infer.result().status_code for infer in infers} == {200}  # the model it replaced served them
            waited = over_http.result()
            assert waited.status_code == 200, waited.text
            assert waited.json()["parameters"]["executor"] == "cpu-mlp~2"  # the successor's executor
            assert over_grpc.result().as_numpy("y") is not None
        assert gateway.process.wait(timeout=60) == 0
    assert "model mlp: reloaded" in gateway.output()


def test_a_request_that_waits_out_a_swap_counts_the_wait_in_its_timeout(tmp_path):
    """Over gRPC the request's clock began after the wait: one past its timeout was served (5.6 s
    for a timeout of 500 ms). Over HTTP it timed out, but was run and its result discarded."""
    busy_model(tmp_path / "busy.onnx")  # about 16 ms of CPU a row
    (tmp_path / "config.toml").write_text(
        '[node]\ncpu_cores = 2\n[control]\npolicy = "fixed"\n[models.busy]\npath = "busy.onnx"\nsla_ms = 5000\n'
        "cpu = { cores = 1.0, threads = 1 }\n"
    )
    rows = json.dumps({"inputs": [{"name": "x", "shape": [8, 1, 8, 8], "datatype": "FP32", "data": [0.25] * 8 * 64}]})
    one = {"name": "x", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0.25] * 64}
    timed = {"inputs": [one], "parameters": {"timeout": 100_000}}  # 100 ms, in us as Triton's
    port = free_port()
    with run_gateway(tmp_path / "config.toml", args=["--grpc-port", str(port)]) as gateway:
        base = gateway.base
        # A fifth of a core and eight requests of 8 rows queued: about 5 s of queue, a swap of
        # seconds past the successor's start and profiling on a slow machine too.
        requests.put(f"{base}/admin/models/busy/cores", json={"cores": 0.2}, timeout=10).raise_for_status()
        tensor = triton_grpc.InferInput("x", [1, 1, 8, 8], "FP32")
        tensor.set_data_from_numpy(np.full((1, 1, 8, 8), 0.25, dtype=np.float32))
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            queued = [pool.submit(requests.post, f"{base}/v2/models/busy/infer", data=rows, timeout=120) for _ in range(8)]
            time.sleep(0.3)
            reloaded = pool.submit(requests.post, f"{base}/v2/repository/models/busy/load", timeout=120)
            wait_for(lambda: index(gateway)["busy"] == "UNLOADING", 60, "the swap")
            over_http = pool.submit(requests.post, f"{base}/v2/models/busy/infer", json=timed, timeout=60)
            with pytest.raises(InferenceServerException) as over_grpc:
                triton_grpc.InferenceServerClient(f"127.0.0.1:{port}").infer("busy", [tensor], timeout=100_000)
            assert over_grpc.value.status() == str(grpc.StatusCode.DEADLINE_EXCEEDED), over_grpc.value
            assert "before it reached the queue; it was not run" in over_grpc.value.message()
            answer = over_http.result()
            assert answer.status_code == 504 and "before it reached the queue" in answer.json()["error"], answer.text
            assert reloaded.result().status_code == 200
            assert {q.result().status_code for q in queued} == {200}  # the model it replaced served them all
