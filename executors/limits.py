"""What each executor may use: its CPU quota and memory limit, carried out by the kernel.

One group per executor and controller, all named the same way: ``gateway-<gateway pid>/<executor
id>``. Under cgroup v1 the group sits in each controller's own hierarchy (``/sys/fs/cgroup/cpu/...``
and ``/sys/fs/cgroup/memory/...``); under cgroup v2 it is one group, beside the gateway's own, with
both controllers enabled (a process can be in a single v2 group, so CPU and memory must share it).
A gateway removes its groups when it stops; one killed (SIGKILL, the OOM killer) cannot, and the
next gateway to make a group in the hierarchy removes what gateways no longer running left there.

- CPU: ``cpu.cfs_quota_us = cores x cpu.cfs_period_us`` (v1) or ``cpu.max = "<quota> <period>"``
  (v2), written to the running process, so fractional cores such as 0.3 are real and a resize
  needs no restart. Where no cgroup can be written the fallback pins the process to whole CPUs
  with CPU affinity (psutil); the ONNX Runtime thread count was fixed when the executor started.
- Memory: ``memory.limit_in_bytes`` (v1) or ``memory.max`` (v2). An executor over its limit is
  killed by the kernel's OOM killer and restarted like any crashed one; the group's OOM-kill count
  tells the log why it died. Docker executors get both limits from Docker instead
  (``cpu_quota``/``cpu_period``, ``mem_limit``; the container's ``State.OOMKilled``), with the same
  quota arithmetic (``cfs_bandwidth``).

What is enforced is not always what was granted, and the meters count what is enforced:
affinity rounds up to whole CPUs. ``Actuator.apply`` returns the cores really enforced.

The CFS period is 10 ms rather than the kernel's 100 ms: a process that spends its quota is
paused for the rest of the period, and at 100 ms that pause alone would break the tens-of-ms
SLAs served here (a 0.3-core executor could stall 70 ms). The kernel's smallest quota is 1 ms,
though, so at 10 ms no grant under 0.1 core could be enforced: a model idling at a floor of 0.05
core would hold 0.1. A grant under the period's least (``cfs_bandwidth``) gets that 1 ms quota
over a longer period instead, 1 ms every 20 ms for 0.05 core, up to the kernel's own 100 ms
(0.01 core); its pauses are longer, but at such a grant a request's own CPU time, stretched
twenty times and more, is what its response time is made of.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import psutil

from executors.names import safe_name

log = logging.getLogger("executors")

CFS_PERIOD_US = 10_000
# The kernel refuses a CFS quota under 1 ms (and so does Docker).
MIN_QUOTA_US = 1_000
# The longest period a grant under the period's least is given: the kernel's own default.
MAX_CFS_PERIOD_US = 100_000
CGROUP_ROOT = Path("/sys/fs/cgroup")
# A v1 hierarchy has this file at its root when the controller is mounted there.
_V1_PROBE = {"cpu": "cpu.cfs_quota_us", "memory": "memory.limit_in_bytes"}


# Far under a microsecond, far over the error of a product of cores and a period (0.29 core of
# 100,000 us is 28,999.999999999996 in floats).
FLOAT_ERROR_US = 1e-6


def cfs_bandwidth(cores: float, period_us: int) -> tuple[int, int]:
    """The CFS quota and period, in us, that enforce ``cores`` at ``period_us``: that period, or
    for a grant whose quota would be under the kernel's 1 ms there, the period that the 1 ms
    quota gives the grant in (at most ``MAX_CFS_PERIOD_US``, never shorter than ``period_us``)."""
    if cores * period_us < MIN_QUOTA_US:
        # Compared before dividing: 1 ms over a grant of a few denormal cores is infinite.
        longest = cores <= MIN_QUOTA_US / MAX_CFS_PERIOD_US
        period_us = max(period_us, MAX_CFS_PERIOD_US if longest else math.ceil(MIN_QUOTA_US / cores))
    # Rounded down (but for a float's error): rounded to nearest, three grants of 2/3 core that
    # filled a node of 2 were enforced as 2.0001.
    return max(MIN_QUOTA_US, math.floor(cores * period_us + FLOAT_ERROR_US)), period_us


def quota_cores(cores: float, period_us: int) -> float:
    """The cores the CFS bandwidth for ``cores`` really gives: the grant itself, down to 1 ms in
    the longer of ``MAX_CFS_PERIOD_US`` and ``period_us`` (0.01 core at the default period)."""
    quota, period = cfs_bandwidth(cores, period_us)
    return quota / period


# The inode of the kernel's first PID namespace (PROC_PID_INIT_INO): the host's, where a pid
# names one process of the machine.
INITIAL_PID_NAMESPACE = 0xEFFFFFFC


def pid_namespace() -> int:
    """The inode of this process's PID namespace."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return INITIAL_PID_NAMESPACE


def owner_tag() -> str:
    """What names this process in the folder of its groups and in its containers' names: its
    pid, or in a PID namespace of its own (a container) ``<pid>-ns<inode>``. Every pod of a
    DaemonSet runs the gateway as pid 1: two worker pods on one node of cgroup v1, which see the
    node's hierarchy, shared each model's group, one's quota the other's."""
    namespace = pid_namespace()
    return str(os.getpid()) if namespace == INITIAL_PID_NAMESPACE else f"{os.getpid()}-ns{namespace}"


def gateway_folder() -> str:
    """This gateway's folder in a hierarchy: ``gateway-<owner_tag>``."""
    return f"gateway-{owner_tag()}"


def group_name(executor_id: str) -> str:
    """The one naming scheme of every executor's group, relative to a hierarchy's root."""
    return f"{gateway_folder()}/{safe_name(executor_id)}"


@dataclass(frozen=True)
class Hierarchy:
    """Where this gateway's groups of one controller (``cpu`` or ``memory``) live."""

    controller: str
    v2: bool
    root: Path  # the parent of gateway-<pid>/

    @classmethod
    def find(cls, controller: str, root: Path = CGROUP_ROOT) -> Hierarchy:
        """The hierarchy that carries ``controller``; OSError where there is none."""
        if (root / controller / _V1_PROBE[controller]).exists():
            return cls(controller, False, root / controller)
        controllers = root / "cgroup.controllers"
        if controllers.exists() and controller in controllers.read_text().split():
            # Beside the gateway's own group: v2 lets no group hold processes and give controllers to children.
            own = Path(Path("/proc/self/cgroup").read_text().strip().split("::", 1)[1].lstrip("/"))
            return cls(controller, True, root / own.parent if own.name else root)
        raise OSError(f"no cgroup v1 {controller} controller at {root / controller} and no cgroup v2 one at {root}")

    @property
    def name(self) -> str:
        return "cgroup-v2" if self.v2 else "cgroup-v1"

    @property
    def base(self) -> Path:
        return self.root / gateway_folder()

    def prepare(self) -> None:
        """Make ``gateway-<pid>/`` (raises OSError where it cannot be written); the first time in
        this process, remove what gateways no longer running left here."""
        self.sweep()
        self.base.mkdir(exist_ok=True)
        if self.v2:
            for parent in (self.root, self.base):
                enabled = (parent / "cgroup.subtree_control").read_text().split()
                if self.controller not in enabled:
                    (parent / "cgroup.subtree_control").write_text(f"+{self.controller}")

    def group(self, executor_id: str) -> ExecutorCgroup:
        return ExecutorCgroup(self, executor_id)

    def remove(self) -> None:
        """Remove every group left (those still holding a process stay) and then ``gateway-<pid>/``."""
        _remove_groups(self.base)

    def sweep(self) -> None:
        """The first time in this process: remove the groups gateways no longer running left here."""
        if self.root not in _SWEPT:
            _SWEPT.add(self.root)
            if removed := self.remove_ended_gateways():
                log.info("removed the %s groups of %d gateway(s) no longer running", self.controller, removed)

    def remove_ended_gateways(self) -> int:
        """Remove the groups of gateways that are no longer running: one killed (SIGKILL, the
        OOM killer) cannot remove its own. A group still holding a process stays, and so do the
        groups of any running process of that pid. Returns how many gateways' groups went."""
        removed = 0
        for base in self.root.glob("gateway-*/"):
            if gateway_ended(base.name.removeprefix("gateway-")) and _remove_groups(base):
                removed += 1
        return removed


def sweep_ended_gateways(root: Path = CGROUP_ROOT) -> None:
    """Remove the cpu and memory groups that gateways no longer running left. A hierarchy was
    swept only where this gateway made a group: one without ``memory_mb`` left a killed gateway's
    memory groups for good."""
    for controller in ("cpu", "memory"):
        with contextlib.suppress(OSError):
            Hierarchy.find(controller, root).sweep()


def process_ended(pid: str) -> bool:
    """Whether ``pid``, read from a leftover's name, is a process no longer running (False for
    a name that holds no pid): what a gateway leaves behind under its pid is removed then."""
    return pid.isdigit() and not psutil.pid_exists(int(pid))


def gateway_ended(tag: str) -> bool:
    """Whether the process of a leftover folder of groups (its ``owner_tag``) no longer runs.
    False for one of another PID namespace than this process's: whether its pid runs cannot be
    told from here (a gateway in a namespace of its own took the host's gateways, whose pids it
    cannot see, for ended)."""
    pid, _, namespace = tag.partition("-ns")
    if not (namespace or str(INITIAL_PID_NAMESPACE)).isdigit():
        return False
    return int(namespace or INITIAL_PID_NAMESPACE) == pid_namespace() and process_ended(pid)


# The hierarchies this process has removed ended gateways' groups from (Hierarchy.prepare).
_SWEPT: set[Path] = set()


def _remove_groups(base: Path) -> bool:
    """Remove the groups under ``base`` and then ``base``; those still holding a process stay.
    Whether ``base`` went."""
    for group in sorted(base.glob("*/"), reverse=True):
        with contextlib.suppress(OSError):
            group.rmdir()
    try:
        base.rmdir()
    except OSError:
        return False
    return True


class ExecutorCgroup:
    """One executor's group in one hierarchy: made on first use, removed by ``remove``."""

    def __init__(self, hierarchy: Hierarchy, executor_id: str):
        self.hierarchy = hierarchy
        self.path = hierarchy.root / group_name(executor_id)

    def _ensure(self) -> Path:
        if not self.path.is_dir():
            self.hierarchy.prepare()
            self.path.mkdir(exist_ok=True)
        return self.path

    def add(self, pid: int) -> None:
        """Move ``pid`` into the group; cgroup.procs moves every thread, and later threads stay in it."""
        (self._ensure() / "cgroup.procs").write_text(str(pid))

    def set_cpu_quota(self, cores: float, period_us: int = CFS_PERIOD_US) -> float:
        """Cap the group at ``cores``; returns the cores really enforced (see ``quota_cores``)."""
        group, (quota, period_us) = self._ensure(), cfs_bandwidth(cores, period_us)
        if self.hierarchy.v2:
            (group / "cpu.max").write_text(f"{quota} {period_us}")
        else:
            period = group / "cpu.cfs_period_us"
            if period.read_text().strip() != str(period_us):
                period.write_text(str(period_us))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        return quota / period_us

    def set_memory_limit(self, limit_bytes: int) -> None:
        group = self._ensure()
        if self.hierarchy.v2:
            (group / "memory.max").write_text(str(limit_bytes))
            with contextlib.suppress(OSError):
                (group / "memory.swap.max").write_text("0")
        else:
            (group / "memory.limit_in_bytes").write_text(str(limit_bytes))
            # Without swap accounting this file is absent; with it, swap must not dodge the limit.
            with contextlib.suppress(OSError):
                (group / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))

    def oom_kills(self) -> int:
        """How many processes of the group the OOM killer has ended (memory groups only)."""
        name = "memory.events" if self.hierarchy.v2 else "memory.oom_control"
        try:
            rows = (self.path / name).read_text().splitlines()
        except OSError:
            return 0
        counts = dict(row.split() for row in rows if len(row.split()) == 2)
        return int(counts.get("oom_kill", 0))

    def remove(self) -> None:
        """Remove the group, and ``gateway-<pid>/`` once it is empty (its processes must be gone)."""
        for group in (self.path, self.path.parent):
            with contextlib.suppress(OSError):
                group.rmdir()


def unavailable_reason(controller: str, root: Path = CGROUP_ROOT) -> str | None:
    """Why this gateway cannot make groups of ``controller`` here, or None when it can."""
    try:
        hierarchy = Hierarchy.find(controller, root)
        probe = hierarchy.group("probe")
        try:
            if controller == "cpu":
                probe.set_cpu_quota(1.0)
            else:
                probe.set_memory_limit(64 << 20)
        finally:
            probe.remove()
    except OSError as error:
        return f"no writable {controller} cgroup here ({error})"
    return None


class Actuator(Protocol):
    """Carries out the cores granted to running executor processes, without restarting them."""

    name: str

    def attach(self, executor_id: str, pid: int) -> None:
        """Put ``pid`` under the limit that ``apply`` set for the executor before."""
        ...

    def detach(self, executor_id: str) -> None:
        """Forget a stopped executor (its process gone): its group is removed."""
        ...

    def apply(self, executor_id: str, cores: float) -> float:
        """Give the executor ``cores``; returns the cores really enforced."""
        ...

    def enforced(self, cores: float) -> float:
        """The cores ``apply`` would enforce for ``cores``."""
        ...

    def close(self) -> None: ...


class CgroupActuator:
    """A CPU quota per executor in its cpu group (v1 or v2)."""

    def __init__(self, hierarchy: Hierarchy, period_us: int = CFS_PERIOD_US):
        self.hierarchy, self.period_us = hierarchy, period_us
        self.name = hierarchy.name
        hierarchy.prepare()

    def attach(self, executor_id: str, pid: int) -> None:
        self.hierarchy.group(executor_id).add(pid)

    def detach(self, executor_id: str) -> None:
        self.hierarchy.group(executor_id).remove()

    def apply(self, executor_id: str, cores: float) -> float:
        return self.hierarchy.group(executor_id).set_cpu_quota(cores, self.period_us)

    def enforced(self, cores: float) -> float:
        return quota_cores(cores, self.period_us)

    def close(self) -> None:
        self.hierarchy.remove()


class AffinityActuator:
    """The fallback: the process is pinned to ceil(cores) of the CPUs the gateway may use, those
    the fewest other executors are pinned to (each executor on the first CPUs put every executor
    of a core or less on CPU 0: the cores they were counted could not all be used)."""

    name = "affinity"

    def __init__(self) -> None:
        self._cpus = sorted(psutil.Process().cpu_affinity() or range(os.cpu_count() or 1))
        # Each executor's process as attached: a psutil.Process knows its own start, so a pid the
        # system gave to another process since (the executor restarted) is not pinned.
        self._processes: dict[str, psutil.Process] = {}
        self._pinned: dict[str, list[int]] = {}  # executor -> the CPUs it was given

    def attach(self, executor_id: str, pid: int) -> None:
        """Pin ``pid`` to the CPUs its executor was given (``apply`` comes first, as a quota is
        written before a process joins its group)."""
        try:
            self._processes[executor_id] = psutil.Process(pid)
        except psutil.Error:
            self._processes.pop(executor_id, None)
            return
        self._pin(executor_id)

    def _pin(self, executor_id: str) -> None:
        process, cpus = self._processes.get(executor_id), self._pinned.get(executor_id)
        if process is not None and cpus is not None:
            with contextlib.suppress(psutil.Error):
                if process.is_running():  # not its pid given to another process since it ended
                    process.cpu_affinity(cpus)

    def detach(self, executor_id: str) -> None:
        self._processes.pop(executor_id, None)
        self._pinned.pop(executor_id, None)

    def enforced(self, cores: float) -> float:
        return float(min(len(self._cpus), max(1, math.ceil(cores - 1e-9))))

    def apply(self, executor_id: str, cores: float) -> float:
        count = int(self.enforced(cores))
        others = Counter(cpu for other, cpus in self._pinned.items() if other != executor_id for cpu in cpus)
        cpus = sorted(sorted(self._cpus, key=lambda cpu: (others[cpu], cpu))[:count])
        self._pinned[executor_id] = cpus
        self._pin(executor_id)
        return float(count)

    def close(self) -> None:
        self._processes.clear()
        self._pinned.clear()


def make_actuator(kind: str = "auto", period_us: int = CFS_PERIOD_US, root: Path = CGROUP_ROOT) -> Actuator:
    """The actuator asked for, or for "auto" the best this host allows; the choice is logged once."""
    problem = ""
    if kind in ("auto", "cgroup"):
        try:
            actuator = CgroupActuator(Hierarchy.find("cpu", root), period_us)
        except OSError as error:
            problem = str(error)
        else:
            log.info("cores are enforced with %s CPU quotas (CFS period %d us)", actuator.name, period_us)
            return actuator
        if kind == "cgroup":
            raise RuntimeError("no cgroup CPU controller can be written here: " + problem)
    if kind == "auto":
        log.warning("cgroups cannot be written (%s); falling back to CPU affinity: cores are rounded up to whole CPUs", problem)
    return AffinityActuator()
