"""The executors' socket folder of a killed gateway is removed by the next gateway to start."""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

import pytest

from executors.sockets import socket_folder
from tests.helpers import busy_model, ended_pid, kill_hard, run_gateway, write_config


def with_socket(folder: Path) -> Path:
    """``folder`` holding one Unix socket, as an executor's gateway leaves it."""
    folder.mkdir()
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(folder / "cpu-mlp.sock"))
    return folder


def test_the_folders_of_ended_processes_go_and_the_others_stay(tmp_path):
    ended = with_socket(tmp_path / f"gateway-{ended_pid()}-a1b2")
    running = with_socket(tmp_path / f"gateway-{os.getppid()}-c3d4")  # a running process of that pid
    not_ours = tmp_path / f"gateway-{ended_pid()}-e5f6"  # something else than sockets in it
    not_ours.mkdir()
    (not_ours / "notes.txt").write_text("kept")
    worker = with_socket(tmp_path / f"gateway-worker-{ended_pid()}-g7h8")  # another kind's

    made = socket_folder("gateway", root=tmp_path)

    assert not ended.exists()
    assert running.is_dir() and (not_ours / "notes.txt").is_file() and worker.is_dir()
    assert made.is_dir() and made.name.startswith(f"gateway-{os.getpid()}-")
    socket_folder("gateway-worker", root=tmp_path)
    assert not worker.exists()


def test_a_gateway_removes_at_start_the_socket_folder_a_killed_one_left(tmp_path):
    busy_model(tmp_path / "busy.onnx")
    config = write_config(tmp_path / "config.toml", {"busy": {"path": "busy.onnx", "sla_ms": 100}})
    temporary = Path(tempfile.gettempdir())
    with run_gateway(config) as crashed:
        (left,) = temporary.glob(f"gateway-{crashed.process.pid}-*/")
        assert (left / "cpu-busy.sock").exists()
        kill_hard(crashed, "busy")
        assert left.is_dir()  # left behind by the crash
    with run_gateway(config) as gateway:
        assert not left.exists()  # removed at start
        assert list(temporary.glob(f"gateway-{gateway.process.pid}-*/"))


def test_a_gateway_without_memory_limits_removes_the_memory_groups_a_killed_one_left(tmp_path):
    """Only a hierarchy this gateway made a group in was swept: a killed gateway's memory groups
    (made for memory_mb) stayed for good when the next one set no memory_mb."""
    memory = Path("/sys/fs/cgroup/memory")
    if not memory.is_dir():
        pytest.skip("no cgroup v1 memory hierarchy here")
    busy_model(tmp_path / "busy.onnx")
    plain = write_config(tmp_path / "plain.toml", {"busy": {"path": "busy.onnx", "sla_ms": 100}})
    limited = tmp_path / "limited.toml"
    limited.write_text(plain.read_text() + "cpu = { memory_mb = 500 }\n")
    with run_gateway(limited) as crashed:
        left = memory / f"gateway-{crashed.process.pid}"
        assert left.is_dir()
        kill_hard(crashed, "busy")
    assert left.is_dir()  # left behind by the crash
    with run_gateway(plain):
        assert not left.exists()  # removed at start


def test_a_folder_made_in_a_pid_namespace_of_its_own_is_never_taken_for_an_ended_gateways(tmp_path, monkeypatch):
    """Named by its pid in its own namespace (a container's), a running gateway's folder in a
    /tmp shared with the host was removed by a host gateway that found no such pid of its own."""
    import executors.sockets as sockets

    monkeypatch.setattr(sockets, "pid_namespace", lambda: 4026532999)
    made = sockets.socket_folder("gateway", root=tmp_path)
    monkeypatch.undo()
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(made / "cpu-mlp.sock"))
    seen_from_the_host = made.rename(tmp_path / f"gateway-{ended_pid()}-n5s1")  # its pid: none of the host's
    assert sockets.remove_ended("gateway", tmp_path) == 0
    assert (seen_from_the_host / "cpu-mlp.sock").exists()
