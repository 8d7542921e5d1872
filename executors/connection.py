"""The gateway's end of the executor protocol over an asyncio stream."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from executors.wire import (
    MAX_FRAME_BYTES,
    PREFIX,
    ProtocolViolation,
    encode_frame,
    pack_tensors,
    parse_prefix,
    shares_clock,
    unpack_tensors,
)

log = logging.getLogger("executors")


class ExecutorFailed(RuntimeError):
    """The executor could not run the batch: it crashed, hung up, or is not running.
    ``reached``: whether the batch may have reached it (False: it was never sent, so its inputs
    cannot be what failed it)."""

    def __init__(self, message: str, *, reached: bool = True):
        super().__init__(message)
        self.reached = reached


class ModelError(RuntimeError):
    """ONNX Runtime refused the batch (the executor itself is fine)."""


class BatchLate(RuntimeError):
    """The executor did not run the batch: it reached it ``late_ms`` after its latest start
    (Clockwork's late action, Section 4.4). Nothing ran; the executor is fine."""

    def __init__(self, late_ms: float):
        super().__init__(f"the executor reached the batch {late_ms:.3f} ms after its latest start and did not run it")
        self.late_ms = late_ms


async def read_frame(reader: asyncio.StreamReader, limit: int = MAX_FRAME_BYTES) -> tuple[dict[str, Any], bytes]:
    """One frame; FrameTooLarge, before its bytes are read, where its prefix announces over ``limit``."""
    header_length, payload_length = parse_prefix(await reader.readexactly(PREFIX.size), limit)
    head = await reader.readexactly(header_length)
    payload = await reader.readexactly(payload_length) if payload_length else b""
    return json.loads(head), payload


class ExecutorConnection:
    """Requests in flight to one executor, matched to its replies by id."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        hello: dict[str, Any],
        shares_clock: bool = False,
        on_message: Callable[[dict[str, Any]], None] | None = None,
    ):
        """``on_message`` hears every frame that answers no request (a worker's ``status``)."""
        self.hello = hello
        self._on_message = on_message
        # Whether the executor reads this process's clock, so that a latest start means the same
        # instant at both ends; only then are batches sent with one (executors/wire.py).
        self.shares_clock = shares_clock
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[tuple[dict[str, Any], bytes]]] = {}
        self.cpu_s: float | None = None  # the executor's CPU time as of its last result (None: never reported)
        self.closed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._reader_task = asyncio.create_task(self._read_loop())

    @classmethod
    async def accept(cls, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> ExecutorConnection:
        header, _ = await read_frame(reader)
        received = time.perf_counter()
        if header.get("kind") != "hello":
            raise ProtocolViolation(f"expected hello from the executor, got {header.get('kind')!r}")
        shared = shares_clock(header.get("clock"), received)
        if not shared:
            log.warning(
                "executor pid %s does not read this host's monotonic clock (hello clock %s, here %.3f): "
                "its batches are sent without a latest start time",
                header.get("pid"),
                header.get("clock"),
                received,
            )
        return cls(reader, writer, header, shared)

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    async def infer(
        self,
        model: str,
        tensors: dict[str, np.ndarray],
        latest_start: float = math.inf,
        extra: Mapping[str, Any] | None = None,
    ) -> tuple[dict[str, np.ndarray], float]:
        """Run a batch; ``latest_start`` (time.perf_counter seconds) is the latest moment the
        executor may begin it, or it raises BatchLate. An executor that does not read this clock
        (``shares_clock``) gets no latest start and runs every batch, as does inf. ``extra``:
        more fields of the header (which executor of a worker, the requests' waits)."""
        if self.closed.done():
            raise ExecutorFailed(f"executor connection is closed: {self.closed.result()}", reached=False)
        request_id = next(self._ids)
        descriptions, buffers = pack_tensors(tensors)
        header: dict[str, Any] = {**(extra or {}), "kind": "infer", "id": request_id, "model": model, "tensors": descriptions}
        if self.shares_clock and math.isfinite(latest_start):
            header["latest"] = latest_start
        reply: asyncio.Future[tuple[dict[str, Any], bytes]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = reply
        try:
            try:
                self._writer.writelines(encode_frame(header, buffers))
                await self._writer.drain()
            except (ConnectionError, RuntimeError) as error:
                raise ExecutorFailed(f"could not send the batch to the executor: {error}", reached=False) from error
            answer, payload = await reply
        finally:
            # However this call ends (sent and answered, the send failed, or its task cancelled
            # while the send waited on a full socket), its reply leaves the table: a reply that
            # the connection's end failed meanwhile is read here, where it was left unread
            # (asyncio's "Future exception was never retrieved"), and one still open is cancelled.
            self._pending.pop(request_id, None)
            if not reply.done():
                reply.cancel()
            elif not reply.cancelled():
                reply.exception()
        if answer["kind"] == "error":
            raise ModelError(answer.get("message", "the executor refused the batch"))
        if answer["kind"] == "late":
            raise BatchLate(float(answer["late_ms"]))
        if answer["kind"] == "failed":  # a worker's executor failed (crashed, hung, not running)
            raise ExecutorFailed(answer.get("message", "the executor failed"))
        if "cpu_s" in answer:
            self.cpu_s = float(answer["cpu_s"])
        return unpack_tensors(answer["tensors"], payload), float(answer["compute_ms"])

    def send(self, header: dict[str, Any]) -> None:
        """A frame that answers nothing (a worker's SLA from its dispatcher); dropped where the
        connection has ended, as its next hello carries what it would have said."""
        if not self.closed.done():
            with contextlib.suppress(ConnectionError, RuntimeError):
                self._writer.writelines(encode_frame(header))

    def fail_all(self, reason: str) -> None:
        """Fail every request in flight at once (the executor is gone) and close."""
        if not self.closed.done():
            self.closed.set_result(reason)
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(ExecutorFailed(reason))
        self._writer.close()

    async def close(self) -> None:
        self.fail_all("executor stopped")
        self._reader_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader_task

    async def _read_loop(self) -> None:
        reason = "executor closed the connection"
        try:
            while True:
                header, payload = await read_frame(self._reader)
                if "id" not in header:
                    if self._on_message is not None:
                        self._on_message(header)
                    continue
                future = self._pending.pop(header.get("id"), None)
                if future is not None and not future.done():
                    future.set_result((header, payload))
        except asyncio.IncompleteReadError:
            pass
        except (ConnectionError, ProtocolViolation, ValueError) as error:
            reason = f"executor connection failed: {error}"
        self.fail_all(reason)
