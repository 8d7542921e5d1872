"""A dispatcher meeting a worker, without the processes: the worker's cap on a hello read before
its token is checked (gateway/cluster/worker.py), and what a dispatcher's link says when it cannot
connect (gateway/cluster/link.py): once, naming the error, with a hint where TLS is on one end only."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from executors.wire import PREFIX, encode_frame
from gateway.cluster import link as link_module
from gateway.cluster.dispatcher import Cluster
from gateway.cluster.link import WorkerLink
from gateway.cluster.worker import MAX_HELLO_BYTES, HelloTooLarge, read_hello
from gateway.config import ConfigError, load_config
from tests.helpers import EXAMPLES

# Short enough that a test sees several retries within a second or two.
CONNECT_TIMEOUT_S = 0.2
RETRIES_WITHIN_S = 1.5


def _reader_with(data: bytes) -> asyncio.StreamReader:
    """A stream holding ``data`` and no end: a read past it would wait forever."""
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    return reader


async def test_a_real_hello_is_read() -> None:
    frame = b"".join(encode_frame({"kind": "hello", "token": "t" * 64, "dispatcher": "host-1234"}))
    assert len(frame) < MAX_HELLO_BYTES / 50  # the cap leaves a wide margin
    assert await read_hello(_reader_with(frame)) == {"kind": "hello", "token": "t" * 64, "dispatcher": "host-1234"}


async def test_a_hello_over_the_cap_is_refused_unread() -> None:
    # Only the prefix has arrived: refused from it alone, without waiting for the 2 GiB.
    with pytest.raises(HelloTooLarge, match=f"announced 2147483632 bytes, over the {MAX_HELLO_BYTES}"):
        await asyncio.wait_for(read_hello(_reader_with(PREFIX.pack((1 << 31) - 16, 0))), 1.0)
    with pytest.raises(HelloTooLarge, match="announced"):
        await asyncio.wait_for(read_hello(_reader_with(PREFIX.pack(16, MAX_HELLO_BYTES))), 1.0)


async def test_a_tls_client_hello_is_named_as_such() -> None:
    # A dispatcher with tls_ca sends a ClientHello record (22, TLS 1.0's version, its length),
    # which reads as a prefix of tens of megabytes.
    with pytest.raises(HelloTooLarge, match="TLS handshake: the dispatcher speaks TLS, this worker does not"):
        await asyncio.wait_for(read_hello(_reader_with(bytes.fromhex("1603010200010001fc03"))), 1.0)


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A peer that reads and never answers (a worker without TLS reading a ClientHello)."""
    await reader.read()
    writer.close()


async def _hangs_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A peer that closes at once (a TLS worker meeting a plain dispatcher)."""
    writer.close()


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(link_module, "CONNECT_TIMEOUT_S", CONNECT_TIMEOUT_S)
    monkeypatch.setattr(link_module, "RECONNECT_DELAY_S", 0.02)
    monkeypatch.setattr(link_module, "RECONNECT_DELAY_MAX_S", 0.05)


def _link(address: str, **options: Any) -> WorkerLink:
    """A dispatcher's link to ``address`` (a heartbeat timeout of 5 s, changes ignored, unless
    ``options`` say otherwise)."""
    return WorkerLink(
        address, "a-token-of-sixteen+", "test", **{"heartbeat_timeout_s": 5.0, "on_change": lambda *_: None, **options}
    )


@contextlib.asynccontextmanager
async def _server(handler: Handler) -> AsyncIterator[tuple[str, list[asyncio.StreamWriter]]]:
    """A listener on 127.0.0.1 and a free port serving ``handler``; its address and its
    connections' writers."""
    connections: list[asyncio.StreamWriter] = []
    handlers: list[asyncio.Task[None]] = []

    async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        task = asyncio.current_task()
        assert task is not None
        handlers.append(task)
        await handler(reader, writer)

    server = await asyncio.start_server(counted, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}", connections
    finally:
        server.close()
        for writer in connections:
            writer.close()
        await asyncio.gather(*handlers, return_exceptions=True)  # none left for the loop's end


@pytest.mark.usefixtures("quick_retries")
@pytest.mark.parametrize(
    ("handler", "tls", "message"),
    [
        (_silent, False, f"no hello from the worker within {CONNECT_TIMEOUT_S:g} s"),
        (
            _silent,
            True,
            "the TLS handshake did not complete (TimeoutError): the worker may not serve TLS "
            "(one without [worker] tls_cert speaks plain TCP)",
        ),
        (
            _hangs_up,
            False,
            "the worker closed the connection during the hello: it may expect TLS "
            "(a worker with [worker] tls_cert needs [cluster] tls_ca here)",
        ),
    ],
    ids=["no-hello", "tls-to-plain", "plain-to-tls"],
)
async def test_a_failure_to_connect_is_logged_once_and_named(
    handler: Handler, tls: bool, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with _server(handler) as (address, connections):
        link = _link(address, heartbeat_timeout_s=1.0, tls=ssl.create_default_context() if tls else None)
        with caplog.at_level(logging.WARNING, logger="gateway.cluster"):
            link.start()
            await asyncio.sleep(RETRIES_WITHIN_S)
            await link.stop()
        assert len(connections) >= 3  # it kept retrying
        warnings = [r.getMessage() for r in caplog.records if r.name == "gateway.cluster" and r.levelno == logging.WARNING]
        assert warnings == [f"worker {address}: {message}"]
        assert link.last_error == message


def _worker_hello(*executor_ids: str) -> bytes:
    """A worker's hello listing a ready executor of each id (its model of the same name): a GPU's,
    which needs no replica placed to be ready."""
    executors = [{"id": i, "device": "gpu:0", "models": {i: {}}, "state": "ready"} for i in executor_ids]
    return b"".join(encode_frame({"kind": "hello", "worker": "w", "executors": executors}))


async def _until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


@pytest.mark.usefixtures("quick_retries")
async def test_an_executor_a_worker_comes_back_without_is_gone_not_ready() -> None:
    """A worker restarted at its address with a config that dropped a model: its executor kept
    its last state ("ready"), took batches, and the worker answered each with a 503."""
    hellos = [("cpu-a", "cpu-b"), ("cpu-b",)]

    async def restarting_worker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_hello(reader)
        writer.write(_worker_hello(*hellos.pop(0)))
        await writer.drain()
        if hellos:
            writer.close()  # the first run of the worker ends
        else:
            await reader.read()

    changed: list[list[str]] = []
    async with _server(restarting_worker) as (address, _):
        link = _link(address, on_change=lambda _, e: changed.append([x.id for x in e]))
        link.start()
        try:
            await _until(lambda: link.connects == 2 and link.connected)
            gone, kept = link.executors["cpu-a"], link.executors["cpu-b"]
            assert (gone.ready, gone.state, gone.gone) == (False, "gone", True)
            assert kept.ready and not kept.gone
            assert gone.id in changed[-1]  # the engine hears that it is no longer ready
        finally:
            await link.stop()


@pytest.mark.usefixtures("quick_retries")
async def test_an_sla_set_while_the_hello_is_on_its_way_reaches_the_worker() -> None:
    """The hello carries the SLAs of its moment; one set before the worker's hello came back was
    dropped (the link was not up) and never sent: the worker regulated to the old one for good."""
    slas = {"m": 100.0}
    heard: asyncio.Queue[dict] = asyncio.Queue()

    async def worker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await heard.put((await read_hello(reader))["sla_ms"])
        slas["m"] = 333.0  # the admin API sets it at the dispatcher meanwhile ...
        link.send_sla("m", 333.0)  # ... which cannot send it yet
        writer.write(_worker_hello("cpu-m"))
        await writer.drain()
        await heard.put(await read_hello(reader))
        await reader.read()

    async with _server(worker) as (address, _):
        link = _link(address, sla_ms=lambda: dict(slas))
        link.start()
        try:
            assert await asyncio.wait_for(heard.get(), 5.0) == {"m": 100.0}
            assert await asyncio.wait_for(heard.get(), 5.0) == {"kind": "sla", "model": "m", "sla_ms": 333.0}
        finally:
            await link.stop()


CLUSTER = '[cluster]\nworkers = ["127.0.0.1:9"]\ntoken = "a-token-of-sixteen+"\n'


def test_every_hello_carries_each_models_sla_the_configs_included(tmp_path) -> None:
    """Only the SLAs set at run time went in a hello: a worker kept one that an earlier run of the
    dispatcher set, though the dispatcher connected now holds the config's."""
    (tmp_path / "config.toml").write_text(
        f"{CLUSTER}\n[models.mlp]\npath = 'mlp.onnx'\nsla_ms = 50\ncpu = {{ cores = 0.5 }}\n"
        '\n[models.other]\npath = "mlp.onnx"\nsla_ms = 70\ncpu = { cores = 0.5 }\n'
    )
    (tmp_path / "mlp.onnx").write_bytes((EXAMPLES / "models" / "mlp.onnx").read_bytes())
    cluster = Cluster(load_config(tmp_path / "config.toml"), on_executor=lambda _: None, on_ready_change=lambda _: None)
    assert cluster.sla_ms == {"mlp": 50.0, "other": 70.0}
    cluster.set_sla("mlp", 333.0)
    assert cluster.sla_ms == {"mlp": 333.0, "other": 70.0}


def test_a_heartbeat_timeout_no_longer_than_the_control_period_is_refused(tmp_path) -> None:
    """A worker's status, once a period, is its heartbeat: with period_s = 4 and the default
    timeout of 3 s, healthy workers were taken as down between two statuses, again and again."""
    path = tmp_path / "config.toml"
    (tmp_path / "mlp.onnx").write_bytes((EXAMPLES / "models" / "mlp.onnx").read_bytes())
    model = '\n[models.mlp]\npath = "mlp.onnx"\nsla_ms = 50\ncpu = { cores = 0.5 }\n'
    path.write_text(f"[control]\nperiod_s = 4.0\n\n{CLUSTER}{model}")
    with pytest.raises(ConfigError, match=r"cluster.heartbeat_timeout_s: 3 s must be longer than control.period_s \(4 s\)"):
        load_config(path)
    path.write_text(f"[control]\nperiod_s = 4.0\n\n{CLUSTER}heartbeat_timeout_s = 10.0\n{model}")
    assert load_config(path).cluster.heartbeat_timeout_s == 10.0
