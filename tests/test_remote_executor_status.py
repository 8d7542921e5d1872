"""A dispatcher's view of a worker's executor follows the worker's status frames (gateway/cluster/link.py)."""

from __future__ import annotations

import json
import shutil

import pytest

from gateway.cluster.link import RemoteExecutor, WorkerLink
from gateway.cluster.worker import WorkerNode
from tests.helpers import free_port
from tests.test_control_core import gateway_config, model


def test_a_status_after_a_restart_brings_the_executors_provider_and_warm_up():
    """The dispatcher's view of a worker's executor follows its status frames: a GPU executor
    that restarted on the CPU provider (CUDA's failed) and warmed nothing is shown so, where its
    hello's provider and warm-up stayed for the life of the link."""
    link = WorkerLink(
        f"127.0.0.1:{free_port()}",
        "a-token-of-sixteen-chars",
        "dispatcher",
        heartbeat_timeout_s=1.0,
        on_change=lambda *_: None,
    )
    warmed = {"mlp": {"batches": [1, 2, 4], "ms": 812.0}}
    hello = {
        "id": "gpu-0",
        "device": "gpu:0",
        "models": {"mlp": {}},
        "state": "ready",
        "provider": "CUDAExecutionProvider",
        "warmed": warmed,
    }
    executor = RemoteExecutor(link, hello)
    assert (executor.provider, executor.warmed) == ("CUDAExecutionProvider", warmed)
    executor.update(
        {"id": "gpu-0", "state": "ready", "cores": 0.0, "enforced_cores": 0.0, "provider": "CPUExecutionProvider", "warmed": {}}
    )
    assert (executor.provider, executor.warmed) == ("CPUExecutionProvider", {})
    assert executor.describe()["provider"] == "CPUExecutionProvider"
    # A status without them (a worker of an earlier version) leaves them as they were.
    executor.update({"id": "gpu-0", "state": "restarting"})
    assert (executor.provider, executor.worker_state) == ("CPUExecutionProvider", "restarting")


class FrameRecorder:
    """A dispatcher's connection as the worker writes to it: each frame's header, decoded."""

    def __init__(self) -> None:
        self.headers: list[dict] = []

    def is_closing(self) -> bool:
        return False

    def writelines(self, pieces: list[bytes]) -> None:
        self.headers.append(json.loads(pieces[1]))


def test_the_heartbeat_leaves_out_what_only_a_start_of_the_executor_changes():
    """The status of every control period carries the executors' state and cores; their
    provider and warm-up go out only with a change of state (and in the hello), not once a
    period to every dispatcher."""
    worker = WorkerNode(gateway_config(model("m", cores=0.5)))
    try:
        dispatcher = FrameRecorder()
        worker.sessions[1] = dispatcher  # type: ignore[assignment]
        worker.node.cpu["m"].provider = "CPUExecutionProvider"
        worker._on_period(1.0, {}, {})
        worker._on_executor_change("cpu-m")
        heartbeat, change = (header["executors"] for header in dispatcher.headers)
        assert [sorted(e) for e in heartbeat] == [["cores", "enforced_cores", "id", "state"]]
        assert [(e["id"], e["provider"], e["warmed"]) for e in change] == [("cpu-m", "CPUExecutionProvider", {})]
        # The process's fields that a node's admin API gives, for a dispatcher's (they were missing there).
        process = worker.node.cpu["m"]
        assert [(e["threads"], e["pid"], e["restarts"]) for e in change] == [(process.threads, process.pid, process.restarts)]
        seen = RemoteExecutor(
            WorkerLink("127.0.0.1:9", "a-token-of-sixteen-chars", "d", heartbeat_timeout_s=1.0, on_change=print),
            {**change[0], "device": "cpu"},
        )
        assert {k: seen.describe()[k] for k in ("threads", "pid", "restarts")} == {
            "threads": process.threads,
            "pid": process.pid,
            "restarts": process.restarts,
        }
        assert worker.hello()["executors"][0]["provider"] == "CPUExecutionProvider"
    finally:
        worker.node.close()
        shutil.rmtree(worker._socket_dir, ignore_errors=True)


class OneAtATime:
    """An executor that runs its batches one after another, in the order sent, each taking
    ``seconds`` (``None``: it hangs)."""

    id = "cpu-m"

    def __init__(self, seconds: float | None):
        import asyncio

        self.seconds, self.turn = seconds, asyncio.Lock()

    async def infer(self, model, tensors, latest):
        import asyncio

        async with self.turn:
            if self.seconds is None:
                await asyncio.Event().wait()
            await asyncio.sleep(self.seconds)
            return {}, self.seconds * 1000


async def test_a_batch_waiting_behind_another_on_its_executor_is_not_taken_for_a_hang():
    """Two dispatchers sharing a worker each sent one batch of 0.3 s to an executor with a hang
    timeout of 0.5 s: the second, timed from its send, waited 0.3 s behind the first and was
    taken for a hang at 0.5 s; the healthy executor was killed, with every batch on it. Timed from
    when it begins, a hung executor is still found out."""
    import asyncio
    import dataclasses

    worker = WorkerNode(gateway_config(model("m", cores=0.5)))
    try:
        worker.config.models["m"] = dataclasses.replace(worker.config.models["m"], hang_timeout_ms=500)
        executor = OneAtATime(0.3)
        both = await asyncio.gather(*(worker._run(executor, "m", {}, float("inf")) for _ in range(2)))
        assert [ms for _, ms in both] == [300.0, 300.0]
        hung = OneAtATime(None)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(worker._run(hung, "m", {}, float("inf")), 5)
    finally:
        worker.node.close()
        shutil.rmtree(worker._socket_dir, ignore_errors=True)
