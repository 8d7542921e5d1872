"""The multi-host harness (tests/netns.py): hosts reach each other and the root namespace over
TCP, a cut host drops packets while its processes live on, and nothing is left behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from tests.netns import REQUIRE_ENV, Hosts, LoopbackHosts, available, make_hosts

# Listens on argv[1], port 0; prints the port once listening, then echoes every connection.
ECHO_SERVER = r"""
import socket, sys, threading
server = socket.create_server((sys.argv[1], 0))
print(server.getsockname()[1], flush=True)
def echo(conn):
    with conn:
        while data := conn.recv(4096):
            conn.sendall(data)
while True:
    conn, _ = server.accept()
    threading.Thread(target=echo, args=(conn,), daemon=True).start()
"""

# Connects to argv[1]:argv[2], sends argv[3], prints the echo.
ECHO_CLIENT = r"""
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5) as conn:
    conn.sendall(sys.argv[3].encode())
    print(conn.recv(4096).decode(), flush=True)
"""


def needs_namespaces() -> None:
    reason = available()
    if reason is not None:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but network namespaces cannot be used: {reason}")
        pytest.skip(f"network namespaces cannot be used here: {reason}")


def start_echo(hosts: Hosts | LoopbackHosts, i: int) -> tuple[subprocess.Popen[str], int]:
    server = hosts.popen(i, [sys.executable, "-c", ECHO_SERVER, hosts.address(i)], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    line = server.stdout.readline()
    assert line.strip().isdigit(), f"the echo server did not start (exit {server.poll()})"
    return server, int(line)


def echo(address: str, port: int, message: bytes = b"ping", timeout_s: float = 2.0) -> bytes:
    with socket.create_connection((address, port), timeout=timeout_s) as conn:
        conn.sendall(message)
        return conn.recv(4096)


def ip_names() -> tuple[set[str], set[str]]:
    """The interface names of the root namespace, and the names of the namespaces."""
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    interfaces = {line.split(":")[1].strip().split("@")[0] for line in links.splitlines()}
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    namespaces = {line.split()[0] for line in listed.splitlines() if line.strip()}
    return interfaces, namespaces


def test_three_hosts_reach_each_other_and_a_cut_host_is_unreachable() -> None:
    needs_namespaces()
    interfaces_before, namespaces_before = ip_names()
    with make_hosts(3) as hosts:
        assert isinstance(hosts, Hosts)
        addresses = {hosts.gateway_address, *(hosts.address(i) for i in range(3))}
        assert len(addresses) == 4
        created_interfaces, created_namespaces = {hosts.bridge, *hosts.veths}, set(hosts.namespaces)
        interfaces, namespaces = ip_names()
        assert created_interfaces <= interfaces and created_namespaces <= namespaces

        server, port = start_echo(hosts, 0)
        # from the root namespace
        assert echo(hosts.address(0), port) == b"ping"
        # from another host, across the bridge
        client = hosts.run(
            1, [sys.executable, "-c", ECHO_CLIENT, hosts.address(0), str(port), "from host 1"], capture_output=True, text=True
        )
        assert client.returncode == 0, client.stderr
        assert client.stdout.strip() == "from host 1"
        # the server is in its own namespace: not on the root namespace's loopback
        with pytest.raises(OSError):
            echo("127.0.0.1", port, timeout_s=1)

        hosts.cut(0)
        started = time.perf_counter()
        with pytest.raises(OSError):  # a timeout, or the neighbour found unreachable
            echo(hosts.address(0), port, timeout_s=1)
        assert time.perf_counter() - started < 5
        assert server.poll() is None, "cutting a host must not end its processes"
        # the other hosts are still reached
        other, other_port = start_echo(hosts, 2)
        assert echo(hosts.address(2), other_port) == b"ping"

        hosts.restore(0)
        deadline = time.monotonic() + 10
        while True:
            try:
                assert echo(hosts.address(0), port, b"again") == b"again"
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    assert server.poll() is not None and other.poll() is not None, "leaving the hosts stops their processes"
    interfaces_after, namespaces_after = ip_names()
    assert not created_interfaces & interfaces_after
    assert not created_namespaces & namespaces_after
    assert interfaces_after == interfaces_before
    assert namespaces_after == namespaces_before


def test_a_host_reaches_the_root_namespace_at_the_gateway_address() -> None:
    needs_namespaces()
    with make_hosts(1) as hosts, socket.create_server((hosts.gateway_address, 0)) as server:
        port = server.getsockname()[1]
        client = hosts.popen(
            0, [sys.executable, "-c", ECHO_CLIENT, hosts.gateway_address, str(port), "hello"], stdout=subprocess.PIPE, text=True
        )
        server.settimeout(10)
        conn, (peer, _) = server.accept()
        with conn:
            assert peer == hosts.address(0)
            conn.sendall(conn.recv(4096))
        out, _ = client.communicate(timeout=10)
        assert out.strip() == "hello"


def test_a_host_shares_the_machines_cgroups_as_a_pod_shares_its_nodes() -> None:
    """A worker on a host must set its executors' CPU quotas as it would in a pod: the host's
    processes see the same cgroup hierarchies as the root namespace (``ip netns exec`` would
    mount a fresh /sys without them), in a network namespace of their own."""
    needs_namespaces()
    here = sorted(os.listdir("/sys/fs/cgroup"))
    assert here, "this machine has no cgroup hierarchy to compare with"
    with make_hosts(1) as hosts:
        listed = hosts.run(0, ["ls", "/sys/fs/cgroup"], capture_output=True, text=True, check=True).stdout.split()
        net = hosts.run(0, ["readlink", "/proc/self/ns/net"], capture_output=True, text=True, check=True).stdout.strip()
    assert sorted(listed) == here
    assert net != os.readlink("/proc/self/ns/net")


def test_cleanup_removes_everything_when_the_test_fails() -> None:
    needs_namespaces()
    before = ip_names()
    hosts = Hosts(2)
    with pytest.raises(RuntimeError, match="the test failed"), hosts:
        hosts.popen(1, [sys.executable, "-c", "import time; time.sleep(60)"])
        raise RuntimeError("the test failed")
    assert ip_names() == before


def test_cleanup_removes_what_was_made_when_setting_up_fails() -> None:
    needs_namespaces()
    before = ip_names()
    hosts = Hosts(2)
    # A namespace name taken by someone else makes the second host's setup fail half way; the
    # taken name is not ours and must survive.
    taken = hosts.namespaces[1]
    subprocess.run(["ip", "netns", "add", taken], check=True)
    try:
        with pytest.raises(RuntimeError, match="ip netns add"), hosts:
            pass
        interfaces, namespaces = ip_names()
        assert interfaces == before[0]
        assert namespaces == before[1] | {taken}
    finally:
        subprocess.run(["ip", "netns", "del", taken], check=True)


def test_loopback_hosts_give_distinct_addresses_and_refuse_to_cut() -> None:
    with LoopbackHosts(3) as hosts:
        assert [hosts.address(i) for i in range(3)] == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
        server, port = start_echo(hosts, 1)
        assert echo(hosts.address(1), port) == b"ping"
        with pytest.raises(OSError):  # bound to 127.0.0.3 only
            echo(hosts.address(0), port, timeout_s=1)
        with pytest.raises(NotImplementedError, match="loopback"):
            hosts.cut(1)
        with pytest.raises(IndexError):
            hosts.address(3)
    assert server.poll() is not None


def test_make_hosts_falls_back_or_fails_as_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    import tests.netns as netns

    monkeypatch.setattr(netns, "available", lambda: "not root (pretended)")
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    assert isinstance(make_hosts(2), LoopbackHosts)
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(RuntimeError, match=r"GATEWAY_REQUIRE_NETNS=1 but .*not root \(pretended\)"):
        make_hosts(2)
