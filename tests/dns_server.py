"""A small authoritative DNS server that a test controls, standing in for a cluster's DNS.

It answers A queries from a table of name -> IPv4 addresses that the test changes while the
server runs, as CoreDNS answers for a headless Service whose pods come and go. A name in the
table without an A answer for the type asked (AAAA, say) gets NOERROR with no records; a name
not in the table gets NXDOMAIN, as a deleted Service does. ``silent`` drops every query, for a
server that is up but does not answer (a timeout rather than a refused port).

    with TestDnsServer({"workers.test": ["10.0.0.1"]}) as dns:
        resolver = DnsServerResolver(dns.address)
        dns.set("workers.test", ["10.0.0.1", "10.0.0.2"])
"""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Iterable, Mapping
from types import TracebackType

from dnslib import QTYPE, RCODE, RR, A, DNSRecord
from dnslib.server import BaseResolver, DNSHandler, DNSLogger, DNSServer

TTL_S = 5  # CoreDNS's default for a Service's records


def _key(name: str) -> str:
    """Names compare without case and without the root's trailing dot, as DNS compares them."""
    return name.rstrip(".").lower()


class _TableResolver(BaseResolver):
    def __init__(self, owner: TestDnsServer) -> None:
        self.owner = owner

    def resolve(self, request: DNSRecord, handler: DNSHandler) -> DNSRecord:
        reply = request.reply()  # sets qr, aa (authoritative) and rd
        qname = request.q.qname
        addresses = self.owner.get(str(qname))
        if addresses is None:
            reply.header.rcode = RCODE.NXDOMAIN
        elif request.q.qtype in (QTYPE.A, QTYPE.ANY):
            for address in addresses:
                reply.add_answer(RR(qname, QTYPE.A, rdata=A(address), ttl=TTL_S))
        with self.owner._lock:
            self.owner.queries.append((_key(str(qname)), QTYPE[request.q.qtype]))
        return reply


class _Handler(DNSHandler):
    def handle(self) -> None:
        if self.server.resolver.owner.silent:
            return
        super().handle()


class _QuietLogger(DNSLogger):
    """dnslib prints every query by default; a test's output has no use for them."""

    def __init__(self) -> None:
        super().__init__(log="-request,-reply,-truncated,-error", prefix=False, logf=lambda _line: None)


class TestDnsServer:
    """UDP on 127.0.0.1 and a free port (``address`` is "127.0.0.1:PORT"), served by a thread.
    ``set``/``remove``/``get`` and ``silent`` may be used from any thread while it runs."""

    __test__ = False  # a helper, not a test class for pytest to collect

    def __init__(self, records: Mapping[str, Iterable[str]] | None = None, host: str = "127.0.0.1") -> None:
        self._lock = threading.Lock()
        self._records: dict[str, list[str]] = {}
        self.silent = False
        self.queries: list[tuple[str, str]] = []  # (name, type) of every query answered
        for name, addresses in (records or {}).items():
            self.set(name, addresses)
        self._server = DNSServer(_TableResolver(self), address=host, port=0, logger=_QuietLogger(), handler=_Handler)
        self.host, self.port = self._server.server.server_address[:2]
        self._started = False

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def set(self, name: str, addresses: Iterable[str]) -> None:
        """Make ``name`` answer with ``addresses`` (IPv4); an empty list: the name exists, no records."""
        checked = [str(ipaddress.IPv4Address(address)) for address in addresses]
        with self._lock:
            self._records[_key(name)] = checked

    def remove(self, name: str) -> None:
        """Make ``name`` answer NXDOMAIN."""
        with self._lock:
            self._records.pop(_key(name), None)

    def get(self, name: str) -> list[str] | None:
        with self._lock:
            addresses = self._records.get(_key(name))
            return None if addresses is None else list(addresses)

    def start(self) -> TestDnsServer:
        self._server.start_thread()
        self._started = True
        return self

    def stop(self) -> None:
        if self._started:
            self._server.stop()  # shutdown(): ends serve_forever within its 0.5 s poll
            self._server.thread.join(timeout=5)
            self._started = False
        self._server.server.server_close()

    def __enter__(self) -> TestDnsServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.stop()
