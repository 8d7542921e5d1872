"""Which connections the gateway holds: a deadline on each request head, and a cap on how many.

aiohttp waits for a request line and headers as long as the client takes (its only bound is the
keep-alive timeout, an hour by default) and accepts connections until the process runs out of
descriptors, so a few hundred clients dribbling their headers (slowloris) hold every new client
off. Three rules bound that:

- The head deadline of Go's net/http (``Server.ReadHeaderTimeout``): the request line and headers
  must be complete within ``header_timeout_s`` of the connection's accept, or, on a keep-alive
  connection, of the first byte of its next request. An idle keep-alive connection has no head
  deadline: aiohttp's keep-alive timeout ends it.
- A cap on open connections, as nginx's ``worker_connections``: at the cap, nginx closes the
  reusable connections (idle keep-alive ones, and new ones that have not sent a full head), oldest
  first (``ngx_drain_connections``). Here the connection that has waited longest without a
  request in progress is closed, the newcomer itself when every other one is serving a request.
  The cap is kept below the descriptor limit (``connection_cap``): ``accept`` failing with EMFILE
  is what turns held connections into refused requests.
- A deadline on writes, as nginx's ``send_timeout``: a connection whose client reads nothing of
  its answers (the transport's buffer full, writing paused) for ``send_timeout_s`` is closed, and
  at the cap such a connection is closed before a newcomer. Four clients that pipelined requests
  and never read their answers held their connections for good and locked every other client out.

``ConnectionTable`` is those rules alone: events and a clock in, connections to close out.
``Connections`` drives it on the event loop, and ``GatewayConnection`` is aiohttp's
``RequestHandler`` reporting the events of one connection.
"""

from __future__ import annotations

import asyncio
import math
import resource
from collections.abc import Hashable
from typing import Any, Generic, TypeVar

from aiohttp import web

C = TypeVar("C", bound=Hashable)

# Descriptors kept for the gateway itself (executor sockets and pipes, model files, its log, the
# event loop's own), at most a quarter of a low limit: a gateway serving a few models uses ~30.
DESCRIPTOR_RESERVE = 64


def connection_cap(max_connections: int, descriptor_limit: int | None, listeners: int = 1) -> int:
    """``max_connections``, lowered to leave ``DESCRIPTOR_RESERVE`` of the descriptor limit free;
    each of ``listeners`` (HTTP, and gRPC where it is served) may hold an equal share of the rest."""
    if descriptor_limit is None or descriptor_limit <= 0:
        return max_connections
    reserve = min(DESCRIPTOR_RESERVE, descriptor_limit // 4)
    return max(1, min(max_connections, (descriptor_limit - reserve) // listeners))


def descriptor_limit() -> int | None:
    """This process's soft limit on open descriptors (``ulimit -n``); None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


class ConnectionTable(Generic[C]):
    """The open connections, each waiting for a head, idle, or serving requests; no I/O, no clock.

    ``now`` must not go back from one call to the next: each state keeps its connections in the
    order they entered it, which is then the order of their deadlines and of their age.
    """

    def __init__(self, header_timeout_s: float, max_connections: int, send_timeout_s: float = math.inf):
        self.header_timeout_s = header_timeout_s
        self.max_connections = max_connections
        self.send_timeout_s = send_timeout_s
        self._heads: dict[C, float] = {}  # a head is due: since when
        self._idle: dict[C, float] = {}  # keep-alive, no byte of a next request yet: since when
        self._busy: dict[C, int] = {}  # heads received whose response is not written yet
        self._stalled: dict[C, float] = {}  # its client reads none of its answers: since when

    def __len__(self) -> int:
        return len(self._heads) + len(self._idle) + len(self._busy)

    def __contains__(self, conn: object) -> bool:
        return conn in self._heads or conn in self._idle or conn in self._busy

    def opened(self, conn: C, now: float) -> list[C]:
        """A connection was accepted: its head is due from now. Returns those to close for the cap."""
        self._heads[conn] = now
        victims = []
        while len(self) > self.max_connections:
            victim = self._longest_waiting()
            self.closed(victim)
            victims.append(victim)
        return victims

    def head_bytes(self, conn: C, now: float) -> None:
        """Bytes arrived: on an idle connection they begin a head, which is due from now."""
        if conn in self._idle:
            del self._idle[conn]
            self._heads[conn] = now

    def head_done(self, conn: C) -> None:
        """A request line and headers are complete (pipelined ones count one each)."""
        if conn not in self:
            return
        self._heads.pop(conn, None)
        self._idle.pop(conn, None)
        self._busy[conn] = self._busy.get(conn, 0) + 1

    def answered(self, conn: C, now: float) -> None:
        """A response is written; with none left to write, the connection is idle from now."""
        if conn not in self._busy:
            return
        pending = self._busy.pop(conn) - 1
        if pending > 0:
            self._busy[conn] = pending
        else:
            self._idle[conn] = now

    def writes_paused(self, conn: C, now: float) -> None:
        """The transport's buffer is full: its client has not read its answers."""
        if conn in self and conn not in self._stalled:
            self._stalled[conn] = now

    def writes_resumed(self, conn: C) -> None:
        self._stalled.pop(conn, None)

    def closed(self, conn: C) -> None:
        self._heads.pop(conn, None)
        self._idle.pop(conn, None)
        self._busy.pop(conn, None)
        self._stalled.pop(conn, None)

    def take_all(self) -> list[C]:
        """Every connection, taken out of the table: close them."""
        every = [*self._heads, *self._idle, *self._busy]
        self._heads, self._idle, self._busy, self._stalled = {}, {}, {}, {}
        return every

    def expired(self, now: float) -> list[C]:
        """The connections whose head, or whose stalled writes, are past their deadline, taken out
        of the table: close them."""
        late = []
        for waiting, timeout_s in ((self._heads, self.header_timeout_s), (self._stalled, self.send_timeout_s)):
            for conn, since in waiting.items():
                if since + timeout_s > now:
                    break
                late.append(conn)
        for conn in late:
            self.closed(conn)
        return late

    def next_deadline(self) -> float | None:
        """When the first head or stalled write falls due; None when none is due."""
        head = next(iter(self._heads.values()), None)
        stalled = next(iter(self._stalled.values()), None)
        deadlines = [
            since + timeout_s
            for since, timeout_s in ((head, self.header_timeout_s), (stalled, self.send_timeout_s))
            if since is not None
        ]
        return min(deadlines, default=None)

    def _longest_waiting(self) -> C:
        """The connection without a request in progress, or whose client reads nothing, that has
        waited longest (a newcomer is among the heads)."""
        firsts = [next(iter(waiting.items()), None) for waiting in (self._idle, self._stalled, self._heads)]
        return min((first for first in firsts if first is not None), key=lambda first: first[1])[0]


class Connections:
    """The gateway's connections on the event loop: one timer for the deadlines, the cap on accept."""

    def __init__(self, header_timeout_s: float, max_connections: int, send_timeout_s: float = math.inf):
        self.table: ConnectionTable[GatewayConnection] = ConnectionTable(header_timeout_s, max_connections, send_timeout_s)
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.Handle | None = None
        # When the timer fires: uvloop's call_at gives a plain Handle, without when(), for a time
        # under half a millisecond away or past (its clock counts whole milliseconds), and
        # asking it tore down whichever connection's data came next ("Fatal error on transport").
        self._timer_at = 0.0
        self._empty = asyncio.Event()
        self._empty.set()

    def __len__(self) -> int:
        return len(self.table)

    def opened(self, conn: GatewayConnection) -> None:
        self._empty.clear()
        for victim in self.table.opened(conn, self._loop.time()):
            victim.drop()
        self._arm()

    def head_bytes(self, conn: GatewayConnection) -> None:
        self.table.head_bytes(conn, self._loop.time())
        self._arm()

    def head_done(self, conn: GatewayConnection) -> None:
        self.table.head_done(conn)

    def answered(self, conn: GatewayConnection) -> None:
        self.table.answered(conn, self._loop.time())

    def writes_paused(self, conn: GatewayConnection) -> None:
        self.table.writes_paused(conn, self._loop.time())
        self._arm()

    def writes_resumed(self, conn: GatewayConnection) -> None:
        self.table.writes_resumed(conn)

    def closed(self, conn: GatewayConnection) -> None:
        self.table.closed(conn)
        if not self.table:
            self._empty.set()

    async def close_all(self, grace_s: float) -> None:
        """Let the open connections finish for at most ``grace_s``, then close what is left.

        Called once the gateway has stopped listening and answers every request 503 with
        ``Connection: close``: a connection ends after its next answer, so waiting lets the
        requests already on their way be answered rather than cut off.
        """
        try:
            await asyncio.wait_for(self._empty.wait(), grace_s)
        except TimeoutError:
            for conn in self.table.take_all():
                conn.drop()
            self._empty.set()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        """The timer at the first deadline. A head's deadline can come before a stalled write's
        armed earlier (5 s against a request's 60 s): the timer moves to the sooner one."""
        deadline = self.table.next_deadline()
        if deadline is None or (self._timer is not None and self._timer_at <= deadline):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = self._loop.call_at(deadline, self._expire), deadline

    def _expire(self) -> None:
        self._timer = None
        for conn in self.table.expired(self._loop.time()):
            conn.drop()
        if not self.table:
            self._empty.set()
        self._arm()


class GatewayConnection(web.RequestHandler):
    """aiohttp's handler of one connection, telling ``Connections`` when heads start and end.

    A head is complete when aiohttp's parser has counted a message (``_request_count``, in
    aiohttp 3.x): aiohttp has no public hook for it.
    """

    __slots__ = ("_connections", "_heads_seen")

    def __init__(self, manager: web.Server, connections: Connections, **kwargs: Any):
        super().__init__(manager, **kwargs)
        self._connections = connections
        self._heads_seen = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._connections.opened(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._connections.closed(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if data:
            self._connections.head_bytes(self)
        super().data_received(data)
        self._count_heads()

    async def finish_response(self, request: Any, resp: Any, start_time: Any) -> Any:
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            self._count_heads()  # a declined upgrade's buffered tail is parsed in there
            self._connections.answered(self)

    def drop(self) -> None:
        """Close the connection. One whose client reads nothing is reset: a close waits for the
        answers it holds to be sent, and so held the connection (and its descriptor) for good."""
        transport = self.transport
        if transport is not None and transport.get_write_buffer_size() > 0:
            transport.abort()
        self.force_close()

    def pause_writing(self) -> None:
        super().pause_writing()
        self._connections.writes_paused(self)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._connections.writes_resumed(self)

    def _count_heads(self) -> None:
        while self._heads_seen < self._request_count:
            self._heads_seen += 1
            self._connections.head_done(self)
