"""The folder of a gateway's executor sockets: one per gateway process, in the temporary directory.

Each executor connects to its gateway over a Unix socket in that folder. A gateway removes the
folder when it stops; one killed (SIGKILL, the OOM killer) cannot. The folder is named after the
process that made it (``gateway-<pid>-<random>``), so that the next gateway on the machine can
remove what gateways no longer running left, as it does with their cgroups (executors/limits.py)
and containers (executors/container.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import tempfile
from pathlib import Path

from executors.limits import INITIAL_PID_NAMESPACE, pid_namespace, process_ended

log = logging.getLogger("executors")


def socket_folder(kind: str = "gateway", root: Path | None = None) -> Path:
    """Make this process's socket folder, ``<kind>-<pid>-<random>`` under ``root`` (the temporary
    directory), after removing those of ``kind`` whose process is no longer running."""
    root = Path(tempfile.gettempdir()) if root is None else root
    if removed := remove_ended(kind, root):
        log.info("removed the socket folders of %d %s process(es) no longer running", removed, kind)
    # The pid alone, even in a PID namespace of its own: a Unix socket's path has room for 107
    # bytes, and the executors' ids (executors/names.py) take what the folder leaves.
    folder = Path(tempfile.mkdtemp(prefix=f"{kind}-{os.getpid()}-", dir=root))
    namespace = pid_namespace()
    if namespace != INITIAL_PID_NAMESPACE:
        # Its pid is another namespace's: a gateway on the host would take it for one of its own
        # that ended, and remove the folder of a gateway still running. A folder that holds more
        # than sockets is never swept.
        (folder / NAMESPACE_FILE).write_text(f"{namespace}\n")
    return folder


# The file that marks the socket folder of a process in a PID namespace of its own.
NAMESPACE_FILE = "pid-namespace"


def remove_ended(kind: str, root: Path) -> int:
    """Remove the socket folders of ``kind`` under ``root`` whose process is no longer running. A
    folder holding anything but sockets stays (it is not one of ours). How many went. Nothing is
    removed by a process in a PID namespace of its own (a container): the pids in the names may
    be another namespace's, out of its sight (one took every gateway's folder in a /tmp it
    shared for an ended one's, and their executors could not restart); its /tmp is its own."""
    if pid_namespace() != INITIAL_PID_NAMESPACE:
        return 0
    removed = 0
    for folder in root.glob(f"{kind}-*-*/"):
        if not process_ended(folder.name.removeprefix(f"{kind}-").split("-", 1)[0]):
            continue
        with contextlib.suppress(OSError):
            entries = list(folder.iterdir())
            if all(stat.S_ISSOCK(entry.lstat().st_mode) for entry in entries):
                for entry in entries:
                    entry.unlink()
                folder.rmdir()
                removed += 1
    return removed
