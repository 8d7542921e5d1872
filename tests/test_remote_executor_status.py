"""A dispatcher's view of a worker's executor follows the worker's status frames (gateway/cluster/link.py)."""

from __future__ import annotations

from gateway.cluster.link import RemoteExecutor, WorkerLink
from tests.helpers import free_port


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
