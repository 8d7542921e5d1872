"""A batch the model refused runs each request alone on the same executor (one bad input fails
its own request only). Where the executor failed partway through, every request of the batch was
answered 503: those whose results were already in hand, and those that had never reached it."""

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


async def test_a_refused_batch_run_alone_whose_executor_dies_answers_what_ran_and_requeues_the_rest(tmp_path: Path) -> None:
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
            bodies = [await response.json() for response in responses]
        # The batch, the first request alone, the second alone (killed while it ran); then, on
        # the restarted executor, the two never sent: as a batch, refused, and each alone.
        assert calls == [[1, 2, 100, 3], [1], [2], [100, 3], [100], [3]], calls
        # Run alone before the failure: its result, not a 503.
        assert responses[0].status == 200, bodies[0]
        assert bodies[0]["outputs"][0]["data"] == [3.0, 4.0, 5.0]
        # The one it failed on: 503.
        assert responses[1].status == 503 and f"executor {executor.id} failed" in bodies[1]["error"], bodies[1]
        # Never sent before the failure: served after it, each with its own answer.
        assert responses[2].status == 400 and "failed on this input" in bodies[2]["error"], bodies[2]
        assert responses[3].status == 200 and bodies[3]["outputs"][0]["data"] == [9.0, 10.0, 11.0], bodies[3]
        runtime = engine.models["table"]
        assert runtime.outcomes == {"success": 2, "executor_failed": 1, "model_error": 1}, runtime.outcomes
        assert runtime.received == 4
    finally:
        await engine.stop()
