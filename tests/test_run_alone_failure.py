"""A batch the model refused runs each request alone on the same executor (one bad input fails
its own request only). Where the executor fails partway through, the requests already run are
answered, the one it failed on ends 503 (its own input may have killed it), and those it never
reached go back to their queue. Before, every request of the batch was answered 503."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer

from gateway.config import load_config
from gateway.engine import Engine
from gateway.metrics import GatewayMetrics
from gateway.server import build_app
from tests.helpers import table_model


async def _serve_a_refused_batch_whose_executor_dies(tmp_path: Path, down_before_the_send: bool):
    """Four requests (indexes 1, 2, 100, 3; 100 is refused) planned as one batch; the executor is
    killed at its third call, the second request run alone: while it runs, or, with
    ``down_before_the_send``, before it is sent. The executor's calls, the answers, the outcomes."""
    table_model(tmp_path / "table.onnx")  # idx[N] -> rows of a 10-row table; an index past it is refused
    config = tmp_path / "config.toml"
    # A planned batch of 4 rows with a long SLA: the four requests below are one batch.
    config.write_text(
        '[node]\ncpu_cores = 1.0\n[control]\npolicy = "fixed"\n[models.table]\npath = "table.onnx"\nsla_ms = 5000\n'
        "max_batch_size = 8\ndispatch_batch = 4\ncpu = { cores = 0.5, threads = 1 }\n"
    )
    engine = Engine(load_config(config), GatewayMetrics())
    await engine.start()
    try:
        (executor,) = engine.models["table"].executors
        real_infer, calls = executor.infer, []

        async def infer(*args, **kwargs):
            calls.append(args[1]["idx"].tolist())
            if len(calls) == 3:  # the batch, the first request alone, then the executor dies
                os.kill(executor.pid, signal.SIGKILL)
                while down_before_the_send and executor.ready:
                    await asyncio.sleep(0.01)
            return await real_infer(*args, **kwargs)

        executor.infer = infer
        async with TestClient(TestServer(build_app(engine))) as client:
            answers = []
            for queued, index in enumerate((1, 2, 100, 3), start=1):
                body = {"inputs": [{"name": "idx", "shape": [1], "datatype": "INT64", "data": [index]}]}
                answers.append(asyncio.create_task(client.post("/v2/models/table/infer", json=body)))
                while queued < 4 and engine.core.queue_length("table") < queued:  # in this order
                    await asyncio.sleep(0.01)
            responses = [await asyncio.wait_for(answer, 60) for answer in answers]
            answered = [(response.status, await response.json()) for response in responses]
        runtime = engine.models["table"]
        assert runtime.received == 4
        return calls, answered, runtime.outcomes, executor.id
    finally:
        await engine.stop()


async def test_a_refused_batch_run_alone_whose_executor_dies_answers_what_ran_and_requeues_the_rest(tmp_path: Path) -> None:
    calls, answered, outcomes, executor_id = await _serve_a_refused_batch_whose_executor_dies(tmp_path, False)
    # The batch, the first request alone, the second alone (killed while it ran); then, on the
    # restarted executor, the two never sent: as a batch, refused, and each alone.
    assert calls == [[1, 2, 100, 3], [1], [2], [100, 3], [100], [3]], calls
    # Run alone before the failure: its result, not a 503.
    assert answered[0] == (200, answered[0][1]) and answered[0][1]["outputs"][0]["data"] == [3.0, 4.0, 5.0]
    # The one it failed on: 503.
    assert answered[1][0] == 503 and f"executor {executor_id} failed" in answered[1][1]["error"], answered[1]
    # Never sent before the failure: served after it, each with its own answer.
    assert answered[2][0] == 400 and "failed on this input" in answered[2][1]["error"], answered[2]
    assert answered[3][0] == 200 and answered[3][1]["outputs"][0]["data"] == [9.0, 10.0, 11.0], answered[3]
    assert outcomes == {"success": 2, "executor_failed": 1, "model_error": 1}, outcomes


async def test_a_request_the_dead_executor_was_never_sent_goes_back_to_its_queue_too(tmp_path: Path) -> None:
    """Down before the second request was sent ("not running"): its input did not fail it."""
    calls, answered, outcomes, _ = await _serve_a_refused_batch_whose_executor_dies(tmp_path, True)
    assert calls[:3] == [[1, 2, 100, 3], [1], [2]] and calls[3:] == [[2, 100, 3], [2], [100], [3]], calls
    assert [status for status, _ in answered] == [200, 200, 400, 200], answered
    assert answered[1][1]["outputs"][0]["data"] == [6.0, 7.0, 8.0]
    assert outcomes == {"success": 3, "model_error": 1}, outcomes
