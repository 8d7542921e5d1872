"""The gateway's end of an executor's connection (executors/connection.py) when a batch's send
is cut short: by its task's cancellation while the socket is full (its reply stayed in the table
of those in flight, and when the executor went away its failure was set on a reply nobody would
read: asyncio's "Future exception was never retrieved", in a soak test's gateway log after an
executor was killed while clients went away), or by the executor hanging up meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
from typing import Any

import numpy as np
import pytest

from executors.connection import ExecutorConnection, ExecutorFailed

# Far more than a socket pair and the stream's buffers hold: the send waits on drain().
LARGE = {"x": np.zeros(4 << 20, dtype=np.float32)}


@contextlib.asynccontextmanager
async def connection_to_a_silent_executor():
    """A connection whose executor end reads nothing (its socket fills), and that end's writer."""
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=ours)
    _, their_writer = await asyncio.open_connection(sock=theirs)
    connection = ExecutorConnection(reader, writer, {"kind": "hello"})
    try:
        yield connection, their_writer
    finally:
        await connection.close()
        their_writer.close()


@pytest.fixture
async def unread_failures():
    """What asyncio reports, from the test's start, of futures collected with an exception
    nobody read: read it after ``gc.collect()``."""
    loop = asyncio.get_running_loop()
    handler = loop.get_exception_handler()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    yield reported
    loop.set_exception_handler(handler)


def never_retrieved(reported: list[dict[str, Any]]) -> list[str]:
    gc.collect()
    return [str(c.get("exception")) for c in reported if "never retrieved" in str(c.get("message"))]


async def test_a_batch_cancelled_while_its_send_waits_leaves_no_reply_behind(unread_failures):
    async with connection_to_a_silent_executor() as (connection, their_writer):
        batch = asyncio.create_task(connection.infer("mlp", LARGE))
        await asyncio.sleep(0.1)
        assert not batch.done() and connection.in_flight == 1  # waiting on the full socket
        batch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await batch
        assert connection.in_flight == 0
        their_writer.close()  # the executor goes away: nothing is left to fail
        await asyncio.wait_for(connection.closed, 5)
    del batch
    assert never_retrieved(unread_failures) == []


async def test_an_executor_hanging_up_while_a_batch_is_sent_fails_the_batch_once(unread_failures):
    async with connection_to_a_silent_executor() as (connection, their_writer):
        batch = asyncio.create_task(connection.infer("mlp", LARGE))
        await asyncio.sleep(0.1)
        assert not batch.done()
        their_writer.close()
        with pytest.raises(ExecutorFailed):
            await asyncio.wait_for(batch, 5)
        assert connection.in_flight == 0
    del batch
    assert never_retrieved(unread_failures) == []
