"""Clockwork's admission control (Section 5.2): refuse at arrival what no device can finish in time.

A request whose model asks for deadline dropping is refused before any work is done when it
cannot meet its deadline on any device even if started at once: now + l_device(rows) is past
its deadline for every device's profile. Without dropping it is admitted, served late, and
counted as a violation.
"""

from __future__ import annotations

from collections.abc import Iterable

from schedulers.profiles import LatencyProfile
from schedulers.request import Request


def admissible(request: Request, now: float, profiles: Iterable[LatencyProfile]) -> bool:
    return any(now + profile.latency_ms(request.rows) / 1000 <= request.deadline for profile in profiles)
