"""The admin API: models, their executors and stats; SLA changes at run time."""

from __future__ import annotations

import requests

from tests.helpers import run_gateway, write_config


def test_sla_change_shows_in_admin_and_metrics(tmp_models):
    config = write_config(tmp_models / "config.toml", {"mlp": {"path": "mlp.onnx", "sla_ms": 40, "max_batch_size": 8}})
    with run_gateway(config) as gateway:
        before = gateway.admin("mlp")
        assert before["sla_ms"] == 40
        assert 'gateway_sla_seconds{model="mlp"} 0.04' in gateway.metrics()

        response = requests.put(f"{gateway.base}/admin/models/mlp/sla", json={"sla_ms": 250}, timeout=10)
        assert response.status_code == 200, response.text
        assert response.json()["sla_ms"] == 250

        listing = gateway.admin()["models"]
        assert [m["sla_ms"] for m in listing if m["name"] == "mlp"] == [250]
        assert 'gateway_sla_seconds{model="mlp"} 0.25' in gateway.metrics()


def test_admin_model_shape_and_stats(tmp_models):
    config = write_config(tmp_models / "config.toml", {"mlp": {"path": "mlp.onnx", "sla_ms": 0.001, "max_batch_size": 8}})
    with run_gateway(config) as gateway:
        body = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.1] * 512}]}
        for _ in range(5):
            assert requests.post(f"{gateway.base}/v2/models/mlp/infer", json=body, timeout=10).status_code == 200
        model = gateway.admin("mlp")
        assert set(model) >= {"name", "sla_ms", "queue_length", "executors", "stats"}
        (executor,) = model["executors"]
        assert set(executor) >= {"id", "device", "backend", "cores"}
        assert executor["device"] == "cpu" and executor["backend"] == "process"
        stats = model["stats"]
        assert stats["requests"] == 5
        # An SLA of 1 microsecond: every answer is a violation.
        assert stats["violations"] == 5
        assert 0 < stats["mean_rt_ms"] <= stats["p99_rt_ms"] <= stats["max_rt_ms"]
        assert stats["core_seconds"] > 0
        metrics = gateway.metrics()
        assert 'gateway_requests_total{model="mlp",outcome="success"} 5.0' in metrics
        assert 'gateway_sla_violations_total{model="mlp"} 5.0' in metrics
        assert 'gateway_request_seconds_count{model="mlp"} 5.0' in metrics
        assert 'gateway_batch_size_count{model="mlp"}' in metrics
        assert 'gateway_queue_length{model="mlp"}' in metrics


def test_bad_sla_changes_are_refused(tmp_models):
    config = write_config(tmp_models / "config.toml", {"mlp": {"path": "mlp.onnx", "sla_ms": 40}})
    with run_gateway(config) as gateway:
        for body in ({"sla_ms": -5}, {"sla_ms": "fast"}, {"sla": 10}, [1], {"sla_ms": True}):
            response = requests.put(f"{gateway.base}/admin/models/mlp/sla", json=body, timeout=10)
            assert response.status_code == 400, body
            assert "sla_ms" in response.json()["error"]
        assert requests.put(f"{gateway.base}/admin/models/mlp/sla", data=b"{", timeout=10).status_code == 400
        assert requests.put(f"{gateway.base}/admin/models/zzz/sla", json={"sla_ms": 5}, timeout=10).status_code == 404
        assert gateway.admin("mlp")["sla_ms"] == 40
