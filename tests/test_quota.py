"""A CPU quota really caps an executor: its CPU time over wall time, measured from the OS."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import psutil
import requests

from tests.helpers import busy_model, run_gateway
from tests.test_control_loop import needs_cgroup

BODY = json.dumps({"inputs": [{"name": "x", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0.5] * 64}]}).encode()


async def flood(url: str, seconds: float, clients: int = 8) -> int:
    """Keep the executor's queue full for ``seconds``; returns how many requests succeeded."""
    ok = 0
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession() as session:

        async def client() -> None:
            nonlocal ok
            while time.monotonic() < deadline:
                async with session.post(url, data=BODY, headers={"Content-Type": "application/json"}) as response:
                    await response.read()
                    ok += response.status == 200

        await asyncio.gather(*(client() for _ in range(clients)))
    return ok


async def measured_cores(pid: int, url: str, seconds: float = 4.0) -> float:
    process = psutil.Process(pid)
    load = asyncio.create_task(flood(url, seconds + 1.5))
    await asyncio.sleep(1.0)  # let the queue fill
    before, started = process.cpu_times(), time.monotonic()
    await asyncio.sleep(seconds)
    after, elapsed = process.cpu_times(), time.monotonic() - started
    assert await load > 0
    return (after.user + after.system - before.user - before.system) / elapsed


@needs_cgroup
async def test_half_a_core_caps_a_busy_executor_and_a_resize_lifts_it_live(tmp_path):
    busy_model(tmp_path / "busy.onnx")
    (tmp_path / "config.toml").write_text(
        """
[node]
cpu_cores = 2

[control]
policy = "fixed"
actuator = "cgroup"

[models.busy]
path = "busy.onnx"
sla_ms = 1000
max_batch_size = 4
cpu = { cores = 0.5, threads = 2, max_cores = 2 }
"""
    )
    with run_gateway(tmp_path / "config.toml") as gateway:
        url = f"{gateway.base}/v2/models/busy/infer"
        pid = gateway.executor_pid("busy")
        capped = await measured_cores(pid, url)
        assert 0.4 < capped < 0.6, capped

        response = requests.put(f"{gateway.base}/admin/models/busy/cores", json={"cores": 1.5}, timeout=10)
        assert response.status_code == 200, response.text
        assert response.json()["executors"][0]["cores"] == 1.5
        lifted = await measured_cores(pid, url)
        assert lifted > 0.9, lifted
        assert gateway.executor_pid("busy") == pid  # resized, not restarted
