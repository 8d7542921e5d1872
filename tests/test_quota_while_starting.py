"""An executor's process is under its cores from its launch, not from its hello.

A process executor is put in its CPU group as soon as it is launched, so that its start-up runs
under its quota; its hello comes once its models are loaded, a second or more later. Two faults
of that moment: cores set while it started (the control loop moving a restarting model's cores
to another) were written to its group only at its hello, so its group kept the last run's quota
while the other model already had the cores (3.4 cores of quota on a node of 2); and a new group,
which has no quota (-1), took the process before its quota was written.

The executor here is a process executor whose process never says hello: it stays "starting".
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from executors.limits import Actuator, make_actuator, unavailable_reason
from executors.process import ProcessExecutor

needs_cgroup = pytest.mark.skipif(unavailable_reason("cpu") is not None, reason=unavailable_reason("cpu") or "")


def quota_cores(group: Path) -> float:
    """The cores the group's CFS quota allows (cgroup v2's cpu.max, or v1's two files)."""
    if (group / "cpu.max").exists():
        quota, period = (group / "cpu.max").read_text().split()
    else:
        quota, period = (group / "cpu.cfs_quota_us").read_text(), (group / "cpu.cfs_period_us").read_text()
    return int(quota) / int(period)


class SilentExecutor(ProcessExecutor):
    """A process executor whose process sleeps and never connects: it stays starting."""

    def worker_arguments(self, connect: str, model_paths: dict[str, Path] | None = None) -> list[str]:
        return ["-c", "import time; time.sleep(60)"]


class Recorded:
    """An actuator that writes down, in order, what it was asked to do."""

    def __init__(self, actuator: Actuator):
        self.actuator, self.name, self.calls = actuator, actuator.name, []

    def attach(self, executor_id: str, pid: int) -> None:
        self.calls.append("attach")
        self.actuator.attach(executor_id, pid)

    def detach(self, executor_id: str) -> None:
        self.actuator.detach(executor_id)

    def apply(self, executor_id: str, cores: float) -> float:
        self.calls.append(f"apply {cores:g}")
        return self.actuator.apply(executor_id, cores)

    def enforced(self, cores: float) -> float:
        return self.actuator.enforced(cores)

    def close(self) -> None:
        self.actuator.close()


@needs_cgroup
async def test_cores_set_while_an_executor_starts_reach_its_group_at_once(tmp_path):
    actuator = make_actuator("cgroup")
    recorded = Recorded(actuator)
    executor = SilentExecutor(
        "cpu-m", {"m": Path("m.onnx")}, device="cpu", threads=1, cores=1.5, socket_dir=tmp_path, actuator=recorded
    )
    group = actuator.hierarchy.group("cpu-m").path
    starting = asyncio.ensure_future(executor.start())
    try:
        procs = group / "cgroup.procs"
        for _ in range(500):
            if executor.state == "starting" and procs.exists() and procs.read_text().split():
                break
            await asyncio.sleep(0.01)
        assert procs.read_text().split() == [str(executor.pid)]
        # The quota was in the group before the process: a new group has none.
        assert recorded.calls == ["apply 1.5", "attach"], recorded.calls
        assert quota_cores(group) == pytest.approx(1.5)

        executor.set_cores(0.1)
        assert executor.state == "starting"
        assert quota_cores(group) == pytest.approx(0.1)
        assert executor.enforced_cores == pytest.approx(0.1)
    finally:
        starting.cancel()
        await executor.stop()
        actuator.close()
    assert not group.exists()
