"""A memory limit per executor process, carried out by the kernel's memory cgroup.

An executor over its limit is killed by the kernel's OOM killer, and supervision restarts it
like any crashed executor; the group's OOM-kill count tells the log why it died. cgroup v1
(``/sys/fs/cgroup/memory``: ``memory.limit_in_bytes``, ``memory.oom_control``) and v2
(``memory.max``, ``memory.events``) are both handled. Docker executors get the same limit from
Docker (``mem_limit``; the container's ``State.OOMKilled``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

CGROUP_V1_MEMORY = Path("/sys/fs/cgroup/memory")
CGROUP_V2 = Path("/sys/fs/cgroup")


class MemoryLimit:
    def __init__(self, executor_id: str, limit_mb: float):
        self.limit_bytes = int(limit_mb * 1024 * 1024)
        self.v1 = CGROUP_V1_MEMORY.is_dir()
        root = CGROUP_V1_MEMORY if self.v1 else CGROUP_V2
        self.group = root / f"gateway-{os.getpid()}-memory" / executor_id

    def attach(self, pid: int) -> None:
        """Put ``pid`` under the limit (raises OSError where no memory cgroup can be written)."""
        self.group.mkdir(parents=True, exist_ok=True)
        if self.v1:
            (self.group / "memory.limit_in_bytes").write_text(str(self.limit_bytes))
            # Without swap accounting this file is absent; with it, swap must not dodge the limit.
            with contextlib.suppress(OSError):
                (self.group / "memory.memsw.limit_in_bytes").write_text(str(self.limit_bytes))
        else:
            (self.group / "memory.max").write_text(str(self.limit_bytes))
            with contextlib.suppress(OSError):
                (self.group / "memory.swap.max").write_text("0")
        (self.group / "cgroup.procs").write_text(str(pid))

    def oom_kills(self) -> int:
        """How many processes of the group the OOM killer has ended."""
        name = "memory.oom_control" if self.v1 else "memory.events"
        try:
            rows = (self.group / name).read_text().splitlines()
        except OSError:
            return 0
        counts = dict(row.split() for row in rows if len(row.split()) == 2)
        return int(counts.get("oom_kill", 0))

    def close(self) -> None:
        for group in (self.group, self.group.parent):
            with contextlib.suppress(OSError):
                group.rmdir()
