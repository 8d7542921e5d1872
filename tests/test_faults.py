"""Executor faults under load: kill -9, SIGSTOP (a hang) and out of memory. The affected requests
are answered with an error, no request waits past its timeout, the executor is back within 5 s,
and the control plane keeps its state."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import aiohttp
import numpy as np
import psutil
import pytest
import requests
from onnx import TensorProto, helper

from executors.limits import unavailable_reason
from tests.helpers import busy_config, run_gateway, save_model

TIMEOUT_S = 3.0
BODY = {
    "inputs": [{"name": "x", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0.5] * 64}],
    "parameters": {"timeout": int(TIMEOUT_S * 1e6)},
}


def config(tmp_path: Path) -> Path:
    return busy_config(tmp_path, sla_ms=100, max_batch_size=4, cores=0.7, model="hang_timeout_ms = 1000")


async def load(base: str, seconds: float, clients: int = 6) -> list[tuple[int, float, str]]:
    """Closed-loop clients; (status, seconds it took, error) of every request."""
    answers: list[tuple[int, float, str]] = []
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:

        async def client() -> None:
            while time.monotonic() < deadline:
                started = time.monotonic()
                async with session.post(f"{base}/v2/models/busy/infer", json=BODY) as response:
                    body = await response.json()
                    answers.append((response.status, time.monotonic() - started, body.get("error", "")))

        await asyncio.gather(*(client() for _ in range(clients)))
    return answers


def wait_replaced(base: str, old_pid: int, since: float, model: str = "busy", limit_s: float = 10.0) -> float:
    """Seconds from ``since`` until the model's executor runs again under a new pid."""
    while time.monotonic() - since < limit_s:
        (executor,) = requests.get(f"{base}/admin/models/{model}", timeout=5).json()["executors"]
        if executor["state"] == "ready" and executor["pid"] not in (None, old_pid):
            return time.monotonic() - since
        time.sleep(0.05)
    raise AssertionError(f"the executor was not back within {limit_s} s")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["kill-9", "SIGSTOP-hang"])
async def test_a_killed_or_hung_executor_is_replaced_within_5_s(tmp_path, sig):
    with run_gateway(config(tmp_path)) as gateway:
        before = gateway.admin("busy")
        (executor,) = before["executors"]
        traffic = asyncio.create_task(load(gateway.base, seconds=7.0))
        await asyncio.sleep(1.5)
        struck = time.monotonic()
        os.kill(executor["pid"], sig)
        back_after = await asyncio.to_thread(wait_replaced, gateway.base, executor["pid"], struck)
        answers = await traffic

        assert back_after < 5.0, back_after
        statuses = {status for status, _, _ in answers}
        assert statuses <= {200, 503, 504}, statuses
        assert max(took for _, took, _ in answers) < TIMEOUT_S + 0.5  # nobody waited past its timeout
        failed = [error for status, _, error in answers if status == 503]
        assert failed and all("executor cpu-busy failed" in e for e in failed)
        if sig == signal.SIGSTOP:
            assert any("did not answer within 1 s and was killed (hung)" in e for e in failed)
            assert "no reply to a batch" in gateway.output()
        # Served again after the fault, and the control plane kept the executor's cores.
        after = gateway.admin("busy")
        assert after["executors"][0]["restarts"] == 1 and after["executors"][0]["cores"] == executor["cores"]
        assert any(status == 200 and took for status, took, _ in answers[-20:])
        assert requests.post(f"{gateway.base}/v2/models/busy/infer", json=BODY, timeout=10).status_code == 200
        stats = gateway.admin("busy")["stats"]
        assert stats["received"] == sum(stats["outcomes"].values()) == len(answers) + 1


def memory_hog(path: Path) -> Path:
    """y = Expand(x, shape): the client picks how much memory the output takes."""
    graph = helper.make_graph(
        [helper.make_node("Expand", ["x", "shape"], ["y"])],
        "hog",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])],
    )
    return save_model(graph, path)


def memory_cgroup_reason() -> str | None:
    reason = unavailable_reason("memory")
    return f"no writable memory cgroup here ({reason})" if reason else None


def test_an_executor_out_of_memory_is_killed_answered_and_replaced(tmp_path):
    reason = memory_cgroup_reason()
    if reason:
        pytest.skip(reason)
    memory_hog(tmp_path / "hog.onnx")
    (tmp_path / "config.toml").write_text(
        '[models.hog]\npath = "hog.onnx"\nsla_ms = 1000\ncpu = { cores = 1.0, threads = 1, memory_mb = 300 }\n'
    )

    def body(rows: int) -> dict:
        return {
            "inputs": [
                {"name": "x", "shape": [1], "datatype": "FP32", "data": [1.5]},
                {"name": "shape", "shape": [2], "datatype": "INT64", "data": [rows, 1000]},
            ]
        }

    with run_gateway(tmp_path / "config.toml") as gateway:
        url = f"{gateway.base}/v2/models/hog/infer"
        small = requests.post(url, json=body(10), timeout=30)
        assert small.status_code == 200 and np.allclose(small.json()["outputs"][0]["data"][:3], 1.5)
        (executor,) = gateway.admin("hog")["executors"]
        assert executor["memory_mb"] == 300
        struck = time.monotonic()
        huge = requests.post(url, json=body(200_000), timeout=30)  # 800 MB of output
        assert huge.status_code == 503, huge.text
        assert "executor cpu-hog failed" in huge.json()["error"]
        wait_replaced(gateway.base, executor["pid"], struck, model="hog")
        assert "out of memory (over its limit of 300 MB, memory_mb)" in gateway.output()
        assert requests.post(url, json=body(10), timeout=30).status_code == 200


def endless_model(path: Path) -> Path:
    """x[N, 4] -> y[N, 4] through a Loop of 10^15 steps: a run that never ends."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Identity", ["v_in"], ["v_out"])],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, ["N", 4]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, ["N", 4]),
        ],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["steps", "go", "x"], ["y"], body=body)],
        "endless",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor("steps", TensorProto.INT64, [], [10**15]), helper.make_tensor("go", TensorProto.BOOL, [], [True])],
    )
    return save_model(graph, path)


def said(gateway, text: str, times: int) -> None:
    """``text`` in the gateway's log ``times`` times, within 5 s: its writer thread may lag."""
    deadline = time.monotonic() + 5
    while gateway.output().count(text) < times and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gateway.output().count(text) == times, gateway.output()


def test_a_model_that_never_answers_its_profiling_run_neither_holds_the_start_nor_a_load(tmp_path):
    """The start-up profiling and a load's had no hang timeout: the gateway never listened, and a
    load never ended (holding every later load and unload behind it)."""
    endless_model(tmp_path / "endless.onnx")
    (tmp_path / "later").mkdir()
    endless_model(tmp_path / "later" / "endless.onnx")
    (tmp_path / "later" / "config.toml").write_text('path = "endless.onnx"\nsla_ms = 50\nhang_timeout_ms = 1000\n')
    (tmp_path / "config.toml").write_text(
        '[control]\npolicy = "fixed"\n'
        '[models.endless]\npath = "endless.onnx"\nsla_ms = 50\nhang_timeout_ms = 1000\ncpu = { cores = 0.5, threads = 1 }\n'
    )
    with run_gateway(tmp_path / "config.toml") as gateway:
        said(gateway, "no reply to a profiling batch of 1 within 1 s (hang_timeout_ms)", 1)
        body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.0] * 4}]}
        answer = requests.post(f"{gateway.base}/v2/models/endless/infer", json=body, timeout=30)
        assert answer.status_code == 503 and "hung" in answer.json()["error"]
        loaded = requests.post(f"{gateway.base}/v2/repository/models/later/load", timeout=30)
        assert loaded.status_code == 200, loaded.text
        said(gateway, "no reply to a profiling batch", 2)


def heavy_model(path: Path) -> Path:
    """x[N, 256] -> y[N, 256] through four 2048-wide layers: 54 MB of weights, loaded at start."""
    rng = np.random.default_rng(0)
    dims = [256, 2048, 2048, 2048, 2048, 256]
    weights = []
    for i, (rows, columns) in enumerate(zip(dims, dims[1:], strict=False)):
        array = (rng.standard_normal((rows, columns)) / np.sqrt(rows)).astype(np.float32)
        weights.append(helper.make_tensor(f"w{i}", TensorProto.FLOAT, [rows, columns], array.tobytes(), raw=True))
    names = ["x", *[f"h{i}" for i in range(len(weights) - 1)], "y"]
    nodes = [helper.make_node("MatMul", [names[i], f"w{i}"], [names[i + 1]]) for i in range(len(weights))]
    graph = helper.make_graph(
        nodes,
        "heavy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 256])],
        weights,
    )
    return save_model(graph, path)


def test_an_executor_is_under_its_cores_and_memory_limit_before_it_loads_its_model(tmp_path):
    """It was moved into its groups at its hello: its start ran under no quota (on every restart
    too), and its model's weights were never charged to memory_mb."""
    reason = memory_cgroup_reason()
    if reason:
        pytest.skip(reason)
    heavy_model(tmp_path / "heavy.onnx")
    (tmp_path / "config.toml").write_text(
        '[control]\npolicy = "fixed"\n'
        '[models.heavy]\npath = "heavy.onnx"\nsla_ms = 1000\ncpu = { cores = 0.3, threads = 1, memory_mb = 400 }\n'
    )
    with run_gateway(tmp_path / "config.toml") as gateway:
        old = gateway.executor_pid("heavy")
        os.kill(old, signal.SIGKILL)
        # The replacement's groups, read while it has not said hello (its model still loads): its
        # groups first, then its state, so that a move at its hello cannot pass for one before it.
        # A busy gateway puts it in its groups a moment after the fork: it is read until then.
        seen, last = None, None
        deadline = time.monotonic() + 10
        while seen is None and time.monotonic() < deadline:
            for child in psutil.Process(gateway.process.pid).children():
                if child.pid == old:
                    continue
                try:
                    last = Path(f"/proc/{child.pid}/cgroup").read_text()
                except FileNotFoundError:
                    continue
                (executor,) = gateway.admin("heavy")["executors"]
                if executor["state"] == "ready":
                    deadline = 0  # said hello before it was seen in its groups
                elif "/cpu-heavy" in last:
                    seen = last
            time.sleep(0.01)
        assert seen is not None, f"the replacement was not seen in its groups before its hello: {last}"
        groups = dict(line.split(":", 2)[1:] for line in seen.splitlines())
        cpu = next(path for controllers, path in groups.items() if "cpu" in controllers.split(","))
        memory = groups["memory"]
        assert cpu.endswith("/cpu-heavy") and memory.endswith("/cpu-heavy"), seen
    # Charged from its start, the weights take an executor over a limit below them: it cannot start.
    config = tmp_path / "config.toml"
    config.write_text(config.read_text().replace("memory_mb = 400", "memory_mb = 40"))
    with pytest.raises(RuntimeError, match=r"out of memory \(over its limit of 40 MB, memory_mb\)"), run_gateway(config):
        pass
