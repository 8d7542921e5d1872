"""SIGINT and SIGTERM heard from a server's first moment, and a start that a signal cuts short.

``gateway serve`` and ``gateway worker`` make their executors' groups and socket folder as they
build their executors, before anything starts. A signal that came before its handler was set
killed the process by it (status -15, or a traceback for SIGINT) and left them behind: the
handlers are set before anything is made, and a start a signal interrupts is undone.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any


def stop_on_signals() -> asyncio.Event:
    """An event that SIGINT or SIGTERM sets, on the running loop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def start_unless_stopped(
    start: Coroutine[Any, Any, None], stop: asyncio.Event, undo: Callable[[], Awaitable[None]]
) -> bool:
    """Run ``start``; where ``stop`` is set first, cancel it and ``undo`` what it began: False.

    A start that failed is undone too, then raises as it did: one that failed once its executors
    were up (a model with no inputs, a worker's port taken) left their groups and socket folder.
    """
    starting = asyncio.ensure_future(start)
    if not stop.is_set():
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
    if starting.done() and not stop.is_set():
        if starting.exception() is not None:
            await undo()
        starting.result()
        return True
    starting.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await starting
    await undo()
    return False
