"""Graceful shutdown on SIGTERM and SIGINT: not ready, no new requests, a bounded drain, exit 0."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import aiohttp
import pytest
import requests

from tests.helpers import busy_config, run_gateway

BODY = json.dumps({"inputs": [{"name": "x", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0.5] * 64}]}).encode()


def config(tmp_path, drain_s: float):
    return busy_config(tmp_path, sla_ms=100, max_batch_size=1, cores=0.1, server=f"drain_timeout_s = {drain_s}")


async def backlog(base: str, session: aiohttp.ClientSession, count: int) -> list[asyncio.Task[tuple[int, str, float]]]:
    async def one() -> tuple[int, str, float]:
        async with session.post(f"{base}/v2/models/busy/infer", data=BODY) as response:
            return response.status, await response.text(), time.monotonic()

    return [asyncio.create_task(one()) for _ in range(count)]


async def test_sigterm_drains_for_the_deadline_then_fails_the_rest_and_exits_0(tmp_path):
    with run_gateway(config(tmp_path, drain_s=2.0)) as gateway:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            # 0.1 core and ~7 ms of CPU a request: 100 requests are about 7 s of backlog.
            tasks = await backlog(gateway.base, session, 100)
            await asyncio.sleep(1.0)
            assert gateway.admin("busy")["queue_length"] > 10
            signalled = time.monotonic()
            gateway.process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            # Draining: not ready, and a new request is refused while the accepted ones go on.
            assert requests.get(f"{gateway.base}/v2/health/ready", timeout=5).status_code == 503
            late = requests.post(f"{gateway.base}/v2/models/busy/infer", data=BODY, timeout=5)
            assert late.status_code == 503 and "shutting down" in late.json()["error"]
            answers = await asyncio.gather(*tasks)
        statuses = [status for status, _, _ in answers]
        assert set(statuses) <= {200, 503}
        served_in_drain = [t for status, _, t in answers if status == 200 and t > signalled + 0.3]
        assert served_in_drain, "the accepted requests went on being served during the drain"
        assert statuses.count(503) > 10  # past the deadline the rest were ended, not left to run
        assert all(t - signalled < 2.0 + 2.0 for _, _, t in answers)
        assert gateway.process.wait(timeout=10) == 0
        assert time.monotonic() - signalled < 2.0 + 8.0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_a_backlog_that_fits_the_drain_is_served_in_full(tmp_path, sig):
    with run_gateway(config(tmp_path, drain_s=20.0)) as gateway:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            tasks = await backlog(gateway.base, session, 20)
            await asyncio.sleep(0.3)
            gateway.process.send_signal(sig)
            answers = await asyncio.gather(*tasks)
        assert [status for status, _, _ in answers] == [200] * 20
        assert gateway.process.wait(timeout=20) == 0
        assert "shutting down: draining" in gateway.output()
