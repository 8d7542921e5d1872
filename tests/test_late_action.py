"""Clockwork's late action (Section 4.4): a GPU executor that reaches a batch after its latest
start does not run it, and the dispatch core reschedules or refuses its requests.

The core on a fake clock; then a real worker process (an emulated GPU executor); then a running
gateway whose GPU executor is paused (SIGSTOP) while a batch waits for it, so that the batch is
late by construction, not by chance.
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import shutil
import signal
import time

import numpy as np
import pytest
import requests

from executors.connection import BatchLate
from executors.process import ProcessExecutor
from executors.wire import shares_clock
from executors.worker import late_by_ms
from schedulers.dispatch import CPU, GPU, DispatchCore, Fail, Finish, Start, WakeAt
from schedulers.gpu import GpuScheduler
from schedulers.profiles import LatencyProfile
from schedulers.request import Request
from schedulers.round_robin import RandomRoundRobin
from tests.helpers import metric_value, run_gateway

LATE_REASON = "its batch reached the GPU executor after its latest start time and was not run"


# -- the core, on a fake clock ------------------------------------------------------------------
class Ledger:
    """Every action the core hands out, and how many times each request ended."""

    def __init__(self) -> None:
        self.actions: list = []
        self.ended: collections.Counter[int] = collections.Counter()

    def __call__(self, actions: list) -> list:
        self.actions += actions
        for action in actions:
            if isinstance(action, Finish | Fail):
                self.ended.update(r.id for r in action.requests)
        return actions


def of(actions, kind):
    return [a for a in actions if isinstance(a, kind)]


def core_with_a_skipped_head():
    """A GPU batch (B, C) dispatched behind an older request A that the GPU skipped.

    GPU l(b) = b + 29 ms, CPU l(b) = b + 4 ms, SLA 40 ms, requests refused when late. The GPU
    executor is still starting and the CPU is busy with Y while A, B and C arrive. When the GPU
    is up at 0.015 it skips A (0.015 + 0.030 is past A's deadline 0.041; the CPU can still
    finish A) and takes B and C: a batch of 2 (31 ms) that must start by B's deadline 0.053
    less 0.031, at 0.022.
    """
    core = DispatchCore(cpu_scheduler=RandomRoundRobin(random.Random(1)), gpu_scheduler=GpuScheduler("work_conserving"))
    core.add_executor("cpu-m", CPU, "m")
    core.add_executor("gpu-0", GPU)
    core.add_model(
        "m",
        sla_ms=40,
        max_batch=8,
        max_queue_size=100,
        drop_late=True,
        cpu_profile=LatencyProfile(1.0, 4.0),
        gpu_profile=LatencyProfile(1.0, 29.0),
    )
    ledger = Ledger()
    ledger(core.set_executor_ready("cpu-m", True, 0.0))
    y, a, b, c = (Request(i, "m", t) for i, t in [(1, 0.0), (2, 0.001), (3, 0.013), (4, 0.014)])
    (on_cpu,) = of(ledger(core.on_arrival(y, 0.0)), Start)
    assert on_cpu.batch.device == CPU
    for request in (a, b, c):
        assert not of(ledger(core.on_arrival(request, request.arrival)), Start)
    (late,) = of(ledger(core.set_executor_ready("gpu-0", True, 0.015)), Start)
    assert late.batch.device == GPU and late.batch.requests == (b, c)
    assert late.batch.latest_start == pytest.approx(0.022)
    assert list(core.models["m"].queue) == [a]
    return core, ledger, on_cpu.batch, late.batch, (y, a, b, c)


def test_a_late_batch_goes_back_in_arrival_order_behind_the_request_skipped_before_it():
    core, ledger, cpu_batch, late_batch, (y, a, b, c) = core_with_a_skipped_head()
    # At 0.030 the GPU can finish neither B nor C (0.060 > 0.053), the CPU can: nothing is
    # refused, nothing starts (the CPU is still busy with Y), and the queue is A, B, C.
    actions = ledger(core.on_batch_late(late_batch, 0.030))
    assert not of(actions, Start) and not of(actions, Fail)
    assert list(core.models["m"].queue) == [a, b, c]
    assert all(r.state == "queued" and r.dispatched is None for r in (a, b, c))
    # The CPU frees up and takes the queue from its head, in arrival order.
    (then,) = of(ledger(core.on_batch_done(cpu_batch, 5.0, 0.031)), Start)
    assert then.batch.device == CPU and then.batch.requests == (a, b, c)
    ledger(core.on_batch_done(then.batch, 7.0, 0.038))
    assert ledger.ended == {r.id: 1 for r in (y, a, b, c)}
    assert not of(ledger.actions, Fail)


def test_a_late_batch_is_rescheduled_on_the_gpu_while_it_can_still_finish_its_requests():
    core, ledger, cpu_batch, late_batch, (y, a, b, c) = core_with_a_skipped_head()
    # Late for the pair (0.0225 > 0.022), but B alone still fits: 0.0225 + 0.030 <= 0.053.
    (again,) = of(ledger(core.on_batch_late(late_batch, 0.0225)), Start)
    assert again.batch.device == GPU and again.batch.requests == (b,)
    assert again.batch.latest_start == pytest.approx(0.023)
    assert list(core.models["m"].queue) == [a, c]  # C cannot follow B on the GPU in time; the CPU can
    (spill,) = of(ledger(core.on_batch_done(cpu_batch, 5.0, 0.024)), Start)
    assert spill.batch.device == CPU and spill.batch.requests == (a, c)
    ledger(core.on_batch_done(spill.batch, 6.0, 0.030))
    ledger(core.on_batch_done(again.batch, 30.0, 0.0525))
    assert ledger.ended == {r.id: 1 for r in (y, a, b, c)}
    assert not of(ledger.actions, Fail)


def test_a_late_batch_no_device_can_finish_any_more_is_refused_naming_the_late_start():
    core, ledger, cpu_batch, late_batch, (y, a, b, c) = core_with_a_skipped_head()
    (on_cpu,) = of(ledger(core.on_batch_done(cpu_batch, 5.0, 0.016)), Start)
    assert on_cpu.batch.requests == (a,)  # the CPU takes the request the GPU skipped
    # At 0.050 neither device can finish B (0.053) or C (0.054): the GPU needs 30 ms, the CPU
    # is busy until 0.050 and needs 5 ms.
    (refused,) = of(ledger(core.on_batch_late(late_batch, 0.050)), Fail)
    assert refused.requests == (b, c)
    assert (refused.status, refused.outcome) == (503, "refused_deadline")
    assert LATE_REASON in refused.message and "40 ms" in refused.message
    assert core.queue_length("m") == 0
    # The late batch's executor is free again, and a batch done for it later changes nothing.
    assert core.executors["gpu-0"].batch is None
    ledger(core.on_batch_done(on_cpu.batch, 5.0, 0.051))
    assert ledger.ended == {r.id: 1 for r in (y, a, b, c)}


def test_a_late_batch_whose_requests_ended_meanwhile_returns_only_the_live_ones():
    core, ledger, cpu_batch, late_batch, (y, a, b, c) = core_with_a_skipped_head()
    ledger(core.cancel(b, 0.016))  # B's client went away while its batch was on its way
    actions = ledger(core.on_batch_late(late_batch, 0.030))
    assert not of(actions, Fail)
    assert list(core.models["m"].queue) == [a, c]
    (then,) = of(ledger(core.on_batch_done(cpu_batch, 5.0, 0.031)), Start)
    assert then.batch.requests == (a, c)
    ledger(core.on_batch_done(then.batch, 6.0, 0.037))
    assert ledger.ended == {r.id: 1 for r in (y, a, c)}  # B ended when it was cancelled


def test_a_request_put_back_by_a_late_batch_is_refused_when_it_runs_out_of_time_with_nothing_else_happening():
    # GPU only, one GPU. A (model m: l(b) = b + 9 ms, SLA 40 ms) goes to the GPU when it comes
    # up, and its refusal time (0.030, its last start) leaves the core's heap while it runs. Its executor
    # reports the batch late at 0.005; the GPU then takes N (model n: l(b) = 50 b + 5 ms, due at
    # once) and is busy until 0.060. A can no longer finish after 0.030: the core must wake then
    # and refuse it, not leave it to its 60 s timeout.
    core = DispatchCore(cpu_scheduler=RandomRoundRobin(random.Random(1)), gpu_scheduler=GpuScheduler("work_conserving"))
    core.add_executor("gpu-0", GPU)
    core.add_model("m", sla_ms=40, max_batch=8, max_queue_size=100, drop_late=True, gpu_profile=LatencyProfile(1.0, 9.0))
    core.add_model("n", sla_ms=99, max_batch=8, max_queue_size=100, drop_late=True, gpu_profile=LatencyProfile(50.0, 5.0))
    ledger = Ledger()
    a, n = Request(1, "m", 0.0), Request(2, "n", 0.002)
    ledger(core.on_arrival(a, 0.0))  # the GPU executor is still starting: A waits, watched
    (first,) = of(ledger(core.set_executor_ready("gpu-0", True, 0.001)), Start)
    ledger(core.on_arrival(n, 0.002))
    actions = ledger(core.on_batch_late(first.batch, 0.005))
    (then,) = of(actions, Start)
    assert then.batch.requests == (n,)
    assert list(core.models["m"].queue) == [a]
    # Carry out the timer as the shell does: a wake-up asked for stands until it fires.
    fired, refused_at = 0.005, None
    while refused_at is None:
        pending = [w.time for w in ledger.actions if isinstance(w, WakeAt) and w.time > fired]
        if not pending:
            break
        fired = min(pending)
        ledger(core.on_timer(fired))
        if 1 in ledger.ended:
            refused_at = fired
    assert refused_at is not None and 0.030 <= refused_at < 0.031  # A's last start (0.040 - 0.010), not its timeout
    (refused,) = [f for f in of(ledger.actions, Fail) if a in f.requests]
    assert refused.status == 503
    ledger(core.on_batch_done(then.batch, 55.0, 0.060))
    assert ledger.ended == {1: 1, 2: 1}


# -- the protocol's pure parts ------------------------------------------------------------------
def test_the_worker_is_late_only_past_the_latest_start():
    assert late_by_ms(None, 100.0) is None  # no latest start: every batch runs, as before
    assert late_by_ms(100.0, 100.0) is None
    assert late_by_ms(100.0, 100.25) == pytest.approx(250.0)


def test_latest_start_is_sent_only_to_an_executor_that_reads_the_gateways_clock():
    now = time.perf_counter()
    assert shares_clock(now - 0.002, now)  # the hello's time in transit
    assert not shares_clock(None, now)  # an executor that does not report its clock
    assert not shares_clock(now + 1.0, now)  # read after the gateway's reading: another clock
    assert not shares_clock(now - 86_400.0, now)  # another host's boot, a day apart


# -- a real worker process ----------------------------------------------------------------------
async def test_a_worker_refuses_a_batch_past_its_latest_start_and_does_not_run_it(tmp_path, example_models):
    # "slow" holds each batch for an hour: had the worker begun it, no answer would come back.
    mlp = example_models / "mlp.onnx"
    executor = ProcessExecutor(
        "gpu-0",
        {"slow": mlp, "quick": mlp},
        device="gpu:0",
        threads=1,
        cores=1.0,
        socket_dir=tmp_path,
        emulate={"slow": (0.0, 3_600_000.0), "quick": (0.0, 1.0)},
    )
    await executor.start()
    try:
        x = np.random.default_rng(0).random((2, 512), dtype=np.float32)
        with pytest.raises(BatchLate) as late:
            await asyncio.wait_for(executor.infer("slow", {"x": x}, latest_start=time.perf_counter() - 1.0), 60)
        assert late.value.late_ms >= 1000.0
        assert "did not run it" in str(late.value)
        # The executor lives on and runs what comes in time, with a latest start or without one.
        outputs, compute_ms = await executor.infer("quick", {"x": x}, latest_start=time.perf_counter() + 60.0)
        assert outputs["y"].shape[0] == 2 and compute_ms >= 1.0
        outputs, _ = await executor.infer("quick", {"x": x})
        assert outputs["y"].shape[0] == 2
        assert executor.ready and executor.restarts == 0
    finally:
        await executor.stop()


# -- a running gateway --------------------------------------------------------------------------
SLA_MS, GPU_FIXED_MS = 3000.0, 1500.0


def _gateway_config(folder, example_models):
    """One model, refused when late; an emulated GPU that needs half its SLA for any batch, and
    a work-conserving GPU policy, so that a request goes to the GPU at once on arrival, with a
    latest start 1.5 s after its arrival."""
    shutil.copy(example_models / "mlp.onnx", folder / "mlp.onnx")
    (folder / "gpu.csv").write_text(f"model,alpha_ms,beta_ms\nmlp,0.0,{GPU_FIXED_MS}\n")
    path = folder / "config.toml"
    path.write_text(
        f"""
[node]
cpu_cores = 1.0
gpus = [0]

[gpu]
executor = "emulated"
profile = "gpu.csv"
policy = "work_conserving"

[control]
policy = "fixed"

[models.mlp]
path = "mlp.onnx"
sla_ms = {SLA_MS}
max_batch_size = 8
drop_late = true
cpu = {{ cores = 0.5, threads = 1 }}
"""
    )
    return path


BODY = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.1] * 512}]}


async def _late_request(gateway, gpu_pid: int, resume_after_s: float) -> requests.Response:
    """Send one request while the GPU executor is stopped, and let it go on ``resume_after_s``
    after the gateway has the request (by then the batch is waiting in the executor's socket)."""
    os.kill(gpu_pid, signal.SIGSTOP)
    try:
        sent = asyncio.create_task(asyncio.to_thread(requests.post, f"{gateway.base}/v2/models/mlp/infer", json=BODY, timeout=30))
        while gateway.admin("mlp")["stats"]["in_flight"] == 0:  # arrival is stamped before this reads 1
            await asyncio.sleep(0.01)
        await asyncio.sleep(resume_after_s)
    finally:
        os.kill(gpu_pid, signal.SIGCONT)
    return await sent


async def test_a_late_batch_through_the_gateway_is_retried_or_refused_and_counted(tmp_path, example_models):
    with run_gateway(_gateway_config(tmp_path, example_models)) as gateway:
        (gpu,) = [e for e in gateway.admin("mlp")["executors"] if e["device"] == "gpu:0"]
        assert metric_value(gateway.metrics(), "gateway_late_actions_total", model="mlp") == 0

        # Resumed 1.8 s after the arrival: past the latest start (1.5 s), so the executor refuses
        # the batch; the GPU cannot finish the request any more, the CPU can (by 3 s): it serves it.
        response = await _late_request(gateway, gpu["pid"], 1.8)
        assert response.status_code == 200, response.text
        assert response.json()["parameters"]["executed_on"] == "cpu"
        assert metric_value(gateway.metrics(), "gateway_late_actions_total", model="mlp") == 1

        # Resumed after the deadline: no device can finish it; refused, and the client is told why.
        response = await _late_request(gateway, gpu["pid"], SLA_MS / 1000 + 0.5)
        assert response.status_code == 503, response.text
        assert LATE_REASON in response.json()["error"]
        assert metric_value(gateway.metrics(), "gateway_late_actions_total", model="mlp") == 2

        model = gateway.admin("mlp")
        assert model["stats"]["outcomes"] == {"success": 1, "refused_deadline": 1}
        assert model["stats"]["served_on"] == {"cpu": 1}
        # The executor was refusing, not failing: it was never restarted, and it still serves.
        (gpu_after,) = [e for e in model["executors"] if e["device"] == "gpu:0"]
        assert gpu_after["pid"] == gpu["pid"] and gpu_after["restarts"] == 0
        response = requests.post(f"{gateway.base}/v2/models/mlp/infer", json=BODY, timeout=30)
        assert response.status_code == 200 and response.json()["parameters"]["executed_on"] == "gpu:0"
