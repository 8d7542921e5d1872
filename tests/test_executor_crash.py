"""An executor killed under load: every request ends (a result or a 5xx), none hangs, it comes back."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import aiohttp
import requests

from tests.helpers import busy_model, run_gateway, write_config

# A model that takes milliseconds a batch, so that under load a batch is almost always in
# flight when the executor is killed.
BODY = {"inputs": [{"name": "x", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0.25] * 64}]}


async def _load(base: str, seconds: float, clients: int) -> list[tuple[int, str]]:
    """Closed-loop clients for ``seconds``; each request must end within 30 s."""
    answers: list[tuple[int, str]] = []
    deadline = time.monotonic() + seconds
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def client() -> None:
            while time.monotonic() < deadline:
                async with session.post(f"{base}/v2/models/busy/infer", json=BODY) as response:
                    answers.append((response.status, await response.text()))

        await asyncio.gather(*(client() for _ in range(clients)))
    return answers


async def test_killed_executor_fails_its_requests_and_comes_back(tmp_path):
    busy_model(tmp_path / "busy.onnx")
    config = write_config(tmp_path / "config.toml", {"busy": {"path": "busy.onnx", "sla_ms": 100, "max_batch_size": 4}})
    with run_gateway(config) as gateway:
        first_pid = gateway.executor_pid("busy")
        load = asyncio.create_task(_load(gateway.base, seconds=4.0, clients=8))
        await asyncio.sleep(1.0)
        os.kill(first_pid, signal.SIGKILL)
        answers = await load  # would raise a timeout if any request hung

        statuses = [status for status, _ in answers]
        assert set(statuses) <= {200, 503}, set(statuses)
        failed = [text for status, text in answers if status == 503]
        assert failed, "a kill under load must fail the batch in flight"
        assert all("executor cpu-busy failed" in text for text in failed)
        assert statuses.count(200) > len(failed)

        gateway.wait_ready("busy", timeout=10)
        model = gateway.admin("busy")
        (executor,) = model["executors"]
        assert executor["pid"] != first_pid and executor["restarts"] == 1 and executor["state"] == "ready"
        assert requests.post(f"{gateway.base}/v2/models/busy/infer", json=BODY, timeout=10).status_code == 200
        # Counts add up: every answer the clients saw is in the gateway's accounting.
        outcomes = gateway.admin("busy")["stats"]["outcomes"]
        assert outcomes["success"] == statuses.count(200) + 1
        assert outcomes["executor_failed"] == len(failed)


def test_an_executor_ends_with_its_killed_gateway_even_when_stopped(tmp_models):
    """A stopped executor reads no connection: only the kernel's parent-death signal ends it
    once its gateway is SIGKILLed (it stayed stopped for good)."""
    import psutil

    config = write_config(tmp_models / "config.toml", {"mlp": {"path": "mlp.onnx", "sla_ms": 100, "max_batch_size": 8}})
    with run_gateway(config) as gateway:
        executor = psutil.Process(gateway.executor_pid("mlp"))
        os.kill(executor.pid, signal.SIGSTOP)
        try:
            gateway.process.kill()
            gateway.process.wait()
            executor.wait(timeout=10)  # psutil.TimeoutExpired if it outlived its gateway
        finally:
            if executor.is_running():
                executor.kill()


def test_an_executor_whose_gateway_ended_before_it_could_ask_to_die_with_it_ends(tmp_models):
    """The parent-death signal is asked for once ONNX Runtime is imported (a second or more): a
    gateway killed before then had already ended, and the executor lived on until its connection
    failed. Here its parent is alive and no gateway: it is told its gateway is another pid."""
    import subprocess
    import sys

    from executors.names import PARENT_PID_VARIABLE
    from tests.helpers import ROOT, ended_pid

    gone = ended_pid()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "executors.worker",
            "--connect",
            "unix:/nonexistent.sock",
            "--model",
            f"mlp={tmp_models / 'mlp.onnx'}",
        ],
        env={**os.environ, PARENT_PID_VARIABLE: str(gone)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and f"its gateway (pid {gone}) has ended" in done.stderr, done.stderr
