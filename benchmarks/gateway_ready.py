"""Wait for a `gateway serve` that a benchmark started to be ready (GET /v2/health/ready)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import requests


def wait_ready(base: str, process: subprocess.Popen, log: Path | None = None, timeout_s: float = 120.0) -> float:
    """Seconds until ``base`` answered ready; RuntimeError (with the end of ``log``, the gateway's
    output, where there is one) where the gateway exited first or was not ready within ``timeout_s``."""

    def tail() -> str:
        return f"; the end of {log}:\n{log.read_text()[-3000:]}" if log is not None and log.exists() else ""

    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        try:
            if requests.get(f"{base}/v2/health/ready", timeout=2).status_code == 200:
                return time.monotonic() - began
        except requests.ConnectionError:
            pass
        if process.poll() is not None:
            raise RuntimeError(f"the gateway exited with {process.returncode}{tail()}")
        time.sleep(0.2)
    raise RuntimeError(f"the gateway was not ready within {timeout_s:.0f} s{tail()}")
