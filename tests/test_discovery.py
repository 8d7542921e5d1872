"""Worker discovery (gateway/cluster/discovery.py): the config value, the diff of sets, and
resolution against a DNS server the test controls (tests/dns_server.py) and the system's."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import time

import pytest

from gateway.cluster.discovery import (
    Discovery,
    DiscoveryError,
    DnsServerResolver,
    DnsWorkers,
    StaticWorkers,
    SystemResolver,
    WorkerSet,
    join_host_port,
    make_resolver,
    parse_workers,
    resolve,
    split_host_port,
)
from tests.dns_server import TestDnsServer

NAME = "workers.gateway.svc.cluster.local"
INTERVAL_S = 0.2
# A change must be seen within two intervals; the rest is slack for a loaded machine.
SEEN_WITHIN_S = 2 * INTERVAL_S + 1.0


def closed_udp_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Changes:
    """A listener recording each (appeared, vanished) it is told, for a test to wait on."""

    def __init__(self) -> None:
        self.seen: asyncio.Queue[tuple[list[str], list[str]]] = asyncio.Queue()

    def __call__(self, appeared: list[str], vanished: list[str]) -> None:
        self.seen.put_nowait((appeared, vanished))

    async def next(self, within_s: float = SEEN_WITHIN_S) -> tuple[list[str], list[str]]:
        return await asyncio.wait_for(self.seen.get(), within_s)


# -- parse_workers ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([], "no workers"),
        ("worker-0:7070", 'must be "dns:NAME:PORT"'),
        (["worker-0"], "no port"),
        (["worker-0:"], "port must be a number"),
        (["worker-0:http"], "port must be a number"),
        (["worker-0:0"], "from 1 to 65535, got 0"),
        (["worker-0:70000"], "from 1 to 65535, got 70000"),
        ([":7070"], "no host"),
        (["::1:7070"], "IPv6 address in brackets"),
        (["[::1:7070"], "closed with ]"),
        (["[::1]"], "expected :PORT"),
        (["[10.0.0.1]:7070"], "only an IPv6 address"),
        (["[worker]:7070"], "not an IPv6 address"),
        (["worker 0:7070"], "not a host name"),
        (["10.0.0.300:7070"], "not a valid IPv4 address"),
        ([7070], '"HOST:PORT" string'),
        (["w:1", f"dns:{NAME}:7070"], "whole workers value"),
        ("dns:7070", 'must be "dns:NAME:PORT"'),
        ("dns::7070", 'must be "dns:NAME:PORT"'),
        (f"dns:{NAME}:", "port must be a number"),
        (f"dns:{NAME}:99999", "from 1 to 65535"),
        ("dns:10.0.0.1:7070", "not a DNS name"),
        ("dns:bad_name!:7070", "not a host name"),
    ],
)
def test_parse_workers_says_what_is_wrong(spec: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_workers(spec)  # type: ignore[arg-type]


def test_parse_static_workers_normalizes_sorts_and_dedupes() -> None:
    source = parse_workers(["worker-b:7070", "[0:0::1]:7071", "10.0.0.10:7070", "10.0.0.2:7070", "Worker-B:7070", "[::1]:7071"])
    assert source == StaticWorkers(("10.0.0.2:7070", "10.0.0.10:7070", "[::1]:7071", "worker-b:7070"))


def test_parse_dns_workers() -> None:
    source = parse_workers(f"dns:{NAME.upper()}:7070")
    assert source == DnsWorkers(NAME, 7070)
    assert str(source) == f"dns:{NAME}:7070"
    assert parse_workers("dns:workers.:7070") == DnsWorkers("workers.", 7070)


def test_host_port_round_trip() -> None:
    for text, parts in [
        ("10.0.0.1:1", ("10.0.0.1", 1)),
        ("[fd00::1]:7070", ("fd00::1", 7070)),
        ("w-0.ns:65535", ("w-0.ns", 65535)),
    ]:
        assert split_host_port(text) == parts
        assert join_host_port(*parts) == text
    assert split_host_port("10.0.0.53", default_port=53) == ("10.0.0.53", 53)
    assert split_host_port("[fd00::53]", default_port=53) == ("fd00::53", 53)


def test_make_resolver() -> None:
    assert isinstance(make_resolver(None), SystemResolver)
    resolver = make_resolver("127.0.0.1:5353")
    assert isinstance(resolver, DnsServerResolver)
    assert resolver.server == "127.0.0.1:5353"
    assert DnsServerResolver("10.96.0.10").server == "10.96.0.10:53"
    with pytest.raises(ValueError, match="must be an IP address"):
        make_resolver("kube-dns:53")


# -- WorkerSet -------------------------------------------------------------------------------


def test_worker_set_reports_what_appeared_and_vanished() -> None:
    workers = WorkerSet()
    assert workers.update(["a:1", "b:1"]) == (["a:1", "b:1"], [])
    assert workers.update(["a:1", "b:1"]) == ([], [])
    assert workers.update(["b:1", "c:1", "d:1"]) == (["c:1", "d:1"], ["a:1"])
    assert workers.update([]) == ([], ["b:1", "c:1", "d:1"])
    assert len(workers) == 0


def test_worker_set_is_order_stable_and_ignores_duplicates() -> None:
    workers = WorkerSet(["z:1", "a:1", "m:1"])
    # appeared in the order given, vanished in the order held
    assert workers.update(["y:1", "a:1", "b:1", "y:1"]) == (["y:1", "b:1"], ["z:1", "m:1"])
    assert workers.current == ["y:1", "a:1", "b:1"]
    assert "a:1" in workers and "z:1" not in workers
    # the same set in another order is no change
    assert workers.update(["b:1", "y:1", "a:1"]) == ([], [])


# -- resolution against a DNS server ---------------------------------------------------------


async def test_resolve_asks_the_dns_server() -> None:
    with TestDnsServer({NAME: ["10.1.0.10", "10.1.0.2", "10.1.0.2"]}) as dns:
        addresses = await resolve(parse_workers(f"dns:{NAME}:7070"), DnsServerResolver(dns.address))
        assert addresses == ["10.1.0.2:7070", "10.1.0.10:7070"]
        assert {(NAME, "A"), (NAME, "AAAA")} <= set(dns.queries)


async def test_resolve_a_name_that_does_not_exist_is_empty() -> None:
    with TestDnsServer({NAME: ["10.1.0.1"]}) as dns:
        resolver = DnsServerResolver(dns.address)
        assert await resolve(DnsWorkers("missing.gateway.svc.cluster.local", 7070), resolver) == []
        dns.set(NAME, [])  # the Service exists, no pod is ready
        assert await resolve(DnsWorkers(NAME, 7070), resolver) == []
        dns.remove(NAME)
        assert await resolve(DnsWorkers(NAME, 7070), resolver) == []


async def test_resolve_raises_when_the_server_is_unreachable() -> None:
    resolver = DnsServerResolver(f"127.0.0.1:{closed_udp_port()}", timeout_s=0.3)
    started = time.perf_counter()
    with pytest.raises(DiscoveryError, match="did not answer"):
        await resolve(DnsWorkers(NAME, 7070), resolver)
    assert time.perf_counter() - started < 3.0


async def test_resolve_raises_when_the_server_does_not_answer() -> None:
    with TestDnsServer({NAME: ["10.1.0.1"]}) as dns:
        dns.silent = True
        with pytest.raises(DiscoveryError, match=f"{dns.address} did not answer for {NAME}"):
            await resolve(DnsWorkers(NAME, 7070), DnsServerResolver(dns.address, timeout_s=0.3))


async def test_resolve_static_workers_asks_no_one() -> None:
    class Refuses:
        async def lookup(self, name: str) -> list[str]:
            raise AssertionError("a static list is not resolved")

    assert await resolve(parse_workers(["b:7070", "a:7070"]), Refuses()) == ["a:7070", "b:7070"]


async def test_system_resolver_resolves_localhost() -> None:
    addresses = await resolve(parse_workers("dns:localhost:7070"), SystemResolver())
    assert "127.0.0.1:7070" in addresses
    assert set(addresses) <= {"127.0.0.1:7070", "[::1]:7070"}


async def test_system_resolver_a_name_that_does_not_exist_is_empty() -> None:
    # .invalid never resolves (RFC 2606); without network access the answer is still "no such name"
    # or a failure to answer, never an address.
    try:
        assert await resolve(DnsWorkers("no-such-worker.invalid", 7070), SystemResolver(timeout_s=5)) == []
    except DiscoveryError:
        pytest.skip("the system resolver could not answer here (no DNS server reachable)")


# -- Discovery -------------------------------------------------------------------------------


async def test_discovery_reports_workers_that_appear_and_vanish() -> None:
    with TestDnsServer({NAME: ["10.1.0.1", "10.1.0.2"]}) as dns:
        changes = Changes()
        discovery = Discovery(parse_workers(f"dns:{NAME}:7070"), DnsServerResolver(dns.address), interval_s=INTERVAL_S)
        discovery.on_change(changes)
        await discovery.start()
        try:
            # the first set is told before start() returns
            assert changes.seen.get_nowait() == (["10.1.0.1:7070", "10.1.0.2:7070"], [])
            assert discovery.running

            dns.set(NAME, ["10.1.0.2", "10.1.0.3"])
            started = time.perf_counter()
            assert await changes.next() == (["10.1.0.3:7070"], ["10.1.0.1:7070"])
            assert time.perf_counter() - started < SEEN_WITHIN_S
            assert discovery.workers == ["10.1.0.2:7070", "10.1.0.3:7070"]

            dns.remove(NAME)  # the Service is gone: every worker is drained
            assert await changes.next() == ([], ["10.1.0.2:7070", "10.1.0.3:7070"])
            assert discovery.workers == []

            dns.set(NAME, ["10.1.0.4"])
            assert await changes.next() == (["10.1.0.4:7070"], [])
            # no change, nothing told
            await asyncio.sleep(3 * INTERVAL_S)
            assert changes.seen.empty()
        finally:
            await discovery.stop()
        assert not discovery.running


async def test_discovery_keeps_its_set_when_the_server_goes_away(caplog: pytest.LogCaptureFixture) -> None:
    dns = TestDnsServer({NAME: ["10.1.0.1", "10.1.0.2"]}).start()
    changes = Changes()
    discovery = Discovery(
        DnsWorkers(NAME, 7070), DnsServerResolver(dns.address, timeout_s=0.2), interval_s=INTERVAL_S, on_change=changes
    )
    try:
        await discovery.start()
        assert await changes.next() == (["10.1.0.1:7070", "10.1.0.2:7070"], [])
        dns.stop()  # its port is closed now
        with caplog.at_level(logging.WARNING, logger="gateway"):
            assert await discovery.refresh() == ([], [])
            assert isinstance(discovery.last_error, DiscoveryError)
            # the loop keeps failing, and keeps the set
            await asyncio.sleep(4 * INTERVAL_S)
        assert discovery.failures >= 2
        assert discovery.workers == ["10.1.0.1:7070", "10.1.0.2:7070"]
        assert changes.seen.empty()
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "keeping the 2 known" in r.getMessage()]
        assert len(warnings) == 1  # one warning for the outage, not one per interval
    finally:
        await discovery.stop()
        dns.stop()


async def test_discovery_resumes_after_the_server_stops_answering() -> None:
    with TestDnsServer({NAME: ["10.1.0.1"]}) as dns:
        changes = Changes()
        discovery = Discovery(
            DnsWorkers(NAME, 7070), DnsServerResolver(dns.address, timeout_s=0.2), interval_s=INTERVAL_S, on_change=changes
        )
        await discovery.start()
        try:
            await changes.next()
            dns.silent = True
            dns.set(NAME, ["10.1.0.2"])
            await asyncio.sleep(3 * INTERVAL_S)
            assert discovery.workers == ["10.1.0.1:7070"]
            assert discovery.last_error is not None
            dns.silent = False
            assert await changes.next() == (["10.1.0.2:7070"], ["10.1.0.1:7070"])
            assert discovery.last_error is None and discovery.failures == 0
        finally:
            await discovery.stop()


async def test_discovery_of_a_static_list_tells_once() -> None:
    changes = Changes()
    discovery = Discovery(parse_workers(["w1:7070", "w0:7070"]), interval_s=INTERVAL_S, on_change=changes)
    await discovery.start()
    assert changes.seen.get_nowait() == (["w0:7070", "w1:7070"], [])
    assert not discovery.running
    assert await discovery.refresh() == ([], [])
    await discovery.stop()
    assert changes.seen.empty()


async def test_discovery_refresh_resolves_now_and_runs_async_listeners_in_order() -> None:
    with TestDnsServer({NAME: ["10.1.0.1"]}) as dns:
        told: list[tuple[str, list[str], list[str]]] = []

        async def slow(appeared: list[str], vanished: list[str]) -> None:
            await asyncio.sleep(0.01)
            told.append(("slow", appeared, vanished))

        def broken(appeared: list[str], vanished: list[str]) -> None:
            raise RuntimeError("a listener's bug")

        def last(appeared: list[str], vanished: list[str]) -> None:
            told.append(("last", appeared, vanished))

        # a long interval: only refresh() resolves during the test
        discovery = Discovery(DnsWorkers(NAME, 7070), DnsServerResolver(dns.address), interval_s=60, on_change=slow)
        discovery.on_change(broken)
        discovery.on_change(last)
        await discovery.start()
        try:
            dns.set(NAME, ["10.1.0.1", "10.1.0.5"])
            assert await discovery.refresh() == (["10.1.0.5:7070"], [])
            assert told == [
                ("slow", ["10.1.0.1:7070"], []),
                ("last", ["10.1.0.1:7070"], []),
                ("slow", ["10.1.0.5:7070"], []),
                ("last", ["10.1.0.5:7070"], []),
            ]
            with pytest.raises(RuntimeError, match="already started"):
                await discovery.start()
        finally:
            await discovery.stop()


def test_discovery_needs_a_positive_interval() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        Discovery(DnsWorkers(NAME, 7070), interval_s=0)
