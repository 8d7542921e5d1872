"""Test "hosts" on one machine: each a Linux network namespace with its own address, joined to
the test's own namespace by a bridge, so that a dispatcher and several workers talk over real
TCP between distinct addresses, and a test can cut one host off without killing its processes.

    with make_hosts(3) as hosts:
        worker = hosts.popen(0, [sys.executable, "-m", "gateway", "worker", ...])
        ...  # connect to hosts.address(0) from the test; hosts reach hosts.gateway_address
        hosts.cut(0)  # host 0's link goes down: its packets are dropped, the worker lives on
        hosts.restore(0)

The layout (``Hosts``), all of it created by the harness and removed by it, even when setting
up fails half way; nothing else on the machine is touched:

    root namespace:  bridge PREFIX<tag>b  10.X.Y.1/24 (gateway_address)
                       |-- veth PREFIX<tag>v0 ==== eth0 in namespace PREFIX<tag>-h0: 10.X.Y.2/24
                       |-- veth PREFIX<tag>v1 ==== eth0 in namespace PREFIX<tag>-h1: 10.X.Y.3/24
                       ...

``<tag>`` is the process id and a letter per ``Hosts`` of the process, so that concurrent runs
and several ``Hosts`` in one run never share a name. The /24 is 10.(200 + pid % 50).<random>.0,
retried until it overlaps no address or route already on the machine.

Creating namespaces needs root (CAP_NET_ADMIN) and iproute2. Where they are missing,
``make_hosts`` gives ``LoopbackHosts``: distinct addresses on the loopback interface
(127.0.0.2, 127.0.0.3, ...), the same interface but without ``cut``. Set
GATEWAY_REQUIRE_NETNS=1 to make that fallback an error (a CI job that must test partitions).

Hosts reach each other through the bridge; if the machine has br_netfilter loaded with
bridge-nf-call-iptables=1 and an iptables FORWARD policy of DROP (as Docker sets), traffic
between hosts is dropped by the firewall: the root namespace still reaches every host.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import ipaddress
import itertools
import os
import random
import shutil
import string
import subprocess
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Protocol

REQUIRE_ENV = "GATEWAY_REQUIRE_NETNS"
NETNS_DIR = "/run/netns"  # where `ip netns add` keeps the namespaces it names
IFNAMSIZ = 15  # the kernel's limit on an interface name, without its terminating NUL
# Processes a Hosts started and still running at close get this long to end after SIGTERM.
TERMINATE_S = 3.0

_instances = itertools.count()


class HostsLike(Protocol):
    """What a test needs of its hosts, whichever kind they are."""

    n: int
    gateway_address: str
    can_cut: bool

    def address(self, i: int) -> str: ...
    def popen(self, i: int, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]: ...
    def cut(self, i: int) -> None: ...
    def restore(self, i: int) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> HostsLike: ...
    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None: ...


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """One ``ip`` command; a failure raises with the command and what ``ip`` said."""
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed ({result.returncode}): {result.stderr.strip()}")
    return result


@functools.cache
def available() -> str | None:
    """Why network namespaces cannot be used here, or None when they can.

    Tries what ``Hosts`` does, inside a throwaway namespace (a bridge and a veth pair made there
    vanish with it), so that a kernel without veth or bridge support is found before a test
    starts rather than half way through its setup."""
    if os.geteuid() != 0:
        return "not root: network namespaces and veth pairs need CAP_NET_ADMIN"
    if shutil.which("ip") is None:
        return "no `ip` command (install iproute2)"
    if shutil.which("nsenter") is None:
        return "no `nsenter` command (install util-linux)"
    probe = f"gwprobe{os.getpid()}-{random.getrandbits(32):08x}"
    try:
        added = _ip("netns", "add", probe, check=False)
        if added.returncode != 0:
            return f"`ip netns add` failed: {added.stderr.strip()}"
        for args in (("link", "add", "br0", "type", "bridge"), ("link", "add", "v0", "type", "veth", "peer", "name", "v1")):
            made = _ip("-n", probe, *args, check=False)
            if made.returncode != 0:
                return f"`ip {' '.join(args)}` failed in a namespace: {made.stderr.strip()}"
    except (OSError, subprocess.SubprocessError) as error:
        return f"`ip` could not be run: {error}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def _letters(k: int) -> str:
    """0 -> a, 25 -> z, 26 -> ba: a suffix that cannot run into the digits of a process id."""
    out = string.ascii_lowercase[k % 26]
    while k >= 26:
        k //= 26
        out = string.ascii_lowercase[k % 26] + out
    return out


def _used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the machine has an address in or a route to (any table)."""
    networks = []
    for line in _ip("-4", "-o", "addr", "show").stdout.splitlines():
        fields = line.split()
        if "inet" in fields:
            networks.append(ipaddress.IPv4Interface(fields[fields.index("inet") + 1]).network)
    for line in _ip("-4", "route", "show", "table", "all").stdout.splitlines():
        fields = line.split()
        if fields and fields[0] in ("broadcast", "local", "unicast", "multicast", "blackhole", "unreachable", "prohibit"):
            fields = fields[1:]
        if fields and fields[0] != "default":
            with contextlib.suppress(ValueError):
                networks.append(ipaddress.IPv4Network(fields[0], strict=False))
    return networks


def _free_subnet(rng: random.Random) -> ipaddress.IPv4Network:
    used = _used_networks()
    second = 200 + os.getpid() % 50
    for third in rng.sample(range(256), 256):
        subnet = ipaddress.IPv4Network(f"10.{second}.{third}.0/24")
        if not any(subnet.overlaps(network) for network in used):
            return subnet
    raise RuntimeError(f"no free /24 in 10.{second}.0.0/16: every one overlaps an address or a route of this machine")


class Hosts:
    """``n`` hosts in network namespaces, bridged to the root namespace (see the module's doc).
    A context manager: entering creates everything, leaving deletes everything it created and
    stops the processes its ``popen`` started that are still running."""

    can_cut = True

    def __init__(self, n: int, prefix: str = "gw") -> None:
        if not 1 <= n <= 250:
            raise ValueError(f"from 1 to 250 hosts fit in a /24 with the bridge, got {n}")
        self.n = n
        tag = f"{prefix}{os.getpid()}{_letters(next(_instances))}"
        self.bridge = f"{tag}b"
        self.veths = [f"{tag}v{i}" for i in range(n)]
        self.namespaces = [f"{tag}-h{i}" for i in range(n)]
        too_long = [name for name in (self.bridge, *self.veths) if len(name) > IFNAMSIZ]
        if too_long:
            raise ValueError(
                f"interface names longer than {IFNAMSIZ} characters: {too_long}; use a shorter prefix than {prefix!r}"
            )
        self.subnet: ipaddress.IPv4Network | None = None
        self._created: list[tuple[str, str]] = []  # ("link" | "netns", name), in order of creation
        self._processes: list[subprocess.Popen[Any]] = []
        self._closed = False

    # -- addresses ---------------------------------------------------------------------------

    def _host(self, offset: int) -> str:
        if self.subnet is None:
            raise RuntimeError("the hosts are not set up: use `with Hosts(n) as hosts:`")
        return str(self.subnet.network_address + offset)

    @property
    def gateway_address(self) -> str:
        """The bridge's address in the root namespace: bind here to be reached from the hosts."""
        return self._host(1)

    def address(self, i: int) -> str:
        """Host ``i``'s address (10.X.Y.(i + 2))."""
        self._check(i)
        return self._host(i + 2)

    def namespace(self, i: int) -> str:
        self._check(i)
        return self.namespaces[i]

    def _check(self, i: int) -> None:
        if not 0 <= i < self.n:
            raise IndexError(f"host {i} of {self.n}")

    # -- processes and links -----------------------------------------------------------------

    def enter(self, i: int) -> list[str]:
        """The command prefix that runs a program in host ``i``'s network namespace, and in it alone.

        Not ``ip netns exec``: it also unshares the mount namespace and mounts a fresh /sys, which
        has no cgroup hierarchies under /sys/fs/cgroup, so a worker started that way could only
        fall back to CPU affinity. A pod keeps the node's cgroups (the worker DaemonSet mounts
        them); ``nsenter --net`` keeps them too. It execs the program: a Popen's pid is its own."""
        self._check(i)
        return ["nsenter", f"--net={NETNS_DIR}/{self.namespace(i)}", "--"]

    def popen(self, i: int, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Run ``argv`` inside host ``i``. Takes subprocess.Popen's keyword arguments."""
        process = subprocess.Popen([*self.enter(i), *argv], **kwargs)
        self._processes.append(process)
        return process

    def run(self, i: int, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """Run ``argv`` inside host ``i`` to its end (subprocess.run's keyword arguments)."""
        return subprocess.run([*self.enter(i), *argv], **kwargs)

    def cut(self, i: int) -> None:
        """Partition host ``i``: its bridge port goes down, so every packet to or from it is
        dropped silently (connects time out, as across a dead switch) while its processes run on."""
        self._check(i)
        _ip("link", "set", self.veths[i], "down")

    def restore(self, i: int) -> None:
        """Undo ``cut(i)``. Connections that outlived the cut resume when TCP retransmits."""
        self._check(i)
        _ip("link", "set", self.veths[i], "up")

    # -- life --------------------------------------------------------------------------------

    def __enter__(self) -> Hosts:
        try:
            self._set_up()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.close()

    def _set_up(self) -> None:
        # Close at exit too, should the test process end without leaving the `with` (an uncaught
        # signal ends it without either, which nothing in the process can help).
        atexit.register(self.close)
        self.subnet = _free_subnet(random.Random())
        prefix = f"/{self.subnet.prefixlen}"
        _ip("link", "add", self.bridge, "type", "bridge", "stp_state", "0", "forward_delay", "0")
        self._created.append(("link", self.bridge))
        _ip("addr", "add", self.gateway_address + prefix, "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, (namespace, veth) in enumerate(zip(self.namespaces, self.veths, strict=True)):
            _ip("netns", "add", namespace)
            self._created.append(("netns", namespace))
            # The pair's other end is made inside the namespace, named eth0 as on a real host.
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", namespace)
            self._created.append(("link", veth))
            _ip("link", "set", veth, "master", self.bridge)
            _ip("link", "set", veth, "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
            _ip("-n", namespace, "addr", "add", self.address(i) + prefix, "dev", "eth0")
            _ip("-n", namespace, "link", "set", "eth0", "up")
            # The root namespace's other addresses are reached through the bridge too.
            _ip("-n", namespace, "route", "add", "default", "via", self.gateway_address)

    def close(self) -> None:
        """Stop the processes started here, then delete what was created, newest first. Each
        step is tried even when an earlier one failed; the first failure is raised at the end."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        for process in self._processes:
            if process.poll() is None:
                process.terminate()
        for process in self._processes:
            try:
                process.wait(TERMINATE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        failures = []
        for kind, name in reversed(self._created):
            # A veth's end inside a namespace goes with its pair, and a namespace's loopback with it.
            result = _ip("link", "del", name, check=False) if kind == "link" else _ip("netns", "del", name, check=False)
            if result.returncode != 0:
                failures.append(f"{kind} {name}: {result.stderr.strip()}")
        self._created.clear()
        if failures:
            raise RuntimeError(f"could not delete what the test hosts created: {'; '.join(failures)}")


class LoopbackHosts:
    """The fallback without namespaces: host ``i`` is 127.0.0.(i + 2) on this machine's loopback
    (Linux answers on all of 127.0.0.0/8), and processes run directly. Distinct addresses, but one
    interface shared with the test, hence no ``cut``."""

    can_cut = False
    gateway_address = "127.0.0.1"

    def __init__(self, n: int) -> None:
        if not 1 <= n <= 253:
            raise ValueError(f"from 1 to 253 loopback hosts (127.0.0.2-127.0.0.254), got {n}")
        self.n = n
        self._processes: list[subprocess.Popen[Any]] = []
        self._closed = False

    def address(self, i: int) -> str:
        if not 0 <= i < self.n:
            raise IndexError(f"host {i} of {self.n}")
        return f"127.0.0.{i + 2}"

    def popen(self, i: int, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        self.address(i)
        process = subprocess.Popen(list(argv), **kwargs)
        self._processes.append(process)
        return process

    def run(self, i: int, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        self.address(i)
        return subprocess.run(list(argv), **kwargs)

    def cut(self, i: int) -> None:
        raise NotImplementedError(
            "loopback hosts share the loopback interface with the test itself: there is no link of host "
            f"{i} alone to take down; partitions need network namespaces ({available() or 'see tests/netns.py'})"
        )

    def restore(self, i: int) -> None:
        raise NotImplementedError("loopback hosts cannot be cut, so there is nothing to restore")

    def __enter__(self) -> LoopbackHosts:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for process in self._processes:
            if process.poll() is None:
                process.terminate()
        for process in self._processes:
            try:
                process.wait(TERMINATE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def make_hosts(n: int, prefix: str = "gw") -> Hosts | LoopbackHosts:
    """Hosts in network namespaces where they can be made, loopback addresses otherwise; with
    GATEWAY_REQUIRE_NETNS=1 the fallback is an error naming why namespaces cannot be used."""
    reason = available()
    if reason is None:
        return Hosts(n, prefix=prefix)
    if os.environ.get(REQUIRE_ENV) == "1":
        raise RuntimeError(f"{REQUIRE_ENV}=1 but network namespaces cannot be used: {reason}")
    return LoopbackHosts(n)
