"""A pipeline's request as a model's: it ends by its deadline (the client's timeout or the
server's, for the pipeline as a whole), a client that leaves is counted as gone on its steps'
models too, SIGTERM drains it between and within its steps, and the admin API names it as a
pipeline rather than failing. A two-step pipeline: a Python function that waits as long as the
request asks, then the example MLP."""

from __future__ import annotations

import concurrent.futures
import json
import os
import queue
import shutil
import signal
import socket
import threading
import time

import numpy as np
import pytest
import requests
import tritonclient.grpc as triton_grpc
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from tests.cluster import wait_for
from tests.helpers import free_port, metric_value, run_gateway, save_model, table_model
from tests.perf_analyzer import run_perf_analyzer_for_test

REQUEST_TIMEOUT_MS = 1500

FUNCTIONS = """
import time

import numpy as np


def pause(arrays):
    time.sleep(float(arrays["seconds"][0]))
    return {"x": arrays["x"]}


def same(arrays):
    return {"x": arrays["x"]}


def quit_(arrays):
    raise SystemExit(3)


def scalar(arrays):
    return {"x": np.array(1.0, np.float32)}


def counts(arrays):
    # Values that fit UINT8 where x's first value is 0, and two that do not where it is 1.
    return {"v": np.array([300, -1] if arrays["x"][0, 0] else [3, 4], np.int64)}


def with_none(arrays):
    return {"x": arrays["x"], "note": np.array([None], dtype=object)}
"""

CONFIG = f"""
[server]
request_timeout_ms = {REQUEST_TIMEOUT_MS}
model_dir = "."

[control]
policy = "fixed"

[models.mlp]
path = "mlp.onnx"
sla_ms = 1000
max_batch_size = 8
max_queue_size = 16
priority_levels = 2
cpu = {{ cores = 1.0, threads = 1 }}

[pipelines.waits]
sla_ms = 2000
inputs = [{{ name = "x", datatype = "FP32", shape = [-1, 512] }}, {{ name = "seconds", datatype = "FP32", shape = [1] }}]
outputs = [{{ name = "y", datatype = "FP32", shape = [-1, 512], source = "model/y" }}]

[[pipelines.waits.steps]]
name = "pause"
function = "steps.py:pause"
inputs = {{ x = "request/x", seconds = "request/seconds" }}
outputs = ["x"]

[[pipelines.waits.steps]]
name = "model"
model = "mlp"
inputs = {{ x = "pause/x" }}

"""


def _function_then_mlp(name: str, function: str, outputs: list[str] | None = None) -> str:
    """A pipeline NAME: the function steps.py:FUNCTION on the request's x, then the MLP."""
    return f"""
[pipelines.{name}]
sla_ms = 2000
inputs = [{{ name = "x", datatype = "FP32", shape = [-1, 512] }}]
outputs = [{{ name = "y", datatype = "FP32", shape = [-1, 512], source = "model/y" }}]

[[pipelines.{name}.steps]]
name = "first"
function = "steps.py:{function}"
inputs = {{ x = "request/x" }}
outputs = {json.dumps(outputs or ["x"])}

[[pipelines.{name}.steps]]
name = "model"
model = "mlp"
inputs = {{ x = "first/x" }}
"""


FUNCTION_PIPELINES = {"quick": "same", "quits": "quit_", "scalar": "scalar"}
CONFIG += "".join(_function_then_mlp(name, function) for name, function in FUNCTION_PIPELINES.items())
CONFIG += """
[pipelines.counted]
sla_ms = 2000
inputs = [{ name = "x", datatype = "FP32", shape = [-1, 512] }]
outputs = [{ name = "v", datatype = "UINT8", shape = [-1], source = "first/v" }]

[[pipelines.counted.steps]]
name = "first"
function = "steps.py:counts"
inputs = { x = "request/x" }
outputs = ["v"]
"""
CONFIG += """
[models.lookup]
path = "lookup.onnx"
sla_ms = 1000
max_batch_size = 8
max_queue_size = 16
cpu = { cores = 0.5, threads = 1 }

[pipelines.looks]
sla_ms = 2000
inputs = [{ name = "idx", datatype = "INT64", shape = [-1] }]
outputs = [{ name = "rows", datatype = "FP32", shape = [-1, 3], source = "model/rows" }]

[[pipelines.looks.steps]]
name = "model"
model = "lookup"
inputs = { idx = "request/idx" }
"""
# Its function's second output is sent only where the request asks for pipeline_steps.
CONFIG += _function_then_mlp("noted", "with_none", outputs=["x", "note"])


@pytest.fixture
def pipeline(tmp_path, example_models):
    shutil.copy(example_models / "mlp.onnx", tmp_path / "mlp.onnx")
    table_model(tmp_path / "lookup.onnx")
    (tmp_path / "steps.py").write_text(FUNCTIONS)
    (tmp_path / "config.toml").write_text(CONFIG)
    grpc_port = free_port()
    with run_gateway(tmp_path / "config.toml", args=["--grpc-port", str(grpc_port)]) as gateway:
        gateway.grpc_url = f"127.0.0.1:{grpc_port}"
        yield gateway


def _body(seconds: float, **parameters) -> dict:
    inputs = [
        {"name": "x", "datatype": "FP32", "shape": [1, 512], "data": [0.5] * 512},
        {"name": "seconds", "datatype": "FP32", "shape": [1], "data": [seconds]},
    ]
    return {"inputs": inputs, "parameters": parameters} if parameters else {"inputs": inputs}


def _infer(gateway, seconds: float, **parameters) -> tuple[requests.Response, float]:
    began = time.monotonic()
    response = requests.post(f"{gateway.base}/v2/models/waits/infer", json=_body(seconds, **parameters), timeout=30)
    return response, time.monotonic() - began


def _outcomes(gateway, model: str) -> dict[str, int]:
    stats = requests.get(f"{gateway.base}/v2/models/{model}/stats", timeout=10).json()["model_stats"][0]
    return {"success": stats["inference_stats"]["success"]["count"], "fail": stats["inference_stats"]["fail"]["count"]}


def _received(gateway, model: str) -> float:
    line = f'gateway_requests_received_total{{model="{model}"}} '
    found = [row for row in gateway.metrics().splitlines() if row.startswith(line)]
    return float(found[0].split()[-1]) if found else 0.0


def _in_flight(gateway, model: str) -> float:
    return metric_value(gateway.metrics(), "gateway_requests_in_flight", model=model)


def _metric(gateway, model: str, outcome: str) -> float:
    line = f'gateway_requests_total{{model="{model}",outcome="{outcome}"}} '
    found = [row for row in gateway.metrics().splitlines() if row.startswith(line)]
    return float(found[0].split()[-1]) if found else 0.0


def test_a_pipeline_ends_by_its_deadline_not_each_step_by_its_own(pipeline):
    """Each step used to get the whole request_timeout_ms from its own start, and the client's
    timeout reached no step: a 1 ms timeout was answered 200 seconds later."""
    served, took = _infer(pipeline, 0.0)
    assert served.status_code == 200, served.text
    # The client's own timeout (microseconds, as Triton reads it), passed in the function step.
    late, took = _infer(pipeline, 0.3, timeout=100_000)
    assert late.status_code == 504, late.text
    assert late.json()["error"] == "pipeline 'waits', step 'pause': the pipeline's request timed out after 100 ms"
    assert took < 0.3 + 1.0, took
    # A timeout over before the function step begins: a 504 too, counted so (it was a 500, the
    # deadline's refusal taken for the function's own failure).
    before = _metric(pipeline, "waits", "timeout")
    tight, _ = _infer(pipeline, 0.0, timeout=1)
    assert tight.status_code == 504, tight.text
    assert tight.json()["error"] == "pipeline 'waits', step 'pause': the pipeline's request timed out after 0.001 ms"
    assert _metric(pipeline, "waits", "timeout") == before + 1
    # The server's limit for the whole pipeline: the function step takes most of it, the model
    # step gets what is left (its queue times it out), not 1.5 s of its own.
    pipeline_timeouts = _metric(pipeline, "waits", "timeout")
    capped, took = _infer(pipeline, REQUEST_TIMEOUT_MS / 1000 - 0.01)
    if capped.status_code == 200:  # the MLP answered within the last 10 ms: rare, but in time
        assert took < REQUEST_TIMEOUT_MS / 1000 + 0.5
    else:
        assert capped.status_code == 504, capped.text
        assert "the pipeline's request timed out after 1500 ms" in capped.json()["error"]
        assert took < REQUEST_TIMEOUT_MS / 1000 + 0.5, took
        assert _metric(pipeline, "waits", "timeout") == pipeline_timeouts + 1
    over, took = _infer(pipeline, REQUEST_TIMEOUT_MS / 1000 + 0.5)
    assert over.status_code == 504 and took < REQUEST_TIMEOUT_MS / 1000 + 0.5, (over.text, took)


def test_a_client_that_leaves_a_pipeline_is_gone_on_its_steps_models_too(pipeline):
    before_mlp = _metric(pipeline, "mlp", "client_gone")
    # The MLP's executor stopped: the model step waits in its queue until the client leaves.
    pid = pipeline.executor_pid("mlp")
    os.kill(pid, signal.SIGSTOP)
    try:
        body = json.dumps(_body(0.0)).encode()
        with socket.create_connection(("127.0.0.1", pipeline.port), timeout=10) as sock:
            sock.sendall(
                f"POST /v2/models/waits/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            wait_for(lambda: _in_flight(pipeline, "mlp") >= 1, 10, "the request in the model step")
    finally:
        os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + 10
    while _metric(pipeline, "mlp", "client_gone") == before_mlp and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _metric(pipeline, "mlp", "client_gone") == before_mlp + 1
    assert _metric(pipeline, "mlp", "internal_error") == 0
    assert _metric(pipeline, "waits", "client_gone") == 1


def test_sigterm_drains_a_pipeline_in_its_function_step(pipeline):
    answers: list[requests.Response] = []
    sender = threading.Thread(target=lambda: answers.append(_infer(pipeline, 0.8)[0]))
    sender.start()
    # The function step is running: no request of the pipeline is in a queue.
    wait_for(lambda: _in_flight(pipeline, "waits") >= 1, 10, "the request in the pipeline")
    pipeline.process.send_signal(signal.SIGTERM)
    sender.join()
    assert answers[0].status_code == 200, answers[0].text
    assert pipeline.process.wait(timeout=20) == 0


def test_a_function_step_that_never_returns_does_not_keep_a_stopped_gateway_running(pipeline):
    """The step is waited for no longer than its request's deadline (504), and SIGTERM then stops
    the gateway: the step's thread was joined at exit, and the drained gateway never exited."""
    response, took_s = _infer(pipeline, 3600.0)
    assert response.status_code == 504 and "step 'pause'" in response.json()["error"], response.text
    assert took_s < 10 * REQUEST_TIMEOUT_MS / 1000
    pipeline.process.send_signal(signal.SIGTERM)
    assert pipeline.process.wait(timeout=60) == 0


def test_the_admin_api_names_a_pipeline_and_changes_nothing(pipeline):
    sla_before = requests.get(f"{pipeline.base}/v2/models/waits/config", timeout=10).json()["parameters"]
    expected = "'waits' is a pipeline, not a model of the admin API: set its steps' models (mlp)"
    for method, path, body in (
        ("GET", "", None),
        ("GET", "/history", None),
        ("PUT", "/sla", {"sla_ms": 100}),
        ("PUT", "/cores", {"cores": 0.5}),
        ("PUT", "/dispatch_batch", {"dispatch_batch": 1}),
    ):
        response = requests.request(method, f"{pipeline.base}/admin/models/waits{path}", json=body, timeout=10)
        assert response.status_code == 404, (path, response.text)
        assert response.json()["error"] == expected
    assert requests.get(f"{pipeline.base}/v2/models/waits/config", timeout=10).json()["parameters"] == sla_before
    assert "internal error" not in pipeline.output() and "Traceback" not in pipeline.output()


def test_a_pipeline_has_tritons_series_as_its_statistics_do(pipeline):
    """Triton's nv_inference_* read the same totals as the statistics extension, which lists the
    pipeline: the pipeline had statistics but no series."""
    for _ in range(2):
        assert _infer(pipeline, 0.0)[0].status_code == 200
    stat = requests.get(f"{pipeline.base}/v2/models/waits/stats", timeout=10).json()["model_stats"][0]
    assert (stat["name"], stat["version"], stat["inference_stats"]["success"]["count"]) == ("waits", "1", 2)
    # Each request that succeeded is an execution of the pipeline, as Triton's ensembles count
    # them: execution_count, last_inference and batch_stats stayed 0 and empty.
    assert stat["execution_count"] == 2 and abs(stat["last_inference"] / 1000 - time.time()) < 60, stat
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stat["batch_stats"]] == [(1, 2)]
    lines = pipeline.metrics().splitlines()
    assert 'nv_inference_request_success{model="waits",version="1"} 2' in lines
    assert f'nv_inference_count{{model="waits",version="1"}} {stat["inference_count"]}' in lines
    assert 'nv_inference_exec_count{model="waits",version="1"} 2' in lines
    # A pipeline waits in no queue of its own (nor do its statistics count one): its steps'
    # requests do, under their models. Its requests were counted as two waits of 0 s.
    assert 'gateway_queue_seconds_count{model="waits"} 0.0' in lines
    assert 'gateway_queue_seconds_count{model="mlp"} 2.0' in lines


def _rows(rows: int, **parameters) -> dict:
    body: dict = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 512], "data": [0.5] * 512 * rows}]}
    return {**body, "parameters": parameters} if parameters else body


def test_a_function_that_raises_system_exit_fails_its_request_not_the_gateway(pipeline):
    """SystemExit from a step's function went on through the event loop: the gateway exited."""
    for _ in range(2):
        response = requests.post(f"{pipeline.base}/v2/models/quits/infer", json=_rows(1), timeout=30)
        assert response.status_code == 500, response.text
        assert response.json()["error"] == "pipeline 'quits', step 'first' failed: RuntimeError: SystemExit(3)"
    assert pipeline.process.poll() is None
    assert requests.post(f"{pipeline.base}/v2/models/quick/infer", json=_rows(1), timeout=30).status_code == 200


def test_a_scalar_fed_to_a_model_step_is_a_500_naming_the_step(pipeline):
    response = requests.post(f"{pipeline.base}/v2/models/scalar/infer", json=_rows(1), timeout=30)
    assert response.status_code == 500, response.text
    expected = "pipeline 'scalar', step 'model' (model 'mlp'): the model's input 'x' is fed a scalar, with no rows"
    assert response.json()["error"] == expected
    assert "Traceback" not in pipeline.output()


def test_a_step_tensor_of_no_datatype_fails_its_request_over_both_protocols(pipeline):
    """A function step's tensor sent by pipeline_steps that holds a None: over HTTP it was sent as
    the text "None" (200); over gRPC its encoding failed after the request was counted a success
    (UNKNOWN to the client), and a streamed one was never answered."""
    expected = "pipeline 'noted', step output 'first/note': an element of type NoneType where BYTES (str or bytes) is declared"
    response = requests.post(f"{pipeline.base}/v2/models/noted/infer", json=_rows(1, pipeline_steps=True), timeout=30)
    assert response.status_code == 500, response.text
    assert response.json()["error"] == expected
    assert requests.post(f"{pipeline.base}/v2/models/noted/infer", json=_rows(1), timeout=30).status_code == 200

    rows = triton_grpc.InferInput("x", [1, 512], "FP32")
    rows.set_data_from_numpy(np.full((1, 512), 0.5, np.float32))
    with triton_grpc.InferenceServerClient(pipeline.grpc_url) as client:
        with pytest.raises(InferenceServerException) as refused:
            client.infer("noted", [rows], parameters={"pipeline_steps": True})
        assert refused.value.status() == "StatusCode.INTERNAL" and expected in refused.value.message()
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer("noted", [rows], request_id="bad", parameters={"pipeline_steps": True})
        client.async_stream_infer("noted", [rows], request_id="good")
        got = sorted((answers.get(timeout=30), answers.get(timeout=30)), key=lambda answer: answer[1] is None)
        client.stop_stream()
    assert got[0][1] is not None and expected in got[0][1].message()
    assert got[1][1] is None and got[1][0].get_response().id == "good"
    assert _outcomes(pipeline, "noted") == {"success": 2, "fail": 3}
    assert _metric(pipeline, "noted", "internal_error") == 3 and _metric(pipeline, "noted", "success") == 2
    assert "Traceback" not in pipeline.output()


def test_a_repository_model_of_a_pipelines_name_is_refused_in_either_layout(pipeline):
    """Versions under model_dir/NAME/ of a pipeline's NAME were loaded and served in its place
    (its metadata and answers were the model's), where a model of that name alone was refused."""
    folder = pipeline.config.parent
    (folder / "quick" / "1").mkdir(parents=True)
    shutil.copy(folder / "mlp.onnx", folder / "quick" / "1" / "model.onnx")
    fixed = "'quick' is a pipeline of the config: pipelines are not loaded or unloaded at run time"
    load = requests.post(f"{pipeline.base}/v2/repository/models/quick/load", timeout=60)
    assert load.status_code == 400 and load.json()["error"] == fixed, load.text
    assert requests.get(f"{pipeline.base}/v2/models/quick", timeout=10).json()["platform"] == "ensemble"
    served = requests.post(f"{pipeline.base}/v2/models/quick/infer", json=_rows(1), timeout=30)
    assert served.status_code == 200 and served.json()["parameters"]["executed_on"] == "pipeline"


def test_a_pipeline_is_in_the_repository_index_and_is_neither_loaded_nor_unloaded(pipeline):
    """The index left pipelines out, though clients reach them as models; an unload of one was a
    404 "unknown model 'waits'; served models: ..., waits", and a load one "no model 'waits' in
    the repository"."""
    index = requests.post(f"{pipeline.base}/v2/repository/index", json={}, timeout=10).json()
    assert {"name": "waits", "version": "1", "state": "READY", "reason": ""} in index, index
    fixed = "'waits' is a pipeline of the config: pipelines are not loaded or unloaded at run time"
    for action in ("unload", "load"):
        answer = requests.post(f"{pipeline.base}/v2/repository/models/waits/{action}", timeout=60)
        assert answer.status_code == 400 and answer.json()["error"] == fixed, (action, answer.text)
    served = requests.post(f"{pipeline.base}/v2/models/waits/infer", json=_body(0.0), timeout=30)
    assert served.status_code == 200, served.text


def test_integers_a_function_gives_are_narrowed_only_where_they_fit(pipeline):
    """int64 values where UINT8 is declared: 3 and 4 are sent as UINT8; 300 and -1 were sent as
    44 and 255, and are now the step's mistake, named."""

    def rows(first: float) -> dict:
        return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 512], "data": [first] + [0.0] * 511}]}

    fits = requests.post(f"{pipeline.base}/v2/models/counted/infer", json=rows(0.0), timeout=30)
    assert fits.status_code == 200 and fits.json()["outputs"][0]["data"] == [3, 4], fits.text
    beyond = requests.post(f"{pipeline.base}/v2/models/counted/infer", json=rows(1.0), timeout=30)
    assert beyond.status_code == 500, beyond.text
    assert beyond.json()["error"] == "pipeline 'counted', output 'v': a value beyond UINT8's range (0 to 255)"


def test_a_failed_chunk_withdraws_its_requests_other_chunks(pipeline):
    """40 chunks of 8 indices, the fifth of which holds one past the model's table: the chunks
    still queued behind it were all served for a request that had already failed. Those taken
    back are counted withdrawn on the model, not client_gone (its client stayed for the 400)."""
    indices = [1] * 320
    indices[4 * 8 + 3] = 100
    outcomes = ("success", "model_error", "withdrawn", "client_gone")
    before = {o: _metric(pipeline, "lookup", o) for o in outcomes}
    received = _received(pipeline, "lookup")
    body = {"inputs": [{"name": "idx", "datatype": "INT64", "shape": [320], "data": indices}]}
    response = requests.post(f"{pipeline.base}/v2/models/looks/infer", json=body, timeout=30)
    assert response.status_code == 400 and "idx=100" in response.json()["error"], response.text

    def ended() -> bool:  # every chunk that reached the model's queue ended (served, had it not been withdrawn)
        return sum(_metric(pipeline, "lookup", o) - before[o] for o in outcomes) >= _received(pipeline, "lookup") - received

    wait_for(ended, 10, "the chunks that reached the model ended")
    served, failed, withdrawn, gone = (_metric(pipeline, "lookup", o) - before[o] for o in outcomes)
    assert failed == 1 and withdrawn >= 1 and gone == 0, (served, failed, withdrawn, gone)
    assert served <= 4 + 2  # the four before it, and what was already running beside it
    # Every chunk that reached the model's queue ended once; those still waiting for the window never reached it.
    assert served + failed + withdrawn == _received(pipeline, "lookup") - received


def test_a_pipelines_priority_is_its_steps_and_checked(pipeline):
    refused = requests.post(f"{pipeline.base}/v2/models/quick/infer", json=_rows(1, priority=7), timeout=30)
    assert refused.status_code == 400
    assert "parameter 'priority' is 7; pipeline 'quick''s models have priority levels 1 to 2" in refused.json()["error"]
    assert requests.post(f"{pipeline.base}/v2/models/quick/infer", json=_rows(1, priority=1), timeout=30).status_code == 200


def test_slow_function_steps_of_one_pipeline_hold_up_no_other(pipeline):
    """The function steps ran in the event loop's default pool (min(32, CPUs + 4) threads): 40
    slow requests of one pipeline filled it, and another pipeline's quick step waited behind
    them past its deadline (504)."""
    slow = [threading.Thread(target=_infer, args=(pipeline, 1.2)) for _ in range(40)]
    for thread in slow:
        thread.start()
    time.sleep(0.3)  # the slow functions hold their threads
    quick = requests.post(f"{pipeline.base}/v2/models/quick/infer", json=_rows(1), timeout=30)
    for thread in slow:
        thread.join()
    assert quick.status_code == 200, quick.text


def test_a_step_models_own_refusal_names_the_step_and_counts_invalid(tmp_path):
    """A function step feeding a string model BYTES that are not UTF-8: the model's refusal left
    the pipeline as a bare 400 naming no step, counted internal_error on the model."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["s"], ["o"])],
        "strings",
        [helper.make_tensor_value_info("s", TensorProto.STRING, ["N"])],
        [helper.make_tensor_value_info("o", TensorProto.STRING, ["N"])],
    )
    save_model(graph, tmp_path / "strings.onnx")
    (tmp_path / "steps.py").write_text(
        'import numpy as np\n\n\ndef tag(arrays):\n    return {"s": np.array([b"ok", b"\\xff\\xfe"], dtype=object)}\n'
    )
    (tmp_path / "config.toml").write_text(
        """
[control]
policy = "fixed"

[models.strings]
path = "strings.onnx"
sla_ms = 1000
cpu = { cores = 0.5, threads = 1 }

[pipelines.tags]
sla_ms = 2000
inputs = [{ name = "x", datatype = "FP32", shape = [-1, 512] }]
outputs = [{ name = "o", datatype = "BYTES", shape = [-1], source = "model/o" }]

[[pipelines.tags.steps]]
name = "first"
function = "steps.py:tag"
inputs = { x = "request/x" }
outputs = ["s"]

[[pipelines.tags.steps]]
name = "model"
model = "strings"
inputs = { s = "first/s" }
"""
    )
    with run_gateway(tmp_path / "config.toml") as gateway:
        response = requests.post(f"{gateway.base}/v2/models/tags/infer", json=_rows(1), timeout=30)
        assert response.status_code == 400, response.text
        assert response.json()["error"].startswith(
            "pipeline 'tags', step 'model' (model 'strings'): input 's': element 1 is not UTF-8"
        )
        assert _metric(gateway, "strings", "invalid") == 1 and _metric(gateway, "strings", "internal_error") == 0
        assert _metric(gateway, "tags", "invalid") == 1


def test_perf_analyzer_measures_a_pipeline(pipeline):
    """A pipeline's config said platform "ensemble" without Triton's ensemble_scheduling, and
    perf_analyzer crashed (SIGSEGV) reading it. Its steps are the model steps, their tensors
    mapped to the pipeline's."""
    config = requests.get(f"{pipeline.base}/v2/models/quick/config", timeout=10).json()
    assert config["ensemble_scheduling"]["step"] == [
        {"model_name": "mlp", "model_version": -1, "input_map": {"x": "first/x"}, "output_map": {"y": "y"}}
    ]
    _, sent = run_perf_analyzer_for_test("-m", "quick", "-u", pipeline.url, "--shape", "x:1,512", trials=3)
    assert sent > 0 and _outcomes(pipeline, "quick")["success"] >= sent


def test_function_calls_that_outlive_their_requests_do_not_starve_the_pipeline(pipeline):
    """A function call given up at its request's deadline still holds its thread (Python cannot
    stop one): once 8 had hung, every later request of the pipeline waited in the queue to its
    own deadline, 504, until a restart. A thread now takes each such call's place."""
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        hung = list(pool.map(lambda _: _infer(pipeline, 20.0, timeout=200_000)[0].status_code, range(10)))
    assert hung == [504] * 10
    for _ in range(3):
        served, _ = _infer(pipeline, 0.0)
        assert served.status_code == 200, served.text


def test_step_threads_replace_calls_given_up_up_to_their_limit():
    from gateway.pipeline.functions import StepThreads

    threads = StepThreads(1, "held-test", max_held=1)
    release = threading.Event()
    first = threads.submit(release.wait)
    while not first.running():
        time.sleep(0.01)
    threads.given_up(first)  # its thread is held: another takes the queue
    assert threads.submit(lambda: "served").result(timeout=5) == "served"
    second = threads.submit(release.wait)
    while not second.running():
        time.sleep(0.01)
    threads.given_up(second)  # over max_held: not replaced, the next call waits for a thread
    third = threads.submit(lambda: "later")
    time.sleep(0.2)
    assert not third.done() and threads.held == 1
    release.set()
    assert third.result(timeout=5) == "later"
    deadline = time.monotonic() + 5
    while threads.held and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threads.held == 0  # the held thread ended with its call


def test_a_request_of_more_chunks_than_the_models_queue_holds_is_served(pipeline):
    """200 rows of a model of max_batch_size 8 are 25 requests of the MLP, whose queue holds 16:
    all sent at once, the ones past 16 were refused 429, and the pipeline's request with them.
    They now enter the queue a quarter of it at a time."""
    x = np.random.default_rng(3).random((200, 512), dtype=np.float32)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [200, 512], "data": x.ravel().tolist()}]}
    answer = requests.post(f"{pipeline.base}/v2/models/quick/infer", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    (y,) = answer.json()["outputs"]
    assert y["shape"] == [200, 512]
    one = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 512], "data": x[7].tolist()}]}
    alone = requests.post(f"{pipeline.base}/v2/models/quick/infer", json=one, timeout=60).json()["outputs"][0]["data"]
    assert np.allclose(np.asarray(y["data"]).reshape(200, 512)[7], alone, atol=1e-5)


def test_a_slow_upload_is_not_the_pipelines_compute(pipeline):
    """A pipeline's compute_ms (its answer's, and Triton's compute_infer in its statistics) was
    counted from its request's arrival: a body sent over 0.8 s was 0.8 s of compute."""
    body = json.dumps(_body(0.0)).encode()

    def trickle():
        for start in range(0, len(body), len(body) // 4 + 1):
            yield body[start : start + len(body) // 4 + 1]
            time.sleep(0.2)

    response = requests.post(
        f"{pipeline.base}/v2/models/waits/infer", data=trickle(), headers={"Content-Type": "application/json"}, timeout=30
    )
    assert response.status_code == 200, response.text
    compute_ms = response.json()["parameters"]["compute_ms"]
    assert compute_ms < 400, compute_ms
    stats = requests.get(f"{pipeline.base}/v2/models/waits/stats", timeout=10).json()["model_stats"][0]
    infer = stats["inference_stats"]["compute_infer"]
    assert infer["count"] == 1 and infer["ns"] / 1e6 == pytest.approx(compute_ms, abs=0.01)
