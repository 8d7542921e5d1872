"""SIGTERM with a backlog: every request is answered (a result or a 503) and the gateway exits at once."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import aiohttp

from tests.helpers import busy_model, run_gateway

BODY = json.dumps({"inputs": [{"name": "x", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0.5] * 64}]}).encode()


async def test_sigterm_answers_the_backlog_and_exits(tmp_path):
    busy_model(tmp_path / "busy.onnx")
    (tmp_path / "config.toml").write_text(
        """
[control]
policy = "fixed"
[models.busy]
path = "busy.onnx"
sla_ms = 100
max_batch_size = 1
cpu = { cores = 0.1, threads = 1 }
"""
    )
    with run_gateway(tmp_path / "config.toml") as gateway:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:

            async def one() -> int:
                async with session.post(f"{gateway.base}/v2/models/busy/infer", data=BODY) as response:
                    await response.read()
                    return response.status

            # 0.1 core and ~7 ms of CPU a request: 100 requests are about 7 s of backlog.
            requests = [asyncio.create_task(one()) for _ in range(100)]
            await asyncio.sleep(1.0)
            assert gateway.admin("busy")["queue_length"] > 10
            started = time.monotonic()
            gateway.process.send_signal(signal.SIGTERM)
            statuses = await asyncio.gather(*requests)
        assert set(statuses) <= {200, 503}
        assert statuses.count(503) > 10  # the queued ones were ended, not left to run
        assert gateway.process.wait(timeout=10) == 0
        assert time.monotonic() - started < 10
