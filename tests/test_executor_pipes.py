"""What passes between an executor process and the gateway besides requests: its output lines,
relayed to the gateway's log (executors/process.py's relay_lines), and its frames, sent whole
(executors/wire.py's send_frame), whatever a client's input makes of them."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import requests
from onnx import TensorProto, helper

from executors.process import LONGEST_LINE_BYTES, relay_lines
from executors.wire import encode_frame, read_frame_blocking, send_frame
from tests.helpers import run_gateway, save_model


async def test_a_line_longer_than_the_streams_limit_is_cut_and_the_relay_goes_on():
    stream = asyncio.StreamReader(limit=1024)
    stream.feed_data(b"first\n" + b"x" * 50_000 + b"\nafter the long one\nlast, unended")
    stream.feed_eof()
    lines: list[str] = []
    await asyncio.wait_for(relay_lines(stream, lines.append), 10)
    assert lines[0] == "first" and lines[2:] == ["after the long one", "last, unended"]
    assert lines[1].startswith("x" * LONGEST_LINE_BYTES + " ... (cut: the line goes on past") and len(lines) == 4


class Trickle:
    """A socket whose sendmsg sends at most ``most`` bytes a call, as a blocking one does when a
    stop signal ends its wait for room."""

    def __init__(self, peer: socket.socket, most: int):
        self.peer, self.most, self.calls = peer, most, 0

    def sendmsg(self, buffers) -> int:
        self.calls += 1
        data = b"".join(bytes(b) for b in buffers)[: self.most]
        self.peer.sendall(data)
        return len(data)


def test_a_frame_sent_in_parts_arrives_whole():
    ours, theirs = socket.socketpair()
    payload = np.arange(10_000, dtype=np.float32)
    trickle = Trickle(ours, 4099)
    send_frame(trickle, encode_frame({"kind": "result", "id": 7}, [b"", memoryview(payload), b"tail"]))
    ours.close()
    header, body = read_frame_blocking(theirs.makefile("rb"))
    assert header == {"kind": "result", "id": 7} and trickle.calls > 5
    assert bytes(body) == payload.tobytes() + b"tail"


def test_a_client_whose_refusal_the_runtime_logs_at_length_does_not_hang_the_executor(tmp_path):
    """ONNX Runtime logs a Reshape it refuses with the shape asked for, which the client sends: a
    shape of 40,000 dimensions made an 80 kB line, the relay of the executor's output ended on it,
    and a few such requests later the full pipe blocked the executor (503, killed as hung)."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        "reshape",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, ["K"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["A", "B"])],
    )
    save_model(graph, tmp_path / "reshape.onnx")
    config = tmp_path / "config.toml"
    config.write_text(
        '[control]\npolicy = "fixed"\n[models.rs]\npath = "reshape.onnx"\nsla_ms = 50\nmax_batch_size = 1\n'
        "hang_timeout_ms = 5000\ncpu = { cores = 0.5, threads = 1 }\n"
    )
    x = {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}
    good = {"inputs": [x, {"name": "shape", "shape": [2], "datatype": "INT64", "data": [2, 2]}]}
    bad = {"inputs": [x, {"name": "shape", "shape": [40000], "datatype": "INT64", "data": [1] * 40000}]}
    with run_gateway(config) as gateway:
        url = f"{gateway.base}/v2/models/rs/infer"
        statuses = []
        for _ in range(12):  # the pipe (64 kB) was full by the fifth or sixth
            statuses.append(requests.post(url, json=bad, timeout=60).status_code)
            statuses.append(requests.post(url, json=good, timeout=60).status_code)
        assert statuses == [400, 200] * 12, statuses
        assert gateway.admin("rs")["executors"][0]["restarts"] == 0
        assert "(cut: the line goes on past" in gateway.output()


async def test_a_connection_left_by_an_earlier_launch_is_not_taken_for_the_next(example_models, tmp_path):
    """A launch that exited just after its hello was given up on, and its connection, accepted
    after that, stayed queued: the next launch took it (its pid, a closed connection) and was
    restarted at once."""
    from executors.connection import ExecutorConnection
    from executors.process import ProcessExecutor

    executor = ProcessExecutor(
        "cpu-mlp", {"mlp": example_models / "mlp.onnx"}, device="cpu", threads=1, cores=1.0, socket_dir=tmp_path
    )
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=ours)
    stale = ExecutorConnection(reader, writer, {"kind": "hello", "pid": 1, "models": {}})
    await executor._accepted.put(stale)  # as _on_connect queues it
    await executor.start()
    try:
        assert executor.pid != 1 and executor.restarts == 0 and executor.state == "ready"
        assert "mlp" in executor.signatures
    finally:
        await executor.stop()
        theirs.close()


def test_a_containers_long_line_is_cut_as_a_process_executors_is():
    """A Docker executor's relay logged ONNX Runtime's 80 kB words on a client's input whole,
    twelve requests making a megabyte of log, where a process executor's cuts them."""
    from executors.container import _said

    assert _said(b"short line\n") == "short line"
    long = _said(b"x" * 80_000)
    assert long.startswith("x" * LONGEST_LINE_BYTES + " ... (cut: the line goes on past 80000 bytes)")
