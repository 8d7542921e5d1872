"""An executor's id as the name of its socket, its cgroups and its container; the variable that
tells a process executor its gateway's pid.

A model's name may hold any letter (``[\\w.-]``, 64 characters), and an executor's id holds the
name. Those names are not as free: a Unix socket's whole path is at most 107 bytes, a file name
255 bytes, and a container's name only ``[a-zA-Z0-9][a-zA-Z0-9_.-]*``. Thirty CJK letters (90
bytes) overflowed the socket's path at start, and a Docker container would refuse any of them.
"""

from __future__ import annotations

import hashlib
import re

# An id kept as it is: short ASCII that every one of those names takes as it stands. 72 bytes
# leaves the socket's path 35 for its folder (/tmp/gateway-worker-<pid>-<random>/ is about 33).
_KEPT_AS_IS = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,71}")
_OTHER = re.compile(r"[^A-Za-z0-9_.-]")


def safe_name(executor_id: str) -> str:
    """``executor_id`` where it is short ASCII; otherwise what ASCII it has and a digest of the
    whole, so that two ids never share a name and the name still says whose it is."""
    if _KEPT_AS_IS.fullmatch(executor_id):
        return executor_id
    digest = hashlib.sha256(executor_id.encode()).hexdigest()[:16]
    kept = _OTHER.sub("", executor_id)[:40]
    return f"x{kept}-{digest}"


# The gateway's pid, in the environment of a process executor it started (executors/process.py):
# an executor whose parent is another has outlived its gateway (executors/worker.py).
PARENT_PID_VARIABLE = "GATEWAY_EXECUTOR_PARENT"
