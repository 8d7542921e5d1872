"""The folder of a gateway's executor sockets: one per gateway process, in the temporary directory.

Each executor connects to its gateway over a Unix socket in that folder. A gateway removes the
folder when it stops; one killed (SIGKILL, the OOM killer) cannot. The folder is named after the
process that made it (``gateway-<pid>-<random>``, ``gateway-<pid>-ns<inode>-<random>`` in a PID
namespace of its own), so that the next gateway on the machine can
remove what gateways no longer running left, as it does with their cgroups (executors/limits.py)
and containers (executors/container.py).
"""

from __future__ import annotations

import contextlib
import logging
import stat
import tempfile
from pathlib import Path

from executors.limits import gateway_ended, owner_tag

log = logging.getLogger("executors")


def socket_folder(kind: str = "gateway", root: Path | None = None) -> Path:
    """Make this process's socket folder, ``<kind>-<pid>-<random>`` under ``root`` (the temporary
    directory), after removing those of ``kind`` whose process is no longer running."""
    root = Path(tempfile.gettempdir()) if root is None else root
    if removed := remove_ended(kind, root):
        log.info("removed the socket folders of %d %s process(es) no longer running", removed, kind)
    return Path(tempfile.mkdtemp(prefix=f"{kind}-{owner_tag()}-", dir=root))


def _owner(name: str) -> str:
    """The ``owner_tag`` in a folder's name after its kind: ``PID-RANDOM`` or ``PID-nsINODE-RANDOM``."""
    parts = name.split("-")
    return "-".join(parts[:2]) if len(parts) >= 3 and parts[1].startswith("ns") else parts[0]


def remove_ended(kind: str, root: Path) -> int:
    """Remove the socket folders of ``kind`` under ``root`` whose process is no longer running. A
    folder holding anything but sockets stays (it is not one of ours). How many went."""
    removed = 0
    for folder in root.glob(f"{kind}-*-*/"):
        if not gateway_ended(_owner(folder.name.removeprefix(f"{kind}-"))):
            continue
        with contextlib.suppress(OSError):
            entries = list(folder.iterdir())
            if all(stat.S_ISSOCK(entry.lstat().st_mode) for entry in entries):
                for entry in entries:
                    entry.unlink()
                folder.rmdir()
                removed += 1
    return removed
