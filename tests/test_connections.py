"""Connections: a deadline on each request head, a cap on open connections (slowloris)."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import resource
import socket
import time
from collections.abc import Callable

import requests

from gateway.connections import Connections, ConnectionTable, connection_cap
from tests.helpers import free_port, run_gateway, write_config

# -- the rules, on a fake clock -------------------------------------------------------------------


def test_a_head_is_due_within_the_timeout_of_the_accept():
    table: ConnectionTable[str] = ConnectionTable(header_timeout_s=5, max_connections=10)
    assert table.opened("a", now=0.0) == []
    table.opened("b", now=1.0)
    assert table.next_deadline() == 5.0
    table.head_bytes("a", now=2.0)  # dribbled bytes do not move the deadline
    assert table.expired(now=4.9) == []
    assert table.expired(now=5.0) == ["a"]
    assert table.next_deadline() == 6.0
    table.head_done("b")
    assert table.expired(now=100.0) == [] and table.next_deadline() is None
    assert len(table) == 1


def test_a_keep_alive_connection_is_not_timed_until_its_next_request_begins():
    table: ConnectionTable[str] = ConnectionTable(header_timeout_s=5, max_connections=10)
    table.opened("a", now=0.0)
    table.head_done("a")
    table.answered("a", now=1.0)
    assert table.next_deadline() is None and table.expired(now=50.0) == []  # idle: aiohttp's keep-alive timeout
    table.head_bytes("a", now=60.0)  # first byte of the next head
    assert table.expired(now=64.9) == []
    assert table.expired(now=65.0) == ["a"]


def test_pipelined_heads_keep_a_connection_busy_until_each_is_answered():
    table: ConnectionTable[str] = ConnectionTable(header_timeout_s=5, max_connections=10)
    table.opened("a", now=0.0)
    table.head_done("a")
    table.head_done("a")
    table.answered("a", now=1.0)
    table.head_bytes("a", now=2.0)  # the body of the second request, not a head
    assert table.next_deadline() is None
    table.answered("a", now=3.0)
    table.head_bytes("a", now=4.0)
    assert table.next_deadline() == 9.0


def test_at_the_cap_the_longest_waiting_connection_without_a_request_is_closed():
    table: ConnectionTable[str] = ConnectionTable(header_timeout_s=5, max_connections=3)
    table.opened("busy", now=0.0)
    table.head_done("busy")
    table.opened("idle", now=1.0)
    table.head_done("idle")
    table.opened("head", now=2.0)  # its head due since 2
    table.answered("idle", now=3.0)  # idle since 3: it has waited less
    assert table.opened("new", now=4.0) == ["head"]
    assert table.opened("newer", now=5.0) == ["idle"]
    # Every other connection serves a request: the newcomer is the one closed.
    table.head_done("newer")
    assert table.opened("newest", now=6.0) == ["new"]
    table.head_done("newest")
    assert table.opened("last", now=7.0) == ["last"]
    assert "last" not in table and len(table) == 3
    table.answered("last", now=8.0)  # a late event of a closed connection changes nothing
    table.head_done("last")
    assert "last" not in table


def test_a_client_that_reads_nothing_is_closed_after_the_send_timeout_and_first_at_the_cap():
    table: ConnectionTable[str] = ConnectionTable(header_timeout_s=5, max_connections=3, send_timeout_s=60)
    for name, now in (("reader", 0.0), ("deaf", 1.0), ("other", 2.0)):
        table.opened(name, now=now)
        table.head_done(name)
    table.writes_paused("reader", now=3.0)
    table.writes_resumed("reader")  # it read: no deadline
    table.writes_paused("deaf", now=4.0)
    assert table.next_deadline() == 64.0
    # At the cap, the connection whose client reads nothing goes before the newcomer.
    assert table.opened("new", now=10.0) == ["deaf"]
    table.head_done("new")
    table.writes_paused("new", now=20.0)
    assert table.expired(now=79.9) == [] and table.expired(now=80.0) == ["new"]
    assert table.next_deadline() is None and set(table._busy) == {"reader", "other"}


class Dropped:
    """A connection that notes when the gateway drops it."""

    def __init__(self) -> None:
        self.dropped = False

    def drop(self) -> None:
        self.dropped = True


async def test_a_head_due_before_a_stalled_writes_deadline_is_still_closed_on_time():
    """The one timer was armed for the first deadline and moved only when it fired: a head due in
    0.2 s waited behind a stalled write's deadline of 5 s (slowloris held a connection that long)."""
    connections = Connections(header_timeout_s=0.2, max_connections=10, send_timeout_s=5.0)
    deaf, slow = Dropped(), Dropped()
    connections.opened(deaf)
    connections.head_done(deaf)
    connections.writes_paused(deaf)
    await asyncio.sleep(0.3)  # the timer set for deaf's head has fired: it is at the stalled write's 5 s
    connections.opened(slow)  # its head due in 0.2 s
    await asyncio.sleep(0.5)
    assert slow.dropped and not deaf.dropped


def test_the_cap_stays_under_the_descriptor_limit():
    assert connection_cap(1000, None) == 1000
    assert connection_cap(1000, 20000) == 1000
    assert connection_cap(1000, 1024) == 960
    assert connection_cap(1000, 256) == 192
    assert connection_cap(1000, 40) == 30
    assert connection_cap(10, 256) == 10
    # HTTP and gRPC each hold at most half of what the limit leaves.
    assert connection_cap(1000, 256, listeners=2) == 96
    assert connection_cap(1000, None, listeners=2) == 1000


# -- slowloris against the real gateway -------------------------------------------------------------

DESCRIPTORS = 256
HEADER_TIMEOUT_S = 2.0
SLOW_CLIENTS = 300
BODY = json.dumps({"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.5] * 512}]})


def descriptor_limit_of(limit: int) -> Callable[[], None]:
    """For run_gateway's preexec_fn: the gateway runs under ``ulimit -n limit``."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))


def closed_by_peer(sock: socket.socket) -> bool:
    """Dribble one more header byte, then see whether the gateway has closed the connection."""
    try:
        sock.send(b"x")
        return sock.recv(1) == b""  # the socket does not block: no answer yet raises
    except BlockingIOError:
        return False
    except OSError as error:
        return error.errno in (errno.ECONNRESET, errno.EPIPE)


def ends_within(sock: socket.socket, seconds: float) -> bool:
    """Read what the gateway sent until it closes the connection (True) or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    sock.setblocking(True)
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            if not sock.recv(1 << 16):
                return True
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True
    return False


def test_slowloris_under_a_low_descriptor_limit_neither_holds_off_requests_nor_stays(tmp_models):
    config = write_config(tmp_models / "config.toml", {"mlp": {"path": "mlp.onnx", "sla_ms": 1000, "max_batch_size": 8}})
    config.write_text(config.read_text() + f"\n[server]\nheader_timeout_s = {HEADER_TIMEOUT_S}\n")
    with run_gateway(config, preexec_fn=descriptor_limit_of(DESCRIPTORS)) as gateway:
        slow = []
        try:
            # More connections than the gateway has descriptors, each stuck in its headers.
            for _ in range(SLOW_CLIENTS):
                sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=2)
                sock.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                sock.setblocking(False)
                slow.append(sock)
            opened = time.monotonic()
            # Good requests, each on a new connection, are served while the slow ones are held.
            for _ in range(5):
                answer = requests.post(f"{gateway.base}/v2/models/mlp/infer", data=BODY, timeout=5)
                assert answer.status_code == 200, answer.text
            assert time.monotonic() - opened < HEADER_TIMEOUT_S
            held = sum(not closed_by_peer(sock) for sock in slow)
            assert held >= 100, f"only {held} slow connections were still open"
            # None outlives its header deadline, though each goes on dribbling.
            open_ = list(slow)
            while open_ and time.monotonic() < opened + HEADER_TIMEOUT_S + 3.0:
                time.sleep(0.25)
                open_ = [sock for sock in open_ if not closed_by_peer(sock)]
            assert not open_, f"{len(open_)} slow connections still open {HEADER_TIMEOUT_S + 3} s after they began"
            assert requests.post(f"{gateway.base}/v2/models/mlp/infer", data=BODY, timeout=5).status_code == 200
        finally:
            for sock in slow:
                sock.close()
        assert gateway.process.poll() is None, gateway.output()


def test_silent_connections_to_the_grpc_port_neither_take_every_descriptor_nor_stay(tmp_models):
    """gRPC held each silent connection for its 120 s handshake, with no cap: 300 of them took
    every descriptor, and HTTP, gRPC and the control loop failed until the client let go."""
    import tritonclient.grpc as triton_grpc

    config = write_config(tmp_models / "config.toml", {"mlp": {"path": "mlp.onnx", "sla_ms": 1000, "max_batch_size": 8}})
    config.write_text(config.read_text() + f"\n[server]\nheader_timeout_s = {HEADER_TIMEOUT_S}\n")
    grpc_port = free_port()
    run = run_gateway(config, args=["--grpc-port", str(grpc_port)], preexec_fn=descriptor_limit_of(DESCRIPTORS))
    with run as gateway:
        silent = []
        try:
            for _ in range(SLOW_CLIENTS):
                sock = socket.create_connection(("127.0.0.1", grpc_port), timeout=2)
                sock.setblocking(False)
                silent.append(sock)
            opened = time.monotonic()
            time.sleep(0.5)
            assert len(os.listdir(f"/proc/{gateway.process.pid}/fd")) < DESCRIPTORS - 32
            assert requests.post(f"{gateway.base}/v2/models/mlp/infer", data=BODY, timeout=5).status_code == 200
            open_ = list(silent)
            while open_ and time.monotonic() < opened + HEADER_TIMEOUT_S + 3.0:
                time.sleep(0.25)
                open_ = [sock for sock in open_ if not closed_by_peer(sock)]
            assert not open_, f"{len(open_)} silent connections still open {HEADER_TIMEOUT_S + 3} s after they began"
            assert triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}").is_server_live()
        finally:
            for sock in silent:
                sock.close()
        assert "Too many open files" not in gateway.output()


def test_grpc_connections_idle_after_their_handshake_are_closed(tmp_models):
    """A connection that completes HTTP/2's handshake and then makes no call held its slot for
    good: at max_connections every gRPC client was refused. One idle for request_timeout_ms is
    now closed, and the cap's slots come back."""
    import tritonclient.grpc as triton_grpc

    config = write_config(tmp_models / "config.toml", {"mlp": {"path": "mlp.onnx", "sla_ms": 1000, "max_batch_size": 8}})
    config.write_text(config.read_text() + "\n[server]\nrequest_timeout_ms = 1500\nmax_connections = 8\n")
    grpc_port = free_port()
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # and an empty SETTINGS
    settings_ack = bytes([0, 0, 0, 4, 1, 0, 0, 0, 0])
    with run_gateway(config, args=["--grpc-port", str(grpc_port)]):
        idle = []
        try:
            for _ in range(8):
                sock = socket.create_connection(("127.0.0.1", grpc_port), timeout=2)
                sock.sendall(preface)
                sock.recv(1 << 16)  # the server's SETTINGS
                sock.sendall(settings_ack)
                idle.append(sock)
            assert all(ends_within(sock, 6.0) for sock in idle)
            client = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
            assert client.is_server_live()
        finally:
            for sock in idle:
                sock.close()


# -- a body that stops half-way ---------------------------------------------------------------------

REQUEST_TIMEOUT_MS = 1500


def test_a_body_that_stops_half_way_ends_at_the_request_timeout(tmp_models):
    """Headers in time, then half the body and nothing more: the request ends with a 408 at
    request_timeout_ms and its connection is closed, so that stalled bodies can neither hold a
    request in flight for ever nor keep the connections of the cap from good clients."""
    config = write_config(tmp_models / "config.toml", {"mlp": {"path": "mlp.onnx", "sla_ms": 1000, "max_batch_size": 8}})
    config.write_text(config.read_text() + f"\n[server]\nrequest_timeout_ms = {REQUEST_TIMEOUT_MS}\nmax_connections = 4\n")
    body = BODY.encode()
    with run_gateway(config) as gateway:
        stalled = []
        for path in ("/v2/models/mlp/infer",) * 3 + ("/admin/models/mlp/sla",):
            sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
            method = "POST" if path.endswith("infer") else "PUT"
            sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body[:100])
            stalled.append(sock)
        began = time.monotonic()
        answers = []
        for sock in stalled:
            answer = b""
            while chunk := sock.recv(65536):  # to the end: the gateway closes the connection
                answer += chunk
            answers.append(answer)
            sock.close()
        waited = time.monotonic() - began
        assert waited < REQUEST_TIMEOUT_MS / 1000 + 5, waited
        for answer in answers:
            head, _, text = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408"), answer
            assert json.loads(text)["error"] == "the request body did not arrive within 1500 ms (server.request_timeout_ms)"
        stats = gateway.admin("mlp")["stats"]
        assert stats["outcomes"] == {"timeout": 3}, stats
        assert requests.post(f"{gateway.base}/v2/models/mlp/infer", data=BODY, timeout=5).status_code == 200
        metrics = gateway.metrics()
        assert 'gateway_requests_in_flight{model="mlp"} 0.0' in metrics
        assert 'gateway_requests_received_total{model="mlp"} 4.0' in metrics


def test_clients_that_read_none_of_their_answers_lock_no_one_out(tmp_models):
    """Four clients pipelined 150 requests each and read nothing: with max_connections = 4 they
    held every connection for good (busy, never idle), and each new client was closed unanswered."""
    config = write_config(tmp_models / "config.toml", {"mlp": {"path": "mlp.onnx", "sla_ms": 1000}})
    config.write_text(config.read_text() + "\n[server]\nmax_connections = 4\nrequest_timeout_ms = 3000\n")
    with run_gateway(config) as gateway:
        deaf = []
        try:
            for _ in range(4):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
                sock.connect(("127.0.0.1", gateway.port))
                sock.sendall(b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n" * 150)
                deaf.append(sock)
            time.sleep(1.0)  # their answers fill the buffers
            answer = requests.get(f"{gateway.base}/v2/health/live", timeout=5)
            assert answer.status_code == 200
            # Past the send timeout (the request timeout), each has been closed: read now, each ends.
            time.sleep(3.0 + 2.0)
            assert all(ends_within(sock, 5.0) for sock in deaf)
        finally:
            for sock in deaf:
                sock.close()


def test_a_timer_set_under_a_millisecond_ahead_on_uvloop_is_moved_as_any_other():
    """uvloop's call_at gives a plain Handle, without when(), for a time under half a millisecond
    away (its clock counts whole milliseconds): the next connection's _arm asked it, and that
    connection was torn down (AttributeError, "Fatal error on transport"); idle connections
    reaching their header timeout every few milliseconds cut well-behaved clients off."""
    import uvloop

    async def main() -> tuple[bool, bool]:
        connections = Connections(header_timeout_s=0.0001, max_connections=10, send_timeout_s=5.0)
        first, second = Dropped(), Dropped()
        connections.opened(first)
        connections.opened(second)
        await asyncio.sleep(0.05)
        return first.dropped, second.dropped

    loop = uvloop.new_event_loop()
    try:
        assert loop.run_until_complete(main()) == (True, True)
    finally:
        loop.close()
