"""Which workers the dispatcher schedules over: a static list, or a Kubernetes headless Service.

``[cluster] workers`` is either a list of "HOST:PORT" (a fixed set of nodes) or one string
"dns:NAME:PORT". A headless Service (``clusterIP: None``) has no virtual address: its DNS name
answers with one A (or AAAA) record per ready pod, so resolving it again and again is how the
dispatcher learns that a worker pod started or went away (Kubernetes places and restarts the
pods; the gateway does not manage machines).

The parts, as elsewhere in the gateway, keep the rules apart from the clock and the sockets:

- ``parse_workers`` checks the config value and says what is wrong with it;
- ``resolve`` turns a source into sorted "HOST:PORT" addresses, through a ``Resolver``: the
  system's (what a pod uses, /etc/resolv.conf and its search list) or one DNS server asked
  directly (``[cluster] dns_server``);
- ``WorkerSet`` is the diff alone: addresses in, (appeared, vanished) out, no clock, no I/O;
- ``Discovery`` drives them on the event loop and tells listeners what changed.

A name that does not exist (NXDOMAIN, or a name without addresses) is an empty set: a Service
scaled to zero pods answers so, and its workers must then be drained. A DNS server that does not
answer is not: ``DiscoveryError`` is raised and ``Discovery`` keeps the set it has, because
draining every worker on a lost UDP packet or a restarting CoreDNS would stop a healthy cluster.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import ipaddress
import logging
import re
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias

import dns.asyncresolver
import dns.exception
import dns.resolver

log = logging.getLogger("gateway")

# A headless Service's records carry a TTL of 5 s by default in CoreDNS (its `kubernetes`
# plugin's `ttl`, 5-30 s in practice): asking more often sees nothing new, asking less often
# leaves a new worker idle for longer.
DEFAULT_INTERVAL_S = 5.0
# A cluster's DNS answers in milliseconds; 3 s rides out a lost UDP packet (dnspython sends the
# query again every DNS_TRY_S) and still ends before the next resolution is due.
DEFAULT_TIMEOUT_S = 3.0
DNS_TRY_S = 1.0
DNS_PORT = 53
DNS_PREFIX = "dns:"

_LABEL = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")


class DiscoveryError(Exception):
    """The workers could not be resolved this time (a DNS server did not answer or failed).

    Not raised for a name that does not exist: that is an answer (no workers)."""


@dataclass(frozen=True)
class StaticWorkers:
    """A fixed list of "HOST:PORT". A host name in it is looked up by each connection, not here:
    an entry is one worker whatever address its name points to later."""

    addresses: tuple[str, ...]


@dataclass(frozen=True)
class DnsWorkers:
    """A DNS name whose A and AAAA records are the workers, all listening on ``port``."""

    name: str
    port: int

    def __str__(self) -> str:
        return f"{DNS_PREFIX}{self.name}:{self.port}"


WorkerSource: TypeAlias = StaticWorkers | DnsWorkers
Listener: TypeAlias = Callable[[list[str], list[str]], Awaitable[None] | None]


# -- config values ---------------------------------------------------------------------------


def parse_workers(spec: str | Sequence[str]) -> WorkerSource:
    """The ``[cluster] workers`` value: a list of "HOST:PORT" (IPv6 as "[::1]:7070"), or the
    string "dns:NAME:PORT". Raises ValueError naming the entry at fault and what is wrong."""
    if isinstance(spec, str):
        if not spec.startswith(DNS_PREFIX):
            raise ValueError(
                f'a single string must be "dns:NAME:PORT" (a headless Service), got {spec!r}; '
                f'list static workers as ["HOST:PORT", ...]'
            )
        name, colon, port = spec[len(DNS_PREFIX) :].rpartition(":")
        if not colon or not name:
            raise ValueError(f'must be "dns:NAME:PORT", such as "dns:workers.gateway.svc.cluster.local:7070", got {spec!r}')
        if _is_ip(name.strip("[]")):
            raise ValueError(f"{spec!r}: {name} is an address, not a DNS name; list it as a static worker instead")
        _check_host_name(name, spec)
        return DnsWorkers(name.lower(), _port(port, spec))
    if not isinstance(spec, Sequence):
        raise ValueError(f'workers must be a list of "HOST:PORT" or a "dns:NAME:PORT" string, got {type(spec).__name__}')
    if not spec:
        raise ValueError('no workers: list at least one "HOST:PORT", or give "dns:NAME:PORT"')
    addresses = []
    for entry in spec:
        if not isinstance(entry, str):
            raise ValueError(f'each worker must be a "HOST:PORT" string, got {entry!r}')
        if entry.startswith(DNS_PREFIX):
            raise ValueError(f'{entry!r}: a "dns:NAME:PORT" source is the whole workers value, not an entry of a list')
        host, port = split_host_port(entry)
        addresses.append(join_host_port(host, port))
    return StaticWorkers(tuple(_sorted_unique(addresses)))


def split_host_port(text: str, default_port: int | None = None) -> tuple[str, int]:
    """("host", port) from "HOST:PORT"; an IPv6 host in brackets ("[::1]:7070"). IP literals come
    back in their short form and names in lower case, so that one worker has one spelling."""
    if text != text.strip() or not text:
        raise ValueError(f"not HOST:PORT: {text!r} is empty or has spaces around it")
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket:
            raise ValueError(f"{text!r}: an IPv6 address opened with [ must be closed with ]")
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"{text!r}: {host!r} in brackets is not an IPv6 address") from None
        if address.version != 6:
            raise ValueError(f"{text!r}: only an IPv6 address goes in brackets")
        if not rest and default_port is not None:
            return address.compressed, default_port
        if not rest.startswith(":"):
            raise ValueError(f"{text!r}: expected :PORT after the ], such as [::1]:7070")
        return address.compressed, _port(rest[1:], text)
    host, colon, port = text.rpartition(":")
    if ":" in host:
        raise ValueError(f"{text!r}: write an IPv6 address in brackets, such as [::1]:7070")
    if not colon:
        if default_port is None:
            raise ValueError(f"not HOST:PORT (no port): {text!r}; such as worker-0:7070 or 10.0.0.5:7070")
        host, port = text, str(default_port)
    if not host:
        raise ValueError(f"not HOST:PORT (no host): {text!r}")
    if _is_ip(host):
        return ipaddress.ip_address(host).compressed, _port(port, text)
    _check_host_name(host, text)
    return host.lower(), _port(port, text)


def join_host_port(host: str, port: int) -> str:
    """The address as "HOST:PORT", with an IPv6 host in brackets (what ``split_host_port`` reads back)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _port(text: str, whole: str) -> int:
    if not text.isascii() or not text.isdigit():
        raise ValueError(f"{whole!r}: the port must be a number from 1 to 65535, got {text!r}")
    port = int(text)
    if not 1 <= port <= 65535:
        raise ValueError(f"{whole!r}: the port must be from 1 to 65535, got {port}")
    return port


def _check_host_name(name: str, whole: str) -> None:
    """RFC 1123 host names (letters, digits, hyphens; labels of 1-63 characters, 253 in all),
    with underscores allowed as in SRV-style and some Kubernetes names."""
    labels = name[:-1].split(".") if name.endswith(".") else name.split(".")
    if len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise ValueError(f"{whole!r}: {name!r} is not a host name (letters, digits, '-' and '.', labels of 1-63 characters)")
    if all(label.isdigit() for label in labels):
        raise ValueError(f"{whole!r}: {name!r} is not a valid IPv4 address")


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _sort_key(address: str) -> tuple[int, int, str, int]:
    """IPv4 before IPv6 before names, addresses in numeric order (10.0.0.2 before 10.0.0.10)."""
    host, port = split_host_port(address)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return (2, 0, host, port)
    return (0 if ip.version == 4 else 1, int(ip), "", port)


def _sorted_unique(addresses: Iterable[str]) -> list[str]:
    return sorted(set(addresses), key=_sort_key)


# -- resolution ------------------------------------------------------------------------------


class Resolver(Protocol):
    """Where a DNS name's addresses come from."""

    async def lookup(self, name: str) -> list[str]:
        """The IPv4 and IPv6 addresses of ``name``; [] when it does not exist or has none.
        Raises DiscoveryError when the answer could not be had."""
        ...


class SystemResolver:
    """The system's resolver (getaddrinfo in a thread, A and AAAA): what a pod uses, with the
    search list of its /etc/resolv.conf, so "workers" finds "workers.NAMESPACE.svc.cluster.local".

    glibc retries a dead server for up to ``timeout x attempts`` per search domain and its thread
    cannot be cancelled, so a lookup still running is joined rather than started again: a DNS
    outage holds one thread per name, not one more every interval."""

    def __init__(self, timeout_s: float = 2 * DEFAULT_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._running: dict[str, asyncio.Future[list[tuple]]] = {}

    def __repr__(self) -> str:
        return "SystemResolver()"

    async def lookup(self, name: str) -> list[str]:
        loop = asyncio.get_running_loop()
        running = self._running.get(name)
        if running is None or running.get_loop() is not loop:
            running = asyncio.ensure_future(loop.getaddrinfo(name, None, family=socket.AF_UNSPEC, type=socket.SOCK_STREAM))
            self._running[name] = running
            running.add_done_callback(functools.partial(self._finished, name))
        try:
            infos = await asyncio.wait_for(asyncio.shield(running), self.timeout_s)
        except TimeoutError:
            raise DiscoveryError(f"the system resolver did not answer for {name} within {self.timeout_s:g} s") from None
        except socket.gaierror as error:
            if error.errno in _NO_SUCH_NAME:
                return []
            raise DiscoveryError(f"the system resolver failed for {name}: {error.strerror or error}") from None
        except OSError as error:
            raise DiscoveryError(f"the system resolver failed for {name}: {error}") from None
        return [str(sockaddr[0]) for family, *_, sockaddr in infos if family in (socket.AF_INET, socket.AF_INET6)]

    def _finished(self, name: str, future: asyncio.Future[list[tuple]]) -> None:
        if self._running.get(name) is future:
            del self._running[name]
        if not future.cancelled():
            future.exception()  # read, so that one ending after its waiter gave up is not reported as never retrieved


# getaddrinfo's answers for "no such name" and "a name without addresses"; EAI_AGAIN (server
# failure or timeout) and EAI_FAIL are failures to answer.
_NO_SUCH_NAME = {socket.EAI_NONAME} | ({socket.EAI_NODATA} if hasattr(socket, "EAI_NODATA") else set())


class DnsServerResolver:
    """One DNS server asked directly ("IP:PORT", port 53 if left out), over UDP with dnspython,
    for A and AAAA records. No search list: give the full name
    (workers.NAMESPACE.svc.cluster.local). No cache: each lookup asks the server, since a
    resolution is wanted exactly when the set may have changed."""

    def __init__(self, server: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        host, port = split_host_port(server, default_port=DNS_PORT)
        if not _is_ip(host):
            raise ValueError(f"the DNS server must be an IP address (IP:PORT), got {server!r}")
        self.server = join_host_port(host, port)
        self.timeout_s = timeout_s
        self._resolver = dns.asyncresolver.Resolver(configure=False)
        self._resolver.nameservers = [host]
        self._resolver.port = port
        self._resolver.timeout = min(DNS_TRY_S, timeout_s)
        self._resolver.lifetime = timeout_s
        self._resolver.cache = None

    def __repr__(self) -> str:
        return f"DnsServerResolver({self.server!r})"

    async def lookup(self, name: str) -> list[str]:
        # Both queries run to their end (no cancelled task left behind); one failure fails the
        # lookup, since half an answer would drain the workers of the other family.
        answers = await asyncio.gather(self._query(name, "A"), self._query(name, "AAAA"), return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
        return [address for answer in answers if isinstance(answer, list) for address in answer]

    async def _query(self, name: str, rdtype: str) -> list[str]:
        try:
            answer = await self._resolver.resolve(name, rdtype, search=False, raise_on_no_answer=False)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return []
        except dns.exception.Timeout:
            raise DiscoveryError(
                f"DNS server {self.server} did not answer for {name} ({rdtype}) within {self.timeout_s:g} s"
            ) from None
        except dns.resolver.NoNameservers as error:
            # SERVFAIL or REFUSED. (A closed port is a timeout: dnspython's UDP socket is not
            # connected, so the ICMP port-unreachable never reaches it.)
            raise DiscoveryError(f"DNS server {self.server} failed for {name} ({rdtype}): {error}") from None
        except (dns.exception.DNSException, OSError) as error:
            raise DiscoveryError(f"DNS server {self.server} failed for {name} ({rdtype}): {error}") from None
        if answer.rrset is None:
            return []
        return [rdata.address for rdata in answer.rrset]


def make_resolver(dns_server: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> Resolver:
    """The resolver ``[cluster] dns_server`` asks for: that server, or the system's if unset."""
    if dns_server is None:
        return SystemResolver(timeout_s=2 * timeout_s)
    return DnsServerResolver(dns_server, timeout_s=timeout_s)


async def resolve(source: WorkerSource, resolver: Resolver | None = None) -> list[str]:
    """The workers' "HOST:PORT" addresses, sorted and without duplicates.

    A static list comes back as written (normalized). A dns: name that does not exist or has no
    records gives []: the Service has no ready pod, and its workers are to be drained. A server
    that does not answer raises DiscoveryError instead, so that the caller keeps the last good
    set rather than draining every worker on a DNS hiccup."""
    if isinstance(source, StaticWorkers):
        return _sorted_unique(source.addresses)
    addresses = await (resolver or SystemResolver()).lookup(source.name)
    return _sorted_unique(
        join_host_port(ipaddress.ip_address(host).compressed if _is_ip(host) else host, source.port) for host in addresses
    )


# -- the set and its changes -----------------------------------------------------------------


class WorkerSet:
    """The current workers and what changed: no clock and no I/O, so every rule is a function
    call in a test. Order-stable: appeared in the order given, vanished in the order held."""

    def __init__(self, addresses: Iterable[str] = ()) -> None:
        self._current: list[str] = list(dict.fromkeys(addresses))

    @property
    def current(self) -> list[str]:
        return list(self._current)

    def __contains__(self, address: object) -> bool:
        return address in self._current

    def __len__(self) -> int:
        return len(self._current)

    def update(self, addresses: Iterable[str]) -> tuple[list[str], list[str]]:
        """Take ``addresses`` as the new set; returns (appeared, vanished) against the last one."""
        new = list(dict.fromkeys(addresses))
        new_keys, old_keys = set(new), set(self._current)
        appeared = [address for address in new if address not in old_keys]
        vanished = [address for address in self._current if address not in new_keys]
        self._current = new
        return appeared, vanished


class Discovery:
    """Resolves ``source`` every ``interval_s`` on the event loop and tells listeners
    ``on_change(appeared, vanished)``; a static list is told once, at ``start()``.

    A ``DiscoveryError`` (DNS server down or slow) is logged and the current set is kept: a
    worker that really went away is noticed by its connection, and the DNS will agree later.
    Listeners run one change at a time, in order; they may be coroutines, and must not await
    ``refresh()`` themselves (that would wait on the change they are handling)."""

    def __init__(
        self,
        source: WorkerSource,
        resolver: Resolver | None = None,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        on_change: Listener | None = None,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.source = source
        self.resolver: Resolver = resolver if resolver is not None else SystemResolver()
        self.interval_s = interval_s
        self.last_error: DiscoveryError | None = None
        self.failures = 0  # resolutions failed in a row
        self._listeners: list[Listener] = [] if on_change is None else [on_change]
        self._set = WorkerSet()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    @property
    def workers(self) -> list[str]:
        """The current set, in the order resolved (sorted)."""
        return self._set.current

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def on_change(self, listener: Listener) -> None:
        """Add a listener; one added after ``start()`` hears only of later changes."""
        self._listeners.append(listener)

    async def start(self) -> None:
        """Resolve once (listeners hear of the first set before this returns), then, for a dns:
        source, again every ``interval_s`` until ``stop()``."""
        if self._task is not None:
            raise RuntimeError("discovery already started")
        await self.refresh()
        if isinstance(self.source, DnsWorkers):
            self._task = asyncio.create_task(self._run(), name=f"discovery {self.source}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise

    async def refresh(self) -> tuple[list[str], list[str]]:
        """Resolve now and tell listeners what changed; returns (appeared, vanished). On a
        DiscoveryError the set is kept, a warning logged, ``last_error`` set and ([], []) returned."""
        async with self._lock:
            try:
                addresses = await resolve(self.source, self.resolver)
            except DiscoveryError as error:
                self._failed(error)
                return [], []
            if self.failures:
                log.info("workers of %s resolved again after %d failed resolutions", self.source, self.failures)
            self.failures, self.last_error = 0, None
            appeared, vanished = self._set.update(addresses)
            if appeared or vanished:
                log.info(
                    "workers of %s: %d appeared %s, %d vanished %s", self.source, len(appeared), appeared, len(vanished), vanished
                )
                await self._tell(appeared, vanished)
            return appeared, vanished

    def _failed(self, error: DiscoveryError) -> None:
        # One warning when resolution starts failing (or fails differently), not one per interval
        # for as long as the DNS is down.
        if self.last_error is None or str(error) != str(self.last_error):
            log.warning("cannot resolve the workers of %s, keeping the %d known: %s", self.source, len(self._set), error)
        self.failures += 1
        self.last_error = error

    async def _tell(self, appeared: list[str], vanished: list[str]) -> None:
        for listener in list(self._listeners):
            try:
                result = listener(list(appeared), list(vanished))
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("a listener of worker discovery failed on appeared=%s vanished=%s", appeared, vanished)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.refresh()
            except Exception:
                # A bug in a resolver must not end discovery for good: try again next interval.
                log.exception("worker discovery of %s failed", self.source)
