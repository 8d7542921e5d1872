"""Timestamps finer than uvloop's millisecond, and core-seconds counted as enforced (issue bugs 1 and 5)."""

from __future__ import annotations

import time

import requests

from tests.helpers import run_gateway, write_config

BODY = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.1] * 512}]}


def test_request_timestamps_are_not_quantized_to_a_millisecond(tmp_models):
    # Under uvloop, loop.time() has 1 ms grain and stands still within a loop iteration: every
    # queue_ms (dispatch - arrival) came out a whole number of milliseconds, mostly 0.
    config = write_config(tmp_models / "config.toml", {"mlp": {"path": "mlp.onnx", "sla_ms": 1000, "max_batch_size": 8}})
    with run_gateway(config) as gateway:
        url = f"{gateway.base}/v2/models/mlp/infer"
        answers = [requests.post(url, json=BODY, timeout=10).json() for _ in range(30)]
        queue_ms = [a["parameters"]["queue_ms"] for a in answers]
        assert sum(q != round(q) for q in queue_ms) >= 20, queue_ms
        assert all(0 <= q < 50 for q in queue_ms)
        # With a 1 us SLA every answer is a violation, and each response time is above zero.
        requests.put(f"{gateway.base}/admin/models/mlp/sla", json={"sla_ms": 0.001}, timeout=10).raise_for_status()
        for _ in range(5):
            assert requests.post(url, json=BODY, timeout=10).status_code == 200
        stats = gateway.admin("mlp")["stats"]
        assert stats["violations"] == 5


def test_core_seconds_count_the_enforced_cfs_floor_not_the_grant(tmp_models):
    # A 0.005-core pin is enforced as the CFS floor: the least quota, 1 ms, in the kernel's
    # longest default period, 100 ms: 0.01 core.
    config = tmp_models / "config.toml"
    config.write_text(
        '[node]\ncpu_cores = 2.0\n[models.mlp]\npath = "mlp.onnx"\nsla_ms = 100\n'
        "cpu = { cores = 0.5, min_cores = 0.005, threads = 1 }\n"
    )
    with run_gateway(config) as gateway:
        pinned = requests.put(f"{gateway.base}/admin/models/mlp/cores", json={"cores": 0.005}, timeout=10)
        assert pinned.status_code == 200, pinned.text
        before, started = gateway.admin("mlp")["stats"]["core_seconds"], time.monotonic()
        time.sleep(2.0)
        after, ended = gateway.admin("mlp")["stats"]["core_seconds"], time.monotonic()
        rate = (after - before) / (ended - started)
        assert 0.009 <= rate <= 0.011, rate
