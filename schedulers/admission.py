"""Clockwork's admission control (Section 5.2): refuse at arrival what no device can finish in time.

A request whose model asks for deadline dropping is refused before any work is done when it
cannot meet its deadline on any device even if started at once: now + l_device(rows) is past
its deadline on the fastest device. Without dropping it is admitted, served late, and counted
as a violation.
"""

from __future__ import annotations

from schedulers.request import Request


def admissible(request: Request, now: float, fastest_ms: float) -> bool:
    """Whether ``request`` can finish in time on a device that takes ``fastest_ms`` for it, started now."""
    return now + fastest_ms / 1000 <= request.deadline
