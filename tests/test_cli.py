"""The `gateway` command: every sub-command is listed, and `gateway serve` imports no client tool."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gateway.cli import COMMANDS, main
from tests.helpers import ROOT

TOOLS = sorted(module for module, _ in COMMANDS.values())


def test_serve_imports_no_tool():
    """The server's import path, and the CLI parsing a serve command, leave every tool unloaded."""
    probe = (
        "import sys, gateway.cli, gateway.server\n"
        "code = gateway.cli.main(['serve', 'no-such-config.toml'])\n"
        "print(code, sorted(m for m in sys.modules if m.startswith('gateway.tools') or m in sys.argv[1:]))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, *TOOLS], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(maxsplit=1) == ["2", "[]\n"]
    assert "no-such-config.toml: (file): no such file" in done.stderr


def test_help_lists_every_sub_command():
    done = subprocess.run([sys.executable, "-m", "gateway.cli", "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    for name in ["serve", *COMMANDS]:
        assert name in done.stdout


@pytest.mark.parametrize("name", ["serve", *COMMANDS])
def test_each_sub_command_has_its_arguments(name, capsys):
    with pytest.raises(SystemExit) as exited:
        main([name, "--help"])
    assert exited.value.code == 0
    assert "--log-level" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["serve", "worker", *COMMANDS])
@pytest.mark.parametrize("level", ["bogus", "10"])
def test_a_log_level_logging_does_not_know_is_a_usage_error(name, level, capsys):
    """logging refused it once the command had begun: a traceback ('Unknown level')."""
    arguments = [name, "config.toml"] if name in ("serve", "worker") else [name]
    with pytest.raises(SystemExit) as exited:
        main([*arguments, "--log-level", level])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert f"argument --log-level: must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL (in any case), got '{level}'" in error


def test_a_log_level_is_taken_in_any_case():
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "config-schema", "--log-level", "debug"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr


def test_serving_on_port_0_logs_the_port_the_system_chose(tmp_models):
    """--port 0 served on a port of the system's choosing, and the log said ":0"."""
    import re
    import subprocess
    import sys
    import time

    import requests

    from tests.helpers import ROOT, write_config

    config = write_config(tmp_models / "config.toml", {"mlp": {"path": "mlp.onnx", "sla_ms": 100}})
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", str(config), "--port", "0"],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline, said = time.monotonic() + 120, ""
        while "serving 1 model(s)" not in said and time.monotonic() < deadline:
            said += process.stderr.readline()
        (port,) = re.findall(r"serving 1 model\(s\) on http://127\.0\.0\.1:(\d+)", said)
        assert port != "0"
        assert requests.get(f"http://127.0.0.1:{port}/v2/health/live", timeout=5).status_code == 200
    finally:
        process.terminate()
        process.wait(timeout=30)
