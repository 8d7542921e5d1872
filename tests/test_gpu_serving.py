"""`gateway serve` with an emulated GPU beside CPU executors, through tritonclient."""

from __future__ import annotations

import asyncio
import shutil

import numpy as np
import pytest
import requests
import tritonclient.http.aio as triton_aio

from tests.helpers import ROOT, run_gateway

PROFILE = ROOT / "tests" / "data" / "emulated_gpu.csv"


def _config(folder, example_models, policy: str = "deferral", drop_late: bool = False, sla_ms: float = 60) -> None:
    for name in ("mlp", "cnn_small"):
        shutil.copy(example_models / f"{name}.onnx", folder / f"{name}.onnx")
    (folder / "config.toml").write_text(
        f"""
[node]
cpu_cores = 1.5
gpus = [0]

[gpu]
executor = "emulated"
profile = "{PROFILE}"
policy = "{policy}"

[models.mlp]
path = "mlp.onnx"
sla_ms = {sla_ms}
max_batch_size = 8
drop_late = {str(drop_late).lower()}
cpu = {{ cores = 0.5, threads = 1 }}

[models.cnn_small]
path = "cnn_small.onnx"
sla_ms = 100
max_batch_size = 16
cpu = {{ cores = 0.5, threads = 1 }}
"""
    )


async def _burst(url: str, model: str, shape: tuple[int, ...], count: int, gap_s: float):
    client = triton_aio.InferenceServerClient(url, conn_limit=64)
    rng = np.random.default_rng(1)
    try:

        async def one(i: int):
            await asyncio.sleep(i * gap_s)
            data = rng.random(shape, dtype=np.float32)
            tensor = triton_aio.InferInput("x", list(shape), "FP32")
            tensor.set_data_from_numpy(data)
            return data, await client.infer(model, [tensor])

        return await asyncio.gather(*(one(i) for i in range(count)), return_exceptions=True)
    finally:
        await client.close()


async def test_responses_say_where_they_ran_and_both_devices_serve(tmp_path, example_models):
    import onnxruntime as ort

    _config(tmp_path, example_models)
    with run_gateway(tmp_path / "config.toml") as gateway:
        model = gateway.admin("mlp")
        assert [e["device"] for e in model["executors"]] == ["cpu", "gpu:0"]
        assert model["executors"][1]["emulated"] is True
        gpu = model["profiles"]["gpu"]
        assert (gpu["per_item_ms"], gpu["fixed_ms"]) == (0.5, 20.0)
        # A burst at 800/s: an emulated GPU batch of at most 8 holds for 24 ms (20 ms + 0.5 ms a
        # row), 330 requests/s at best, so the GPU cannot finish every request within the 60 ms
        # SLA and the CPU takes what it cannot.
        results = await _burst(gateway.url, "mlp", (1, 512), 200, 0.00125)
        session = ort.InferenceSession(str(tmp_path / "mlp.onnx"), providers=["CPUExecutionProvider"])
        where = []
        for outcome in results:
            assert not isinstance(outcome, Exception), outcome
            data, result = outcome
            assert np.allclose(result.as_numpy("y"), session.run(None, {"x": data})[0], rtol=1e-4, atol=1e-5)
            where.append(result.get_response()["parameters"]["executed_on"])
        assert set(where) == {"cpu", "gpu:0"}, set(where)
        stats = gateway.admin("mlp")["stats"]
        assert stats["served_on"] == {"cpu": where.count("cpu"), "gpu:0": where.count("gpu:0")}
        # The GPU batched (a deferred or queued batch grows); the CPU took the spill.
        gpu_batches = [
            r[1].get_response()["parameters"]["batch_size"]
            for r in results
            if r[1].get_response()["parameters"]["executed_on"] == "gpu:0"
        ]
        assert max(gpu_batches) > 1


async def test_hopeless_requests_are_refused_at_admission(tmp_path, example_models):
    # The emulated GPU needs 20.5 ms for one mlp request; the CPU executor ~0.1 ms. An SLA of
    # 0.01 ms is beyond both: refused at once, before any work.
    _config(tmp_path, example_models, drop_late=True, sla_ms=0.01)
    with run_gateway(tmp_path / "config.toml") as gateway:
        body = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.1] * 512}]}
        response = requests.post(f"{gateway.base}/v2/models/mlp/infer", json=body, timeout=10)
        assert response.status_code == 503
        assert "cannot answer within its SLA" in response.json()["error"]
        assert gateway.admin("mlp")["stats"]["outcomes"] == {"refused_deadline": 1}
        # A feasible SLA is served.
        assert requests.put(f"{gateway.base}/admin/models/mlp/sla", json={"sla_ms": 500}, timeout=10).status_code == 200
        assert requests.post(f"{gateway.base}/v2/models/mlp/infer", json=body, timeout=10).status_code == 200


@pytest.mark.parametrize("policy", ["work_conserving", "roma", "edf"])
async def test_every_gpu_policy_serves(tmp_path, example_models, policy):
    _config(tmp_path, example_models, policy=policy, sla_ms=500)
    with run_gateway(tmp_path / "config.toml") as gateway:
        results = await _burst(gateway.url, "cnn_small", (1, 3, 32, 32), 40, 0.002)
        assert all(not isinstance(r, Exception) for r in results), [r for r in results if isinstance(r, Exception)][:1]
        assert "gpu:0" in {r[1].get_response()["parameters"]["executed_on"] for r in results}


async def test_emulated_gpu_can_answer_zeros_without_computing(tmp_path, example_models):
    _config(tmp_path, example_models, sla_ms=500)
    config = tmp_path / "config.toml"
    config.write_text(config.read_text().replace('policy = "deferral"', 'policy = "deferral"\nemulated_outputs = "zeros"'))
    with run_gateway(config) as gateway:
        results = await _burst(gateway.url, "cnn_small", (1, 3, 32, 32), 5, 0.05)
        for _, result in results:
            assert result.get_response()["parameters"]["executed_on"] == "gpu:0"
            assert not result.as_numpy("logits").any() and result.as_numpy("logits").shape == (1, 10)
        assert "emulated GPU answers zeros" in gateway.output()
