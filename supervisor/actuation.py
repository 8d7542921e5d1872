"""Carrying out the granted cores on running executor processes, without restarting them.

- cgroup v1 (``/sys/fs/cgroup/cpu``): a group per executor under ``gateway-<pid>/``, with
  ``cpu.cfs_quota_us = cores x cpu.cfs_period_us``, so fractional cores such as 0.3 are real.
- cgroup v2: the same with ``cpu.max = "<quota> <period>"`` in a group beside the gateway's own.
- CPU affinity (psutil): the fallback where no cgroup can be written: the process is pinned to
  ceil(cores) CPUs; the ONNX Runtime thread count was fixed when the executor started.

The CFS period is 10 ms rather than the kernel's 100 ms: a process that spends its quota is
paused for the rest of the period, and at 100 ms that pause alone would break the tens-of-ms
SLAs served here (a 0.3-core executor could stall 70 ms).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from pathlib import Path
from typing import Protocol

import psutil

log = logging.getLogger("supervisor")

CFS_PERIOD_US = 10_000
# The kernel refuses a CFS quota under 1 ms.
MIN_QUOTA_US = 1_000
CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")


class Actuator(Protocol):
    name: str

    def attach(self, executor_id: str, pid: int) -> None: ...
    def apply(self, executor_id: str, cores: float) -> None: ...
    def close(self) -> None: ...


def quota_us(cores: float, period_us: int) -> int:
    return max(MIN_QUOTA_US, round(cores * period_us))


class _CgroupActuator:
    """A cgroup per executor under ``base``; the subclasses say how a group's quota is written."""

    name = "cgroup"

    def __init__(self, base: Path, period_us: int):
        self.base, self.period_us = base, period_us
        self.base.mkdir(exist_ok=True)

    def _group(self, executor_id: str) -> Path:
        group = self.base / executor_id
        if not group.exists():
            group.mkdir()
            self._configure(group)
        return group

    def _configure(self, group: Path) -> None:
        """Settings a new group needs before its first quota."""

    def attach(self, executor_id: str, pid: int) -> None:
        # cgroup.procs moves every thread of the process; threads made later stay in the group.
        (self._group(executor_id) / "cgroup.procs").write_text(str(pid))

    def close(self) -> None:
        for group in sorted(self.base.glob("*/"), reverse=True):
            with contextlib.suppress(OSError):
                group.rmdir()
        with contextlib.suppress(OSError):
            self.base.rmdir()


class CgroupV1Actuator(_CgroupActuator):
    name = "cgroup-v1"

    def __init__(self, root: Path = CGROUP_V1_CPU, period_us: int = CFS_PERIOD_US):
        super().__init__(root / f"gateway-{os.getpid()}", period_us)

    def _configure(self, group: Path) -> None:
        (group / "cpu.cfs_period_us").write_text(str(self.period_us))

    def apply(self, executor_id: str, cores: float) -> None:
        (self._group(executor_id) / "cpu.cfs_quota_us").write_text(str(quota_us(cores, self.period_us)))


class CgroupV2Actuator(_CgroupActuator):
    name = "cgroup-v2"

    def __init__(self, root: Path = CGROUP_V2, period_us: int = CFS_PERIOD_US):
        own = Path((Path("/proc/self/cgroup").read_text().strip().split("::", 1)[1]).lstrip("/"))
        parent = root / own.parent if own.name else root
        super().__init__(parent / f"gateway-{os.getpid()}", period_us)
        (parent / "cgroup.subtree_control").write_text("+cpu")
        (self.base / "cgroup.subtree_control").write_text("+cpu")

    def apply(self, executor_id: str, cores: float) -> None:
        (self._group(executor_id) / "cpu.max").write_text(f"{quota_us(cores, self.period_us)} {self.period_us}")


class AffinityActuator:
    name = "affinity"

    def __init__(self) -> None:
        self._cpus = sorted(psutil.Process().cpu_affinity() or range(os.cpu_count() or 1))
        self._pids: dict[str, int] = {}

    def attach(self, executor_id: str, pid: int) -> None:
        self._pids[executor_id] = pid

    def apply(self, executor_id: str, cores: float) -> None:
        pid = self._pids.get(executor_id)
        if pid is None:
            return
        count = min(len(self._cpus), max(1, math.ceil(cores - 1e-9)))
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).cpu_affinity(self._cpus[:count])

    def close(self) -> None:
        self._pids.clear()


def make_actuator(kind: str = "auto", period_us: int = CFS_PERIOD_US) -> Actuator:
    """The actuator asked for, or for "auto" the best this host allows; the choice is logged once."""
    attempts: list[str] = []
    if kind in ("auto", "cgroup"):
        for factory in (CgroupV1Actuator, CgroupV2Actuator):
            try:
                if factory is CgroupV1Actuator and not (CGROUP_V1_CPU / "cpu.cfs_quota_us").exists():
                    raise OSError(f"{CGROUP_V1_CPU} has no cpu controller")
                if factory is CgroupV2Actuator and not (CGROUP_V2 / "cgroup.controllers").exists():
                    raise OSError("no cgroup v2 hierarchy")
                actuator = factory(period_us=period_us)
                log.info("cores are enforced with %s CPU quotas (CFS period %d us)", actuator.name, period_us)
                return actuator
            except OSError as error:
                attempts.append(f"{factory.name}: {error}")
        if kind == "cgroup":
            raise RuntimeError("no cgroup CPU controller can be written here: " + "; ".join(attempts))
    actuator = AffinityActuator()
    if kind == "auto":
        log.warning(
            "cgroups cannot be written (%s); falling back to CPU affinity: cores are rounded up to whole CPUs",
            "; ".join(attempts),
        )
    return actuator
