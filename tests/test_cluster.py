"""Several workers and dispatchers (ROMA Sections 2.1-2.2), each worker a host of its own.

Workers run in network namespaces joined by a bridge (tests/netns.py), or on loopback
addresses of their own where namespaces cannot be made; the dispatchers run in the root
namespace and reach them over TCP, as pods reach each other through a cluster network.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import requests
import tritonclient.http as triton

from executors.limits import unavailable_reason
from executors.wire import PREFIX
from gateway.cluster.worker import HELLO_TIMEOUT_S
from tests.cluster import (
    EXAMPLE_MODELS,
    TOKEN,
    WORKER_HTTP_PORT,
    WORKER_PORT,
    Worker,
    cluster_config,
    cluster_state,
    dispatcher,
    wait_for,
    workers_on,
)
from tests.dns_server import TestDnsServer
from tests.helpers import EXAMPLES, ROOT, Gateway
from tests.netns import make_hosts

MLP = {"mlp": EXAMPLE_MODELS["mlp"]}
PROFILE = ROOT / "tests" / "data" / "emulated_gpu.csv"


def _input_for(client: triton.InferenceServerClient, model: str, rng: np.random.Generator) -> tuple[str, np.ndarray, str]:
    metadata = client.get_model_metadata(model)
    spec = metadata["inputs"][0]
    # Free dimensions: a batch of 2, and 32 for the others (PP-OCR's detector needs multiples of 32).
    shape = [(2 if i == 0 else 32) if d == -1 else d for i, d in enumerate(spec["shape"])]
    return spec["name"], rng.random(shape, dtype=np.float32), metadata["outputs"][0]["name"]


def _infer(client: triton.InferenceServerClient, model: str, name: str, array: np.ndarray, output: str):
    tensor = triton.InferInput(name, list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    result = client.infer(model, [tensor])
    return result.as_numpy(output), result.get_response()["parameters"]["executor"]


def test_two_dispatchers_three_workers_serve_every_example_model(tmp_path: Path):
    rng = np.random.default_rng(1)
    with make_hosts(3) as hosts:
        workers = [f"{hosts.address(i)}:{WORKER_PORT}" for i in range(3)]
        config = cluster_config(tmp_path / "cluster.toml", workers, EXAMPLE_MODELS, cpu_cores=0.6)
        with workers_on(hosts, 3, config) as nodes, dispatcher(config) as first, dispatcher(config) as second:
            # Each worker holds its executors to their cores with the machine's cgroups, as a
            # worker pod does with its node's: not with the affinity fallback.
            if unavailable_reason("cpu") is None:
                assert {node.state()["enforced_by"] for node in nodes} <= {"cgroup-v1", "cgroup-v2"}
            served_on: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
            for gateway in (first, second):
                client = triton.InferenceServerClient(gateway.url)
                for model in EXAMPLE_MODELS:
                    name, array, output = _input_for(client, model, rng)
                    expected = ort.InferenceSession(str(EXAMPLES / EXAMPLE_MODELS[model]["path"])).run(None, {name: array})[0]
                    for _ in range(12 if model == "mlp" else 2):
                        got, executor = _infer(client, model, name, array, output)
                        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
                        served_on[model][executor.split("/")[0]] += 1
            # Replicas on several workers serve one model: the round-robin spreads over them.
            assert len(served_on["mlp"]) >= 2, served_on["mlp"]
            assert set(served_on["mlp"]) <= set(workers)
            # Each worker's controllers count every request that reached its executors, from
            # either dispatcher (profiling batches carry no request and count none).
            for node in nodes:
                seen = node.state()["models"]
                for model, by_worker in served_on.items():
                    assert seen[model]["served"] == by_worker.get(node.endpoint, 0), (node.endpoint, model, seen[model])

            # Replicas at run time: one worker for cnn_small through the first dispatcher only.
            admin = first.base + "/admin/models/cnn_small/replicas"
            assert requests.put(admin, json={"replicas": 0}, timeout=5).status_code == 400
            state = requests.put(admin, json={"replicas": 1}, timeout=5).json()
            assert len(state["replicas"]["placed"]) == 1
            only = state["replicas"]["placed"][0]
            client = triton.InferenceServerClient(first.url)
            name, array, output = _input_for(client, "cnn_small", rng)
            assert {_infer(client, "cnn_small", name, array, output)[1].split("/")[0] for _ in range(8)} == {only}
            # The second dispatcher's placement is its own.
            assert len(requests.get(second.base + "/admin/models/cnn_small", timeout=5).json()["replicas"]["placed"]) == 3


class Load:
    """Clients sending to several dispatchers until stopped; every answer and its time kept."""

    def __init__(self, urls: list[str], threads_per_url: int = 2, timeout_s: float = 30.0):
        self.urls, self.timeout_s = urls, timeout_s
        self.answers: list[tuple[float, float, int, str]] = []  # (sent, took, status, executor or error)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(u,)) for u in urls for _ in range(threads_per_url)]
        body = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.5] * 512}]}
        self._body = body

    def _run(self, url: str) -> None:
        session = requests.Session()
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                response = session.post(f"{url}/v2/models/mlp/infer", json=self._body, timeout=self.timeout_s)
            except requests.RequestException as error:  # no answer at all: the test fails on it
                self.answers.append((sent, time.monotonic() - sent, 0, str(error)))
                time.sleep(0.05)  # a gateway that is gone refuses at once: do not spin
                continue
            body = response.json()
            what = body["parameters"]["executor"] if response.status_code == 200 else body.get("error", "")
            self.answers.append((sent, time.monotonic() - sent, response.status_code, what))
            time.sleep(0.005)

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def since(self, t: float) -> list[tuple[float, float, int, str]]:
        return [a for a in list(self.answers) if a[0] >= t]


REQUEST_TIMEOUT_MS = 5000.0


def workers_answering(answers: list[tuple[float, float, int, str]]) -> set[str]:
    return {a[3].split("/")[0] for a in answers if a[2] == 200}


def connected(gateway) -> set[str]:
    """The workers a dispatcher is connected to."""
    return {w["address"] for w in cluster_state(gateway)["workers"] if w["connected"]}


def test_a_worker_killed_under_load_fails_only_its_batches_and_is_taken_back(tmp_path: Path):
    with make_hosts(3) as hosts:
        workers = [f"{hosts.address(i)}:{WORKER_PORT}" for i in range(3)]
        config = cluster_config(
            tmp_path / "cluster.toml", workers, MLP, server={"request_timeout_ms": REQUEST_TIMEOUT_MS}, policy="feedforward"
        )
        with workers_on(hosts, 3, config) as nodes, dispatcher(config) as first, dispatcher(config) as second:
            victim: Worker = nodes[0]
            with Load([first.base, second.base]) as load:
                wait_for(lambda: len(workers_answering(load.answers)) == 3, 20, "all three workers used")
                killed_at = time.monotonic()
                victim.kill()
                for gateway in (first, second):
                    wait_for(lambda g=gateway: victim.endpoint not in connected(g), 10, "the killed worker noticed")
                noticed_at = time.monotonic()
                # Routed around: the other workers keep serving both dispatchers.
                wait_for(lambda: len(load.since(noticed_at)) >= 40, 20, "requests served once it was noticed")
                after = load.since(noticed_at)
                assert all(a[2] == 200 for a in after), collections.Counter(a[2] for a in after)
                assert victim.endpoint not in {a[3].split("/")[0] for a in after}
                victim.start()
                victim.wait_ready()
                for gateway in (first, second):
                    wait_for(lambda g=gateway: victim.endpoint in connected(g), 15, "the restarted worker taken back")
                back_at = time.monotonic()
                wait_for(lambda: any(a[3].startswith(victim.endpoint) for a in load.since(back_at)), 15, "requests on it again")
            answers = load.answers
            statuses = collections.Counter(a[2] for a in answers)
            # Every request answered, 200 or 503 (a batch in flight on the killed worker), none
            # after its timeout, and the 503s say why.
            assert set(statuses) <= {200, 503}, statuses
            assert max(a[1] for a in answers) < REQUEST_TIMEOUT_MS / 1000 + 1.0
            failed = [a for a in answers if a[2] == 503]
            assert all(victim.endpoint in a[3] for a in failed), failed
            # Only requests in flight at the kill, or sent to it before the dispatchers noticed.
            assert all(a[0] + a[1] >= killed_at and a[0] <= noticed_at for a in failed), failed
            assert statuses[200] > 100


def test_a_worker_cut_off_is_noticed_by_its_silence_and_taken_back(tmp_path: Path):
    with make_hosts(2) as hosts:
        if not hosts.can_cut:
            pytest.fail("network namespaces are needed to cut a worker off (tests/netns.py): " + str(hosts))
        workers = [f"{hosts.address(i)}:{WORKER_PORT}" for i in range(2)]
        config = cluster_config(tmp_path / "cluster.toml", workers, MLP, server={"request_timeout_ms": REQUEST_TIMEOUT_MS})
        with workers_on(hosts, 2, config) as nodes, dispatcher(config) as gateway:
            cut = nodes[1]
            with Load([gateway.base]) as load:
                wait_for(lambda: len(workers_answering(load.answers)) == 2, 20, "both workers used")
                cut_at = time.monotonic()
                hosts.cut(1)  # no FIN, no RST: only the heartbeat can tell
                wait_for(lambda: cut.endpoint not in connected(gateway), 6, "the cut-off worker noticed")
                noticed_at = time.monotonic()
                wait_for(lambda: len(load.since(noticed_at)) >= 20, 20, "requests served once it was noticed")
                after = load.since(noticed_at)
                assert all(a[2] == 200 and not a[3].startswith(cut.endpoint) for a in after)
                hosts.restore(1)
                restored_at = time.monotonic()
                wait_for(lambda: any(a[3].startswith(cut.endpoint) for a in load.since(restored_at)), 15, "used again")
            answers = load.answers
            assert {a[2] for a in answers} <= {200, 503}
            # What was in flight on it ended within the heartbeat timeout (2 s), not the request timeout.
            assert all(a[1] < 2.0 + 1.0 for a in answers if a[0] >= cut_at and a[2] == 503)
            assert noticed_at - cut_at < 2.0 + 1.5


def test_an_sla_set_on_the_dispatcher_reaches_every_workers_controller(tmp_path: Path):
    """The workers' controllers regulate the cores: they kept the config's SLA when the admin API
    changed it on the dispatcher. A worker that connects later is told in the hello."""
    with make_hosts(2) as hosts:
        workers = [f"{hosts.address(i)}:{WORKER_PORT}" for i in range(2)]
        config = cluster_config(tmp_path / "cluster.toml", workers, MLP, policy="feedforward")
        with workers_on(hosts, 2, config) as nodes, dispatcher(config) as gateway:
            configured = nodes[0].state()["models"]["mlp"]["sla_ms"]
            # The hello carries each model's SLA, the config's too: one the worker holds is no news.
            assert "SLA set to" not in nodes[0].output()
            changed = requests.put(gateway.base + "/admin/models/mlp/sla", json={"sla_ms": 77}, timeout=5)
            assert changed.status_code == 200, changed.text
            for node in nodes:
                wait_for(lambda n=node: n.state()["models"]["mlp"]["sla_ms"] == 77, 5, "the SLA on the worker")
            assert configured != 77
            nodes[1].kill()
            nodes[1].start()
            nodes[1].wait_ready()
            wait_for(lambda: nodes[1].endpoint in connected(gateway), 15, "the restarted worker taken back")
            # A new process starts from the config's SLA, then hears the dispatcher's in the hello.
            wait_for(lambda: nodes[1].state()["models"]["mlp"]["sla_ms"] == 77, 5, "the SLA told in the hello")
            assert "model mlp: SLA set to 77 ms by dispatcher" in nodes[1].output()


def test_a_worker_back_without_the_model_or_with_another_takes_none_of_its_requests(tmp_path: Path):
    """A worker restarted at its address with a config that dropped the MLP: its executor kept
    its last state ("ready") at the dispatcher, and about half the requests were answered 503.
    Restarted with "mlp" pointing at another file: its executor was used as it was, and about
    half the valid requests were refused 400 by the other model."""
    body = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.5] * 512}]}
    with make_hosts(2) as hosts:
        workers = [f"{hosts.address(i)}:{WORKER_PORT}" for i in range(2)]
        config = cluster_config(tmp_path / "cluster.toml", workers, MLP)
        without = cluster_config(tmp_path / "without.toml", workers, {"cnn_small": EXAMPLE_MODELS["cnn_small"]})
        other = cluster_config(tmp_path / "other.toml", workers, {"mlp": {**MLP["mlp"], "path": "models/cnn_small.onnx"}})
        with workers_on(hosts, 2, config) as nodes, dispatcher(config) as gateway:
            for restarted_with, state in ((without, "gone"), (other, "refused")):
                nodes[1].kill()
                nodes[1].config = restarted_with
                nodes[1].start()
                nodes[1].wait_ready()

                def seen(state: str = state) -> bool:
                    executors = gateway.admin("mlp")["executors"]
                    return any(e["worker"] == nodes[1].endpoint and e["state"] == state for e in executors)

                wait_for(seen, 20, f"the restarted worker's MLP executor {state}")
                statuses = [
                    requests.post(f"{gateway.base}/v2/models/mlp/infer", json=body, timeout=10).status_code for _ in range(20)
                ]
                assert statuses == [200] * 20, statuses
            assert "takes or gives other tensors than the one served" in gateway.output()


def test_a_dispatcher_serves_its_own_file_whichever_worker_answers_first(tmp_path: Path):
    """The first worker to answer, whose config pointed "mlp" at another file, set what the
    dispatcher served: its inputs, and the worker holding the dispatcher's own file refused."""
    body = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.5] * 512}]}
    with make_hosts(2) as hosts:
        workers = [f"{hosts.address(i)}:{WORKER_PORT}" for i in range(2)]
        config = cluster_config(tmp_path / "cluster.toml", workers, MLP)
        other = cluster_config(tmp_path / "other.toml", workers, {"mlp": {**MLP["mlp"], "path": "models/cnn_small.onnx"}})
        with workers_on(hosts, 2, config) as nodes:
            nodes[1].kill()
            nodes[1].config = other
            nodes[1].start()
            nodes[1].wait_ready()
            nodes[0].kill()  # the worker of the dispatcher's own file: it answers seconds later
            later = threading.Timer(3.0, nodes[0].start)
            later.start()
            with dispatcher(config) as gateway:
                later.join()
                metadata = requests.get(f"{gateway.base}/v2/models/mlp", timeout=10).json()
                assert metadata["inputs"][0]["shape"] == [-1, 512], metadata

                def seen() -> bool:
                    states = {e["worker"]: e["state"] for e in gateway.admin("mlp")["executors"]}
                    return states.get(nodes[1].endpoint) == "refused" and states.get(nodes[0].endpoint) == "ready"

                wait_for(seen, 60, "the other file's executor refused and the dispatcher's own used")
                statuses = [
                    requests.post(f"{gateway.base}/v2/models/mlp/infer", json=body, timeout=10).status_code for _ in range(10)
                ]
                assert statuses == [200] * 10, statuses


def test_workers_found_and_drained_through_dns_without_a_restart(tmp_path: Path):
    with make_hosts(2) as hosts, TestDnsServer() as dns:
        name = "gateway-workers.gateway.svc.cluster.local"
        dns.set(name, [hosts.address(0)])
        config = cluster_config(
            tmp_path / "cluster.toml",
            f"dns:{name}:{WORKER_PORT}",
            MLP,
            cluster={"dns_server": dns.address, "resolve_interval_s": 0.3},
        )
        with workers_on(hosts, 2, config) as nodes, dispatcher(config) as gateway:
            first, second = nodes[0].endpoint, nodes[1].endpoint

            assert connected(gateway) == {first}
            with Load([gateway.base], threads_per_url=1) as load:
                dns.set(name, [hosts.address(0), hosts.address(1)])  # a pod became ready
                wait_for(lambda: connected(gateway) == {first, second}, 10, "the new worker used")
                wait_for(lambda: any(a[3].startswith(second) for a in load.answers), 10, "requests on the new worker")
                dns.set(name, [hosts.address(1)])  # the first pod is going away
                wait_for(lambda: connected(gateway) == {second}, 10, "the old worker drained")
                drained_at = time.monotonic()
                wait_for(lambda: len(load.since(drained_at)) >= 20, 20, "requests served once it was drained")
                after = load.since(drained_at)
                assert all(a[2] == 200 and a[3].startswith(second) for a in after)
            # Drained, not cut: nothing failed.
            assert {a[2] for a in load.answers} == {200}, [a for a in load.answers if a[2] != 200][:3]


def executors_at(gateway: Gateway, endpoint: str) -> list[str]:
    """The ids of the dispatcher's executors of the worker at ``endpoint``."""
    described = requests.get(gateway.base + "/admin/models/mlp", timeout=5).json()
    return [e["id"] for e in described["executors"] if e["id"].startswith(endpoint)]


def test_a_worker_that_leaves_the_dns_and_comes_back_is_used_again(tmp_path: Path):
    with make_hosts(2) as hosts, TestDnsServer() as dns:
        name = "gateway-workers.gateway.svc.cluster.local"
        both = [hosts.address(0), hosts.address(1)]
        dns.set(name, both)
        config = cluster_config(
            tmp_path / "cluster.toml",
            f"dns:{name}:{WORKER_PORT}",
            MLP,
            server={"request_timeout_ms": REQUEST_TIMEOUT_MS},
            cluster={"dns_server": dns.address, "resolve_interval_s": 0.3},
        )
        with workers_on(hosts, 2, config) as nodes, dispatcher(config) as gateway:
            first, second = nodes[0].endpoint, nodes[1].endpoint
            with Load([gateway.base]) as load:
                wait_for(lambda: len(workers_answering(load.answers)) == 2, 20, "both workers used")
                # One pod leaves (drained and let go) and comes back at the same address.
                dns.set(name, [hosts.address(1)])
                wait_for(lambda: {w["address"] for w in cluster_state(gateway)["workers"]} == {second}, 15, "first let go")
                # Its executors are forgotten (they stayed for good, one set more at each return).
                wait_for(lambda: executors_at(gateway, first) == [], 5, "the first worker's executors forgotten")
                dns.set(name, both)
                wait_for(lambda: connected(gateway) == {first, second}, 15, "the first worker back")
                back_at = time.monotonic()
                wait_for(lambda: first in workers_answering(load.since(back_at)), 10, "requests on the returning worker")
                # Every pod leaves and comes back: the dispatcher serves again.
                dns.set(name, [])
                wait_for(lambda: cluster_state(gateway)["workers"] == [], 15, "every worker let go")
                dns.set(name, both)
                wait_for(lambda: connected(gateway) == {first, second}, 15, "both workers back")
                back_at = time.monotonic()
                wait_for(lambda: workers_answering(load.since(back_at)) == {first, second}, 10, "requests on both again")
            assert requests.get(gateway.base + "/v2/health/ready", timeout=5).status_code == 200
            # Without workers, requests may only wait (and time out): none failed otherwise.
            assert {a[2] for a in load.answers} <= {200, 504}, collections.Counter(a[2] for a in load.answers)


async def test_a_hello_announcing_a_huge_frame_is_closed_unread(tmp_path: Path):
    with make_hosts(1) as hosts:
        address = hosts.address(0)
        config = cluster_config(tmp_path / "cluster.toml", [f"{address}:{WORKER_PORT}"], MLP)
        with workers_on(hosts, 1, config) as nodes, dispatcher(config) as gateway:
            reader, writer = await asyncio.open_connection(address, WORKER_PORT)
            # Before any token: a prefix announcing a 2 GiB hello, then bytes, as a stranger could.
            writer.write(PREFIX.pack((1 << 31) - 16, 0) + b"x" * 65536)
            sent = time.monotonic()
            with contextlib.suppress(ConnectionError):
                await writer.drain()
                # Closed at once, not when the hello's time runs out with its bytes buffered.
                assert await asyncio.wait_for(reader.read(), HELLO_TIMEOUT_S / 5) == b""
            assert time.monotonic() - sent < HELLO_TIMEOUT_S / 5
            writer.close()
            wait_for(lambda: "unread: its hello announced 2147483632 bytes" in nodes[0].output(), 5, "the worker says why")
            # The worker goes on serving its dispatcher.
            client = triton.InferenceServerClient(gateway.url)
            name, array, output = _input_for(client, "mlp", np.random.default_rng(4))
            assert _infer(client, "mlp", name, array, output)[1] == f"{nodes[0].endpoint}/cpu-mlp"
            assert nodes[0].state()["dispatchers"] == 1


async def test_a_hello_whose_token_is_no_text_is_refused(tmp_path: Path):
    """A token of a lone surrogate ("\\ud800", which JSON allows) raised out of the worker's
    handler: no "refused" frame, a traceback in its log."""
    from executors.connection import read_frame
    from executors.wire import encode_frame

    with make_hosts(1) as hosts:
        address = hosts.address(0)
        config = cluster_config(tmp_path / "cluster.toml", [f"{address}:{WORKER_PORT}"], MLP)
        with workers_on(hosts, 1, config) as nodes:
            reader, writer = await asyncio.open_connection(address, WORKER_PORT)
            writer.writelines(encode_frame({"kind": "hello", "token": "\ud800"}))
            await writer.drain()
            answer, _ = await asyncio.wait_for(read_frame(reader), 10)
            writer.close()
            assert answer == {"kind": "refused", "message": "wrong worker token"}
            assert "Traceback" not in nodes[0].output()


async def test_the_gpu_scheduler_sees_every_gpu_of_every_worker(tmp_path: Path):
    import tritonclient.http.aio as triton_aio

    # Two workers with one emulated GPU each (20 ms + 0.5 ms a row for mlp, batches of at most 8:
    # about 330 requests/s per GPU). mlp is served on GPUs only, so a burst at 500/s needs both.
    models = {"mlp": {**EXAMPLE_MODELS["mlp"], "sla_ms": 400, "max_batch_size": 8, "cpu_executor": False}}
    with make_hosts(2) as hosts:
        workers = [f"{hosts.address(i)}:{WORKER_PORT}" for i in range(2)]
        config = cluster_config(
            tmp_path / "cluster.toml",
            workers,
            models,
            node={"gpus": [0]},
            gpu={"executor": "emulated", "profile": str(PROFILE)},
        )
        with workers_on(hosts, 2, config), dispatcher(config) as gateway:
            described = requests.get(gateway.base + "/admin/models/mlp", timeout=5).json()
            assert sorted(e["id"] for e in described["executors"]) == sorted(f"{w}/gpu-0" for w in workers)
            assert all(e["device"] == "gpu:0" and e["emulated"] for e in described["executors"])
            # The emulated profile travelled with the worker's hello: the scheduler plans with it.
            gpu = described["profiles"]["gpu"]
            assert (gpu["per_item_ms"], gpu["fixed_ms"]) == (0.5, 20.0)
            session = ort.InferenceSession(str(EXAMPLES / "models/mlp.onnx"), providers=["CPUExecutionProvider"])
            client = triton_aio.InferenceServerClient(gateway.url, conn_limit=64)
            rng = np.random.default_rng(2)

            async def one(i: int) -> tuple[np.ndarray, dict]:
                await asyncio.sleep(i * 0.002)
                data = rng.random((1, 512), dtype=np.float32)
                tensor = triton_aio.InferInput("x", [1, 512], "FP32")
                tensor.set_data_from_numpy(data)
                result = await client.infer("mlp", [tensor])
                np.testing.assert_allclose(result.as_numpy("y"), session.run(None, {"x": data})[0], rtol=1e-4, atol=1e-5)
                return result.get_response()["parameters"]

            try:
                answers = await asyncio.gather(*(one(i) for i in range(200)))
            finally:
                await client.close()
            used = collections.Counter(a["executor"] for a in answers)
            assert set(used) == {f"{w}/gpu-0" for w in workers}, used
            assert {a["executed_on"] for a in answers} == {"gpu:0"}
            assert max(a["batch_size"] for a in answers) > 1  # batched on the remote GPUs


def test_a_worker_with_a_gpu_that_joins_after_start_is_given_requests(tmp_path: Path):
    """A dispatcher profiles its models once, at start: a worker with a GPU that connected after
    that had its GPU listed, ready, and never given a request (the models had no GPU profile)."""
    body = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.5] * 512}]}
    models = {"mlp": {**EXAMPLE_MODELS["mlp"], "sla_ms": 400, "max_batch_size": 8}}
    with make_hosts(2) as hosts:
        workers = [f"{hosts.address(i)}:{WORKER_PORT}" for i in range(2)]
        cpu_only = cluster_config(tmp_path / "cpu.toml", workers, models)
        with_gpu = cluster_config(
            tmp_path / "gpu.toml", workers, models, node={"gpus": [0]}, gpu={"executor": "emulated", "profile": str(PROFILE)}
        )
        late = Worker(hosts, 1, with_gpu)
        with workers_on(hosts, 1, cpu_only), dispatcher(cpu_only) as gateway:
            assert "gpu" not in gateway.admin("mlp")["profiles"]
            try:
                late.start().wait_ready()
                wait_for(lambda: "gpu" in gateway.admin("mlp")["profiles"], 30, "a GPU profile for mlp")
                gpu = gateway.admin("mlp")["profiles"]["gpu"]
                assert (gpu["per_item_ms"], gpu["fixed_ms"]) == (0.5, 20.0)  # the emulated GPU's, from its hello
                answers = [requests.post(f"{gateway.base}/v2/models/mlp/infer", json=body, timeout=10) for _ in range(40)]
                assert [a.status_code for a in answers] == [200] * 40
                where = collections.Counter(a.json()["parameters"]["executed_on"] for a in answers)
                assert where["gpu:0"] > 0, where
            finally:
                late.stop()
            assert "which came up after start" in gateway.output()


def test_a_dispatcher_killed_loses_only_its_own_requests(tmp_path: Path):
    with make_hosts(2) as hosts:
        workers = [f"{hosts.address(i)}:{WORKER_PORT}" for i in range(2)]
        config = cluster_config(tmp_path / "cluster.toml", workers, MLP, server={"request_timeout_ms": REQUEST_TIMEOUT_MS})
        with workers_on(hosts, 2, config) as nodes, dispatcher(config) as doomed, dispatcher(config) as survivor:
            with Load([doomed.base]) as lost, Load([survivor.base]) as kept:
                wait_for(lambda: len(workers_answering(kept.answers)) == 2, 20, "both workers used")
                wait_for(lambda: len(workers_answering(lost.answers)) == 2, 20, "both workers used by the other")
                doomed.process.kill()  # kill -9: no goodbye to the workers
                killed_at = time.monotonic()
                doomed.process.wait()
                # The workers notice the closed connections and keep serving the other dispatcher.
                wait_for(lambda: all(n.state()["dispatchers"] == 1 for n in nodes), 10, "the workers let it go")
                let_go_at = time.monotonic()
                wait_for(lambda: workers_answering(kept.since(let_go_at)) == set(workers), 20, "both workers used after")
            # The survivor lost nothing, before, during or after, and still uses both workers.
            assert kept.answers and {a[2] for a in kept.answers} == {200}, collections.Counter(a[2] for a in kept.answers)
            # The killed dispatcher's own clients got errors once it was gone (nothing else could answer them).
            assert any(a[2] == 0 for a in lost.since(killed_at))


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _certificate_authority(folder: Path, name: str) -> tuple[Path, Path]:
    ca, key = folder / f"{name}.pem", folder / f"{name}.key"
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}",
        "-keyout", str(key), "-out", str(ca),
    )  # fmt: skip
    return ca, key


def _worker_certificate(folder: Path, ca: tuple[Path, Path], address: str) -> tuple[Path, Path]:
    """A certificate for the worker at ``address``, signed by ``ca``, naming that address."""
    cert, key, request, extensions = (folder / f"worker.{suffix}" for suffix in ("pem", "key", "csr", "ext"))
    extensions.write_text(f"subjectAltName = IP:{address}\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=worker", "-keyout", str(key), "-out", str(request))
    _openssl(
        "x509", "-req", "-in", str(request), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
        "-days", "1", "-extfile", str(extensions), "-out", str(cert),
    )  # fmt: skip
    return cert, key


async def _first_frame(address: str, port: int, **tls: object) -> dict | BaseException:
    """What a worker answers a dispatcher's hello with (the right token) on this kind of connection."""
    from executors.connection import read_frame
    from executors.wire import encode_frame

    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(address, port, **tls), 5)
        writer.writelines(encode_frame({"kind": "hello", "token": TOKEN, "dispatcher": "test"}))
        await writer.drain()
        header, _ = await asyncio.wait_for(read_frame(reader), 10)
        writer.close()
        return header
    except Exception as error:
        return error


async def test_workers_over_tls_take_only_dispatchers_that_trust_them(tmp_path: Path):
    import ssl

    with make_hosts(1) as hosts:
        address = hosts.address(0)
        ca = _certificate_authority(tmp_path, "cluster-ca")
        stranger = _certificate_authority(tmp_path, "another-ca")
        cert, key = _worker_certificate(tmp_path, ca, address)
        config = cluster_config(
            tmp_path / "cluster.toml",
            [f"{address}:{WORKER_PORT}"],
            MLP,
            worker={"tls_cert": str(cert), "tls_key": str(key)},
            cluster={"tls_ca": str(ca[0])},
        )
        with workers_on(hosts, 1, config) as nodes, dispatcher(config) as gateway:
            state = cluster_state(gateway)
            assert state["tls"] is True and [w["connected"] for w in state["workers"]] == [True]
            client = triton.InferenceServerClient(gateway.url)
            name, array, output = _input_for(client, "mlp", np.random.default_rng(3))
            got, executor = _infer(client, "mlp", name, array, output)
            expected = ort.InferenceSession(str(EXAMPLES / "models/mlp.onnx")).run(None, {name: array})[0]
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
            assert executor == f"{nodes[0].endpoint}/cpu-mlp"
            # The dispatcher's own context: the worker's hello comes back over TLS.
            trusted = ssl.create_default_context(cafile=str(ca[0]))
            assert (await _first_frame(address, WORKER_PORT, ssl=trusted))["kind"] == "hello"
            # Plain TCP with the right token gets no hello: the worker speaks TLS only.
            plain = await _first_frame(address, WORKER_PORT)
            assert isinstance(plain, BaseException), plain
            # A dispatcher that trusts another CA refuses the worker's certificate.
            other = ssl.create_default_context(cafile=str(stranger[0]))
            assert isinstance(await _first_frame(address, WORKER_PORT, ssl=other), ssl.SSLCertVerificationError)
            # The worker kept serving through all of it.
            assert _infer(client, "mlp", name, array, output)[1] == executor


def test_a_workers_http_port_closes_connections_that_send_nothing(tmp_path: Path):
    """The worker's HTTP port (health, state, metrics; no token) kept every idle connection open:
    enough of them left the worker no descriptor to take a dispatcher's hello on. It closes them
    after server.header_timeout_s, as `gateway serve` does."""
    with make_hosts(1) as hosts:
        config = cluster_config(
            tmp_path / "cluster.toml", [f"{hosts.address(0)}:{WORKER_PORT}"], MLP, server={"header_timeout_s": 1.0}
        )
        with workers_on(hosts, 1, config) as (worker,):
            idle = [socket.create_connection((worker.address, WORKER_HTTP_PORT), timeout=10) for _ in range(3)]
            try:
                time.sleep(2.5)
                for connection in idle:
                    assert connection.recv(1024) == b""  # closed by the worker, not by a timeout here
                assert requests.get(worker.url("/v2/health/ready"), timeout=5).status_code == 200
            finally:
                for connection in idle:
                    connection.close()
