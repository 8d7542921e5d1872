"""A bounded soak: mixed good, bad, abandoned and oversized requests from several processes.

Two models (the MLP and a busier upconv) under the PI controller; four client processes for
SECONDS each, every one a fixed mix: good requests to both models (each with a 2 s timeout of
its own), requests of the wrong shape (400), oversized bodies (413), and abandoned requests (the
socket closed right after sending). The MLP's executor is killed once, midway. At the end:

- every request a client saw answered has the matching outcome on /metrics, and every
  abandoned one either never reached a model or ended `client_gone` (or `success`, when its
  batch was already done);
- received = sum of outcomes + in flight, and in flight is 0;
- the gateway's RSS grew by less than RSS_GROWTH_MIB;
- the log has no ERROR line but those the kill explains.
"""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
import random
import re
import signal
import socket
import time
from collections import Counter

import psutil
import requests

from tests.helpers import busy_model, metric_value, run_gateway

SECONDS = 40.0
CLIENTS = 4
RSS_GROWTH_MIB = 60
MAX_BODY = 256 * 1024
TIMEOUT = {"timeout": 2_000_000}  # microseconds, as Triton reads it
MLP = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.1] * 512}], "parameters": TIMEOUT}
BUSY = {"inputs": [{"name": "x", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0.5] * 64}], "parameters": TIMEOUT}
WRONG = {"inputs": [{"name": "x", "shape": [1, 7], "datatype": "FP32", "data": [0.1] * 7}]}
# Status -> the outcomes on /metrics it comes from.
OUTCOMES = {
    200: ("success",),
    400: ("invalid", "model_error"),
    413: ("too_large",),
    429: ("queue_full",),
    503: ("executor_failed", "refused_deadline", "shutdown"),
    504: ("timeout",),
}
# ERROR lines the kill explains (executors/lifecycle.py).
EXPLAINED = (re.compile(r"executor cpu-mlp \(pid \d+\) ended: killed by SIGKILL; restarting"),)


def client(port: int, seed: int, seconds: float) -> dict[str, int]:
    """One client process: the mix until ``seconds`` pass; what it sent and saw, by kind and status."""
    rng = random.Random(seed)
    base = f"http://127.0.0.1:{port}"
    seen: Counter[str] = Counter()
    # Twice the body cap: refused 413 whatever it holds.
    oversized = json.dumps({"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.1] * 120_000}]}).encode()
    assert len(oversized) > 2 * MAX_BODY
    session = requests.Session()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        kind = rng.choices(["mlp", "busy", "wrong", "oversized", "abandoned"], [45, 25, 10, 10, 10])[0]
        model = "busy" if kind == "busy" else "mlp"
        if kind == "abandoned":
            body = json.dumps(MLP).encode()
            head = (
                "POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            )
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(head.encode() + body)
            seen["abandoned mlp"] += 1
            continue
        data = {"mlp": json.dumps(MLP).encode(), "busy": json.dumps(BUSY).encode(), "wrong": json.dumps(WRONG).encode()}.get(
            kind, oversized
        )
        response = session.post(
            f"{base}/v2/models/{model}/infer", data=data, headers={"Content-Type": "application/json"}, timeout=30
        )
        seen[f"{response.status_code} {model}"] += 1
    return dict(seen)


def test_soak_with_mixed_clients_and_a_killed_executor(tmp_path, example_models):
    import shutil

    shutil.copy(example_models / "mlp.onnx", tmp_path / "mlp.onnx")
    busy_model(tmp_path / "busy.onnx")
    (tmp_path / "config.toml").write_text(
        f"""
[server]
max_body_bytes = {MAX_BODY}
[node]
cpu_cores = 2.0
[control]
policy = "pi"
[models.mlp]
path = "mlp.onnx"
sla_ms = 50
max_batch_size = 16
cpu = {{ cores = 0.5, threads = 1 }}
[models.busy]
path = "busy.onnx"
sla_ms = 100
max_batch_size = 8
cpu = {{ cores = 0.5, threads = 1 }}
"""
    )
    with run_gateway(tmp_path / "config.toml") as gateway:
        process = psutil.Process(gateway.process.pid)
        rss_before = process.memory_info().rss
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(CLIENTS, mp_context=context) as pool:
            futures = [pool.submit(client, gateway.port, seed, SECONDS) for seed in range(CLIENTS)]
            time.sleep(SECONDS / 2)
            os.kill(gateway.executor_pid("mlp"), signal.SIGKILL)
            seen = sum((Counter(f.result()) for f in futures), Counter())
        # Abandoned requests end when their handlers notice; give them a moment.
        for _ in range(50):
            metrics = gateway.metrics()
            if all(metric_value(metrics, "gateway_requests_in_flight", model=m) == 0 for m in ("mlp", "busy")):
                break
            time.sleep(0.1)
        rss_growth_mib = (process.memory_info().rss - rss_before) / 2**20
        log = gateway.output()

    print(dict(seen), f"RSS +{rss_growth_mib:.1f} MiB")
    assert seen["200 mlp"] > 100 and seen["200 busy"] > 50 and seen["abandoned mlp"] > 20
    assert set(seen) <= {f"{status} {m}" for status in OUTCOMES for m in ("mlp", "busy")} | {"abandoned mlp"}, seen
    for model in ("mlp", "busy"):
        outcomes = {
            outcome: metric_value(metrics, "gateway_requests_total", model=model, outcome=outcome)
            for outcome in {o for group in OUTCOMES.values() for o in group} | {"client_gone", "internal_error"}
        }
        received = metric_value(metrics, "gateway_requests_received_total", model=model)
        assert metric_value(metrics, "gateway_requests_in_flight", model=model) == 0
        assert received == sum(outcomes.values()), (model, received, outcomes)
        assert outcomes["internal_error"] == 0
        abandoned = seen[f"abandoned {model}"]
        answered = sum(seen[f"{status} {model}"] for status in OUTCOMES)
        # Every answered request is on the server; abandoned ones reached it or not.
        assert answered <= received <= answered + abandoned
        for status, group in OUTCOMES.items():
            count = sum(outcomes[o] for o in group)
            if status == 200:
                # A batch already done when its client left counts as a success nobody read.
                assert seen[f"200 {model}"] <= count <= seen[f"200 {model}"] + abandoned
            else:
                assert count == seen[f"{status} {model}"], (model, status, count, seen)
        assert outcomes["client_gone"] <= abandoned
    assert rss_growth_mib < RSS_GROWTH_MIB
    errors = [line for line in log.splitlines() if " ERROR " in line]
    unexplained = [line for line in errors if not any(p.search(line) for p in EXPLAINED)]
    assert not unexplained, unexplained
    assert errors, "the kill should have been logged"
