"""Triton's statistics extension and Triton's metrics: the schema against Triton's own field
names, the totals against the requests sent, /metrics against the gateway's own counts, and
perf_analyzer printing its server-side breakdown."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import re
import subprocess

import aiohttp
import numpy as np
import onnx
import requests
import tritonclient.http as triton
from google.protobuf import json_format
from onnx import TensorProto, helper
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2

from gateway.triton_stats import BatchTiming, ModelStatistics
from tests.helpers import run_gateway, write_config
from tests.perf_analyzer import perf_analyzer_for_test

# -- the accounting, pure -------------------------------------------------------------------------


def test_a_batch_is_split_into_input_infer_and_output():
    # 0.2 ms stacking, a 1.5 ms round trip of which the executor computed 1.0 ms, 0.1 ms split.
    timing = BatchTiming.measured(rows=4, stacked_s=0.0002, round_trip_s=0.0015, compute_ms=1.0, split_s=0.0001)
    assert timing == BatchTiming(4, 200_000, 1_000_000, 500_000 + 100_000)
    # A remote executor's compute is its round trip: nothing is left for the transfer.
    assert BatchTiming.measured(1, 0.0, 0.002, 2.0, 0.0).output_ns == 0


def test_requests_and_batches_add_up_as_triton_counts_them():
    stats = ModelStatistics()
    batch = BatchTiming(rows=3, input_ns=10, infer_ns=100, output_ns=20)
    stats.executed(batch, epoch_ms=1_700_000_000_000)
    stats.succeeded(request_ns=1000, queue_ns=300, rows=2, timing=batch)  # a request of 2 rows
    stats.succeeded(request_ns=900, queue_ns=200, rows=1, timing=batch)
    stats.failed(request_ns=50)
    stat = stats.to_triton("mlp")
    inference = stat["inference_stats"]
    assert inference["success"] == {"count": 2, "ns": 1900}
    assert inference["fail"] == {"count": 1, "ns": 50}
    assert inference["queue"] == {"count": 2, "ns": 500}
    # Each request counts its batch's whole compute, as Triton does.
    assert inference["compute_infer"] == {"count": 2, "ns": 200}
    assert stat["inference_count"] == 3 and stat["execution_count"] == 1
    assert stat["batch_stats"] == [
        {
            "batch_size": 3,
            "compute_input": {"count": 1, "ns": 10},
            "compute_infer": {"count": 1, "ns": 100},
            "compute_output": {"count": 1, "ns": 20},
        }
    ]
    assert stat["last_inference"] == 1_700_000_000_000


def test_the_statistics_have_tritons_field_names():
    """Triton's own message for the extension (its gRPC protocol, shipped in tritonclient) takes
    the JSON with no field unknown to it: every name is Triton's."""
    stats = ModelStatistics()
    batch = BatchTiming(rows=2, input_ns=1, infer_ns=2, output_ns=3)
    stats.executed(batch, 5)
    stats.succeeded(10, 4, 2, batch)
    message = json_format.ParseDict({"model_stats": [stats.to_triton("mlp")]}, service_pb2.ModelStatisticsResponse())
    parsed = message.model_stats[0]
    assert parsed.name == "mlp" and parsed.inference_count == 2 and parsed.execution_count == 1
    assert parsed.inference_stats.queue.ns == 4 and parsed.batch_stats[0].batch_size == 2
    # And every field Triton's $inference_stats has, the gateway sends.
    triton_fields = set(service_pb2.InferStatistics.DESCRIPTOR.fields_by_name)
    assert triton_fields <= set(stats.to_triton("mlp")["inference_stats"])


# -- served --------------------------------------------------------------------------------------


def _send(url: str, rows: int) -> None:
    client = triton.InferenceServerClient(url)
    tensor = triton.InferInput("x", [rows, 512], "FP32")
    tensor.set_data_from_numpy(np.random.default_rng(rows).random((rows, 512), dtype=np.float32))
    client.infer("mlp", [tensor])


def _families(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Every sample of a Prometheus page, by family and sorted labels, read by prometheus_client's parser."""
    families: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    types = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            families.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    families["__types__"] = types  # type: ignore[assignment]
    return families


def test_stats_and_metrics_count_what_was_served_and_refused(tmp_models):
    config = write_config(tmp_models / "config.toml", {"mlp": {"path": "mlp.onnx", "sla_ms": 200, "max_batch_size": 16}})
    with run_gateway(config) as gateway:
        assert "statistics" in requests.get(gateway.base + "/v2", timeout=5).json()["extensions"]
        # Before its first request the model's series are there, at 0 (they were absent).
        before = gateway.metrics()
        for series in ("gateway_requests_received_total", "gateway_requests_in_flight"):
            assert f'{series}{{model="mlp"}} 0.0' in before, series
        rows = [1, 2, 3] * 20
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda r: _send(gateway.url, r), rows))
        bad = {"inputs": [{"name": "x", "shape": [1, 7], "datatype": "FP32", "data": [0.0] * 7}]}
        for _ in range(3):
            assert requests.post(f"{gateway.base}/v2/models/mlp/infer", json=bad, timeout=5).status_code == 400

        client = triton.InferenceServerClient(gateway.url)
        stat = client.get_inference_statistics("mlp")["model_stats"][0]
        assert requests.get(gateway.base + "/v2/models/stats", timeout=5).json()["model_stats"] == [stat]
        assert requests.get(gateway.base + "/v2/models/mlp/versions/1/stats", timeout=5).json()["model_stats"] == [stat]
        assert requests.get(gateway.base + "/v2/models/nope/stats", timeout=5).status_code == 404
        inference = stat["inference_stats"]
        assert inference["success"]["count"] == len(rows) and inference["fail"]["count"] == 3
        assert stat["inference_count"] == sum(rows)
        for part in ("queue", "compute_input", "compute_infer", "compute_output"):
            assert inference[part]["count"] == len(rows)
        assert inference["compute_infer"]["ns"] > 0 and inference["success"]["ns"] >= inference["queue"]["ns"]
        batches = stat["batch_stats"]
        assert stat["execution_count"] == sum(b["compute_infer"]["count"] for b in batches)
        # Rows per batch: every row served ran in exactly one batch.
        assert sum(b["batch_size"] * b["compute_infer"]["count"] for b in batches) == sum(rows)
        assert stat["last_inference"] > 1_600_000_000_000  # milliseconds since the epoch

        families = _families(gateway.metrics())
        label = (("model", "mlp"), ("version", "1"))
        assert families["__types__"]["nv_inference_request_success"] == "counter"
        assert families["nv_inference_request_success_total"][label] == inference["success"]["count"]
        assert families["nv_inference_request_failure_total"][label] == inference["fail"]["count"]
        assert families["nv_inference_count_total"][label] == stat["inference_count"]
        assert families["nv_inference_exec_count_total"][label] == stat["execution_count"]
        assert families["nv_inference_queue_duration_us_total"][label] == inference["queue"]["ns"] // 1000
        # Triton's request duration is the successful requests' alone (the 400s' time is not in it).
        assert inference["fail"]["ns"] >= 1000
        assert families["nv_inference_request_duration_us_total"][label] == inference["success"]["ns"] // 1000
        assert families["nv_inference_compute_infer_duration_us_total"][label] == inference["compute_infer"]["ns"] // 1000
        # Consistent with the gateway's own series.
        own = families["gateway_requests_total"]
        assert own[(("model", "mlp"), ("outcome", "success"))] == inference["success"]["count"]
        assert own[(("model", "mlp"), ("outcome", "invalid"))] == inference["fail"]["count"]
        assert families["gateway_batch_size_count"][(("model", "mlp"),)] == stat["execution_count"]
        # Totals that only grow are counters now.
        for name in ("gateway_core_seconds", "gateway_executor_restarts", "gateway_window_violations"):
            assert families["__types__"][name] == "counter", name
        assert families["gateway_executor_restarts_total"][(("executor", "cpu-mlp"), ("model", "mlp"))] == 0


def test_perf_analyzer_prints_the_servers_queue_and_compute_times(tmp_models):
    binary, env = perf_analyzer_for_test()
    config = write_config(tmp_models / "config.toml", {"mlp": {"path": "mlp.onnx", "sla_ms": 200, "max_batch_size": 16}})
    with run_gateway(config) as gateway:
        done = subprocess.run(
            [str(binary), "-m", "mlp", "-u", gateway.url, "-i", "http", "--concurrency-range", "4"]
            + ["--measurement-interval", "1500", "--stability-percentage", "100", "--max-trials", "10"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        server = done.stdout.split("Server:", 1)[1]
        latency = re.search(
            r"Avg request latency: (\d+) usec \(overhead (\d+) usec \+ queue (\d+) usec \+ compute input (\d+) usec"
            r" \+ compute infer (\d+) usec \+ compute output (\d+) usec\)",
            server,
        )
        assert latency is not None, server
        total, _, queue, _, infer, _ = map(int, latency.groups())
        assert infer > 0 and total >= queue + infer
        counted = int(re.search(r"Successful request count: (\d+)", server).group(1))
        assert counted > 0
        # The server's count is the gateway's own.
        stat = requests.get(gateway.base + "/v2/models/mlp/stats", timeout=5).json()["model_stats"][0]
        assert stat["inference_stats"]["success"]["count"] >= counted


async def test_a_client_that_leaves_while_its_answer_is_encoded_is_no_answered_request(tmp_path):
    """A JSON answer of 1.5 M floats is encoded off the event loop, after the request's batch has
    ended; a client that leaves meanwhile is counted client_gone. The queue times' histogram,
    "of the requests answered", counted it all the same where its batch ended (12 against 8
    answered): it counts what the successes count."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "k"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "k"])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), tmp_path / "ident.onnx")
    config = write_config(tmp_path / "config.toml", {"ident": {"path": "ident.onnx", "sla_ms": 5000, "max_batch_size": 1}})
    tensor = np.random.default_rng(0).random((1, 1_500_000), dtype=np.float32).tobytes()
    binary = {"binary_data_size": len(tensor)}
    header = json.dumps(
        {
            "inputs": [{"name": "x", "shape": [1, 1_500_000], "datatype": "FP32", "parameters": binary}],
            "outputs": [{"name": "y", "parameters": {"binary_data": False}}],  # a JSON answer: long to encode
        }
    ).encode()
    headers = {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"}
    with run_gateway(config) as gateway:
        url = f"{gateway.base}/v2/models/ident/infer"
        async with aiohttp.ClientSession() as session:
            for leave_after_s in [None] + [0.02 + 0.01 * k for k in range(14)]:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(leave_after_s), session.post(url, data=header + tensor, headers=headers) as reply:
                        await reply.read()
        for _ in range(100):  # the requests left behind end
            families = _families(gateway.metrics())
            outcomes = {dict(labels)["outcome"]: value for labels, value in families["gateway_requests_total"].items()}
            if sum(outcomes.values()) == 15:
                break
            await asyncio.sleep(0.1)
    assert sum(outcomes.values()) == 15 and outcomes.get("success", 0) >= 1, outcomes
    assert families["gateway_queue_seconds_count"][(("model", "ident"),)] == outcomes["success"], outcomes
    assert families["gateway_request_seconds_count"][(("model", "ident"),)] == outcomes["success"], outcomes
