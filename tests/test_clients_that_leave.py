"""Requests whose clients have gone are never run (issue 18, item 1).

The issue's reproduction: the MLP pinned at 0.05 core, then 60 times: open a socket, send a
batch-32 POST, close it. Before, all of them ran and counted `success`, the queue held 39 and a
good request waited 0.38 s behind them. Now the handler of a client that left is cancelled: its
request leaves the queue at once (never run) or, running, is discarded, and counts `client_gone`.
"""

from __future__ import annotations

import json
import socket
import time

import requests

from tests.cluster import wait_for
from tests.helpers import metric_value, run_gateway

ABANDONED = 60


def test_requests_of_clients_that_left_are_not_run(tmp_models):
    config = tmp_models / "config.toml"
    config.write_text(
        '[node]\ncpu_cores = 2.0\n[models.mlp]\npath = "mlp.onnx"\nsla_ms = 1000\nmax_batch_size = 32\n'
        "cpu = { cores = 0.5, min_cores = 0.05, threads = 1 }\n"
    )
    body = json.dumps({"inputs": [{"name": "x", "shape": [32, 512], "datatype": "FP32", "data": [0.1] * (32 * 512)}]}).encode()
    with run_gateway(config) as gateway:
        requests.put(f"{gateway.base}/admin/models/mlp/cores", json={"cores": 0.05}, timeout=10).raise_for_status()
        head = (
            f"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: {gateway.url}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        for _ in range(ABANDONED):
            with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
                sock.sendall(head + body)

        def ended(page: str) -> bool:
            ends = ("client_gone", "success")
            outcomes = sum(metric_value(page, "gateway_requests_total", model="mlp", outcome=o) for o in ends)
            return outcomes == ABANDONED and metric_value(page, "gateway_requests_in_flight", model="mlp") == 0

        # Every abandoned request ends (polled: a slow machine notices the closed sockets later).
        wait_for(lambda: ended(gateway.metrics()), 10, "the abandoned requests ended")
        metrics = gateway.metrics()
        started = time.perf_counter()
        good = requests.post(
            f"{gateway.base}/v2/models/mlp/infer",
            json={"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.1] * 512}]},
            timeout=10,
        )
        waited = time.perf_counter() - started
        after = gateway.metrics()
    gone = metric_value(metrics, "gateway_requests_total", model="mlp", outcome="client_gone")
    success = metric_value(metrics, "gateway_requests_total", model="mlp", outcome="success")
    print(f"client_gone {gone:.0f}, success {success:.0f}, good request {waited * 1000:.1f} ms")
    # Each abandoned request ended as client_gone (a batch already done when its client left
    # may count success); none is left in the queue, and the counts add up.
    assert gone + success == ABANDONED and gone >= ABANDONED - 3
    assert metric_value(metrics, "gateway_queue_length", model="mlp") == 0
    assert metric_value(metrics, "gateway_requests_in_flight", model="mlp") == 0
    # A good request does not wait behind the dead ones.
    assert good.status_code == 200 and waited < 0.2
    assert metric_value(after, "gateway_requests_total", model="mlp", outcome="success") == success + 1
