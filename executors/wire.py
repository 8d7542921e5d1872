"""The executor protocol: length-prefixed frames of a small JSON header and raw tensor bytes.

Every backend (a process on this host, a container, later a remote node) speaks this protocol
over a stream socket (DESIGN.md, principle 2). A frame is::

    u32 header_length | u32 payload_length | header (UTF-8 JSON) | payload (tensor bytes)

The header describes the tensors (name, datatype, shape, nbytes) in payload order; the tensor
bytes themselves never pass through JSON. Messages:

- executor -> gateway ``hello``: {"kind": "hello", "pid", "provider", "models": {name: signature},
  "clock"}
- gateway -> executor ``infer``: {"kind": "infer", "id", "model", "tensors": [...], "latest"?}
- executor -> gateway ``result``: {"kind": "result", "id", "compute_ms", "cpu_s"?, "tensors": [...]}
  (``cpu_s``: the executor process's CPU time so far, time.process_time)
- executor -> gateway ``error``: {"kind": "error", "id", "message"}
- executor -> gateway ``late``: {"kind": "late", "id", "late_ms"}

``latest`` is Clockwork's action window (Section 4.4): the latest time, in seconds on the
``clock``, at which the executor may begin the batch. An executor that would begin it later does
not run it and answers ``late`` with how late it was; without the field it runs every batch.
``clock`` is the executor's reading of that clock when it said hello, so that the gateway can
check that both ends read one clock before it sends any ``latest`` (``shares_clock``).

The clock is CLOCK_MONOTONIC, which time.perf_counter reads on Linux (checked:
``time.get_clock_info("perf_counter")`` says clock_gettime(CLOCK_MONOTONIC)). It counts from the
host's boot and is one clock for every process of the host, containers included: only a time
namespace (Linux 5.6, CLONE_NEWTIME) offsets it, and Docker does not create one. An executor on
another host reads another clock; the hello check finds that out and the gateway then sends no
``latest`` to it.
"""

from __future__ import annotations

import json
import math
import socket
import struct
from typing import Any, BinaryIO

import numpy as np

from executors.tensors import datatype_of, tensor_from_bytes, tensor_to_bytes

PREFIX = struct.Struct("<II")
# A frame larger than this is refused: it protects both ends from a corrupt length prefix.
MAX_FRAME_BYTES = 1 << 31


# How far behind the gateway's reading an executor's hello ``clock`` may be and still be taken for
# the same clock: the hello's time in transit, seconds at most even on a gateway busy at start-up.
# Clocks of different hosts or time namespaces differ by their boot times, hours or days apart.
SHARED_CLOCK_TOLERANCE_S = 10.0


def shares_clock(executor_clock: float | None, gateway_clock: float) -> bool:
    """Whether an executor whose hello read ``executor_clock`` reads the gateway's own clock,
    which read ``gateway_clock`` when the hello arrived (after it, by the time in transit)."""
    if executor_clock is None or not math.isfinite(executor_clock):
        return False
    behind_s = gateway_clock - executor_clock
    return 0.0 <= behind_s <= SHARED_CLOCK_TOLERANCE_S


class ProtocolViolation(RuntimeError):
    """The peer sent something that is not a frame of this protocol."""


def encode_frame(header: dict[str, Any], buffers: list[bytes | memoryview] | None = None) -> list[bytes | memoryview]:
    """The pieces of one frame, ready for ``writelines``/``sendmsg`` without joining them."""
    head = json.dumps(header, separators=(",", ":")).encode()
    buffers = buffers or []
    payload_length = sum(len(b) if isinstance(b, bytes) else b.nbytes for b in buffers)
    return [PREFIX.pack(len(head), payload_length), head, *buffers]


def send_frame(sock: socket.socket, pieces: list[bytes | memoryview]) -> None:
    """Every byte of a frame's ``pieces`` (``encode_frame``) on a blocking socket. One sendmsg
    may send part of them: a signal that stops the process while the call waits for room in the
    socket's buffer (SIGSTOP and SIGCONT of a debugger or of ``docker pause``) returns what was sent
    by then. The rest unsent, the gateway waited for it until the executor was killed as hung."""
    views = [memoryview(piece).cast("B") for piece in pieces]
    while views:
        sent = sock.sendmsg(views)
        while views and sent >= len(views[0]):
            sent -= len(views.pop(0))
        if sent:
            views[0] = views[0][sent:]


def pack_tensors(tensors: dict[str, np.ndarray]) -> tuple[list[dict[str, Any]], list[bytes | memoryview]]:
    """Tensor descriptions for a header and their byte buffers, in the same order."""
    descriptions: list[dict[str, Any]] = []
    buffers: list[bytes | memoryview] = []
    for name, array in tensors.items():
        datatype = datatype_of(array)
        raw = tensor_to_bytes(array, datatype)
        nbytes = len(raw) if isinstance(raw, bytes) else raw.nbytes
        descriptions.append({"name": name, "datatype": datatype, "shape": list(array.shape), "nbytes": nbytes})
        buffers.append(raw)
    return descriptions, buffers


def unpack_tensors(descriptions: list[dict[str, Any]], payload: bytes | memoryview) -> dict[str, np.ndarray]:
    view = memoryview(payload)
    tensors: dict[str, np.ndarray] = {}
    offset = 0
    for description in descriptions:
        end = offset + description["nbytes"]
        if end > len(view):
            raise ProtocolViolation(f"tensor {description['name']!r} runs past the end of the frame")
        tensors[description["name"]] = tensor_from_bytes(view[offset:end], description["datatype"], description["shape"])
        offset = end
    return tensors


class FrameTooLarge(ProtocolViolation):
    """A frame's prefix announces more bytes than the reader takes: refused before they are read."""

    def __init__(self, prefix: bytes, size: int, limit: int):
        super().__init__(f"frame of {size} bytes is over the limit of {limit}")
        self.prefix, self.size, self.limit = prefix, size, limit


def parse_prefix(prefix: bytes, limit: int = MAX_FRAME_BYTES) -> tuple[int, int]:
    header_length, payload_length = PREFIX.unpack(prefix)
    if header_length + payload_length > limit:
        raise FrameTooLarge(prefix, header_length + payload_length, limit)
    return header_length, payload_length


def read_frame_blocking(stream: BinaryIO) -> tuple[dict[str, Any], bytes] | None:
    """One frame from a blocking binary stream; None at a clean end of stream."""
    prefix = stream.read(PREFIX.size)
    if not prefix:
        return None
    if len(prefix) < PREFIX.size:
        raise ProtocolViolation("stream ended inside a frame prefix")
    header_length, payload_length = parse_prefix(prefix)
    head = stream.read(header_length)
    payload = stream.read(payload_length) if payload_length else b""
    if len(head) < header_length or len(payload) < payload_length:
        raise ProtocolViolation("stream ended inside a frame")
    return json.loads(head), payload
