"""An unload waits at most its timeout for the requests it accepted, even where one of them is on
an executor that hangs: it waited for the batch's hang timeout (10 SLAs by default), and so did
the request, answered then as the hung executor's rather than as the unload's."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gateway.config import load_config
from gateway.engine import Engine
from gateway.metrics import GatewayMetrics
from gateway.server import build_app

ROW = [0.25] * 512


async def test_an_unload_ends_a_request_on_a_hung_executor_at_its_timeout(tmp_models: Path) -> None:
    config = tmp_models / "config.toml"
    config.write_text(
        '[server]\nadmin_token = "an-admin-token-of-length"\n[node]\ncpu_cores = 1.0\n[control]\npolicy = "fixed"\n'
        '[models.mlp]\npath = "mlp.onnx"\nsla_ms = 1000\nhang_timeout_ms = 120000\ncpu = { cores = 0.5, threads = 1 }\n'
    )
    engine = Engine(load_config(config), GatewayMetrics())
    await engine.start()
    try:
        async with TestClient(TestServer(build_app(engine))) as client:
            (executor,) = engine.models["mlp"].executors
            pid = executor.pid
            os.kill(pid, signal.SIGSTOP)  # hung: it takes the batch and never answers
            body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 512], "data": ROW}]}
            request = asyncio.create_task(client.post("/v2/models/mlp/infer", json=body))
            while not engine.core.busy("mlp"):
                await asyncio.sleep(0.01)
            began = time.perf_counter()
            await asyncio.wait_for(engine.unload_model("mlp", timeout_s=1.0), 60)  # the hang timeout: 120 s
            took = time.perf_counter() - began
            response = await asyncio.wait_for(request, 10)
            assert response.status == 503, await response.text()
            assert "was unloaded while this request ran" in (await response.json())["error"]
            assert took >= 1.0 and "mlp" not in engine.models
            assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    finally:
        await engine.stop()


async def test_an_unload_whose_executor_fails_to_stop_still_hands_its_cores_over(tmp_models: Path) -> None:
    """Its cores go to the others once its executor has stopped; a stop that raised (the Docker
    daemon's error) kept them granted to the model, unserved, until the gateway's restart."""
    config = tmp_models / "config.toml"
    model = '[models.{}]\npath = "mlp.onnx"\nsla_ms = 1000\ncpu = {{ cores = 0.5, threads = 1 }}\n'
    models = "".join(model.format(name) for name in "ab")
    config.write_text(f'[node]\ncpu_cores = 1.0\n[control]\npolicy = "max"\n{models}')
    engine = Engine(load_config(config), GatewayMetrics())
    await engine.start()
    try:
        (executor,) = engine.models["b"].executors
        stop = executor.stop

        async def stop_that_fails() -> None:
            await stop()
            raise RuntimeError("the daemon answered 500")

        executor.stop = stop_that_fails
        with pytest.raises(RuntimeError, match="the daemon answered 500"):
            await engine.unload_model("b", timeout_s=1.0)
        assert "b" not in engine.control.models
        assert [e.cores for e in engine.models["a"].executors] == [pytest.approx(1.0)]  # the node split among those left
    finally:
        await engine.stop()
