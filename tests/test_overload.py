"""Overload: bounded queues (429 + Retry-After), per-request timeouts, and three times the
capacity for 30 s with every request answered and the accounting exact at every scrape."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp
import numpy as np
import psutil
import requests
import tritonclient.http as triton

from tests.cluster import wait_for_async
from tests.helpers import ROOT, busy_config, run_gateway

BODY = {"inputs": [{"name": "x", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0.5] * 64}]}


def config(tmp_path, server: str = "", model: str = "", cores: float = 0.5, max_batch_size: int = 4) -> Path:
    return busy_config(tmp_path, sla_ms=1000, max_batch_size=max_batch_size, cores=cores, server=server, model=model)


def accounting(metrics: str, model: str = "busy") -> tuple[float, float, float]:
    """(received, ended over every outcome, in flight) from one /metrics scrape."""

    def values(name: str) -> list[float]:
        return [float(v) for v in re.findall(rf'^{name}\{{[^}}]*model="{model}"[^}}]*\}} (\S+)$', metrics, re.M)]

    return (
        sum(values("gateway_requests_received_total")),
        sum(values("gateway_requests_total")),
        sum(values("gateway_requests_in_flight")),
    )


async def burst(base: str, count: int, body: dict) -> list[tuple[int, dict, dict]]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:

        async def one() -> tuple[int, dict, dict]:
            async with session.post(f"{base}/v2/models/busy/infer", json=body) as response:
                return response.status, dict(response.headers), await response.json()

        return await asyncio.gather(*(one() for _ in range(count)))


async def test_a_full_queue_refuses_at_once_with_429_and_retry_after(tmp_path):
    with run_gateway(config(tmp_path, model="max_queue_size = 5")) as gateway:
        answers = await burst(gateway.base, 60, BODY)
        statuses = [status for status, _, _ in answers]
        assert set(statuses) == {200, 429}, set(statuses)
        refused = [(headers, body) for status, headers, body in answers if status == 429]
        assert all(int(headers["Retry-After"]) >= 1 for headers, _ in refused)
        assert all("max_queue_size" in body["error"] for _, body in refused)
        stats = gateway.admin("busy")["stats"]
        assert stats["outcomes"] == {"success": statuses.count(200), "queue_full": len(refused)}
        received, ended, in_flight = accounting(gateway.metrics())
        assert received == ended == 60 and in_flight == 0


async def test_a_request_past_its_timeout_is_answered_and_never_run(tmp_path):
    # 0.1 core: a backlog of 40 takes seconds; each asks for 300 ms (Triton's timeout, in us).
    path = config(tmp_path, cores=0.1, max_batch_size=1)
    with run_gateway(path) as gateway:
        started = time.monotonic()
        answers = await burst(gateway.base, 40, {**BODY, "parameters": {"timeout": 300_000}})
        elapsed = time.monotonic() - started
        statuses = [status for status, _, _ in answers]
        assert set(statuses) == {200, 504}, set(statuses)
        timed_out = [body["error"] for status, _, body in answers if status == 504]
        assert len(timed_out) > 20 and elapsed < 5
        assert all(e.startswith("timed out after 300 ms") for e in timed_out)
        # Work not started: the executor ran exactly the rows that were answered 200 or that timed
        # out while running, no more. A batch is counted when it ends: the last one, whose request
        # timed out while it ran, may end after the burst's answers (a row takes 0.1-0.2 s here).
        queued_out = [e for e in timed_out if "waiting in the queue; it was not run" in e]
        expected = statuses.count(200) + (len(timed_out) - len(queued_out))

        def rows() -> float:
            found = re.search(r'^gateway_batch_size_sum\{model="busy"\} (\S+)$', gateway.metrics(), re.M)
            return float(found.group(1)) if found else 0.0

        await wait_for_async(lambda: rows() >= expected, 10, f"{expected} rows run")
        await asyncio.sleep(0.5)  # and no row more after it
        assert rows() == expected
        assert gateway.admin("busy")["stats"]["outcomes"]["timeout"] == len(timed_out)

        # The real tritonclient's timeout (microseconds) is honoured the same way.
        client = triton.InferenceServerClient(gateway.url)
        backlog = asyncio.create_task(burst(gateway.base, 30, BODY))
        await asyncio.sleep(0.3)
        infer_input = triton.InferInput("x", [1, 1, 8, 8], "FP32")
        infer_input.set_data_from_numpy(np.full((1, 1, 8, 8), 0.5, np.float32))
        began = time.monotonic()
        try:
            client.infer("busy", [infer_input], timeout=200_000)
            raise AssertionError("a request behind a backlog of seconds met a 200 ms timeout")
        except triton.InferenceServerException as error:
            assert "timed out after 200 ms" in str(error)
        assert time.monotonic() - began < 1.5
        await backlog


async def test_the_configured_cap_bounds_requests_without_a_timeout_of_their_own(tmp_path):
    path = config(tmp_path, server="request_timeout_ms = 400", cores=0.1, max_batch_size=1)
    with run_gateway(path) as gateway:
        capped = await burst(gateway.base, 30, {**BODY, "parameters": {"timeout": 60_000_000}})  # asks for 60 s
        errors = [body["error"] for status, _, body in capped if status == 504]
        assert errors and all(e.startswith("timed out after 400 ms") for e in errors)


def bench(base: str, *args: str) -> dict:
    """``gateway bench`` in a process of its own, so that the load does not share this one's loop."""
    with tempfile.NamedTemporaryFile(suffix=".json") as output:
        subprocess.run(
            [sys.executable, "-m", "gateway.cli", "bench", base, "--model", "busy", "--quiet", "--output", output.name, *args],
            cwd=ROOT,
            capture_output=True,
            check=True,
            timeout=300,
        )
        return json.loads(Path(output.name).read_text())


def test_three_times_capacity_for_30_s(tmp_path):
    """Every request answered; goodput >= 0.9 of the capacity measured around it; liveness p99 <
    50 ms; memory bounded; received = ended + in flight at every scrape and at the end.

    The capacity is the mean of one measurement just before the overload and one just after: a
    2-core VM's speed drifts from minute to minute (a capacity of 33.5 req/s in one run, 42.4 in
    the next), and one measured before alone set the bar from another minute's machine (the same
    code read 0.84-0.94 of it)."""
    path = config(tmp_path, server="request_timeout_ms = 5000", model="max_queue_size = 32")
    with run_gateway(path) as gateway:
        before = bench(gateway.base, "--concurrency", "16", "--duration", "10")["throughput_rps"]
        assert before > 20, before
        gateway_process = psutil.Process(gateway.process.pid)
        rss_before = gateway_process.memory_info().rss
        probes: list[float] = []
        scrapes: list[tuple[float, float, float]] = []
        rss: list[int] = []
        done = threading.Event()

        def watch() -> None:
            session = requests.Session()
            last_scrape = 0.0
            while not done.is_set():
                started = time.perf_counter()
                assert session.get(f"{gateway.base}/v2/health/live", timeout=5).status_code == 200
                probes.append((time.perf_counter() - started) * 1000)
                if time.monotonic() - last_scrape > 2:
                    last_scrape = time.monotonic()
                    scrapes.append(accounting(session.get(f"{gateway.base}/metrics", timeout=5).text))
                    rss.append(gateway_process.memory_info().rss)
                time.sleep(0.05)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            load = bench(gateway.base, "--rate", f"{3 * before:.1f}", "--duration", "30")
        finally:
            done.set()
            watcher.join()
        after = bench(gateway.base, "--concurrency", "16", "--duration", "10")["throughput_rps"]
        capacity = (before + after) / 2

        statuses = load["statuses"]
        assert set(statuses) <= {"200", "429", "503", "504"}, statuses  # each an answer, none lost
        assert load["dropped_by_client"] == 0 and load["requests"] > 2.5 * 30 * before
        assert statuses.get("429", 0) > 0  # the overload was real and refused at the queue
        goodput = load["succeeded"] / load["elapsed_s"]
        assert goodput >= 0.9 * capacity, (goodput, before, after)
        assert len(probes) > 200 and float(np.percentile(probes, 99)) < 50, np.percentile(probes, [50, 99, 100])
        assert max(rss) - rss_before < 100 * 2**20, (rss_before, max(rss))
        for received, ended, in_flight in scrapes:  # exact at every moment a scrape saw
            assert received == ended + in_flight
        received, ended, in_flight = accounting(gateway.metrics())
        assert in_flight == 0 and received == ended >= load["requests"]
        print(
            f"capacity {before:.1f} req/s before, {after:.1f} after; at 3x: {load['requests']} requests {statuses}, "
            f"goodput {goodput:.1f} req/s "
            f"({goodput / capacity:.2f}x); liveness p99 {np.percentile(probes, 99):.1f} ms over {len(probes)} probes; "
            f"gateway RSS +{(max(rss) - rss_before) / 2**20:.1f} MiB"
        )
