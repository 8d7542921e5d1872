"""Triton's load tool, perf_analyzer, for tests and benchmarks: taken out of the tritonclient
wheel, never installed into the project's environment.

The binary ships inside the tritonclient wheel up to 2.51.0 only on this glibc (2.36); it links
libb64 (Debian's libb64-0d, installed by .ci/run) and the CUDA runtime library, which the
nvidia-cuda-runtime-cu12 wheel carries (it only loads it; no GPU is needed for HTTP or gRPC).
Both wheels are fetched by pip into benchmarks/work/perf_analyzer/ on first use.
"""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.helpers import ROOT

TRITONCLIENT = "tritonclient==2.51.0"
CUDA_RUNTIME = "nvidia-cuda-runtime-cu12"
FOLDER = ROOT / "benchmarks" / "work" / "perf_analyzer"
REQUIRE_ENV = "GATEWAY_REQUIRE_PERF_ANALYZER"


class PerfAnalyzerUnavailable(RuntimeError):
    """perf_analyzer cannot run here; the message says what is missing."""


def _wheel(requirement: str) -> Path:
    name = requirement.split("==")[0].replace("-", "_")
    found = sorted(FOLDER.glob(f"{name}-*.whl"))
    if found:
        return found[-1]
    FOLDER.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", str(FOLDER), requirement],
        capture_output=True,
        text=True,
    )
    found = sorted(FOLDER.glob(f"{name}-*.whl"))
    if done.returncode != 0 or not found:
        raise PerfAnalyzerUnavailable(f"pip could not fetch {requirement}: {done.stderr.strip()[-500:]}")
    return found[-1]


def _extract(wheel: Path, member_suffix: str) -> Path:
    with zipfile.ZipFile(wheel) as archive:
        member = next((m for m in archive.namelist() if m.endswith(member_suffix)), None)
        if member is None:
            raise PerfAnalyzerUnavailable(f"{wheel.name} has no file ending in {member_suffix}")
        target = FOLDER / Path(member).name
        if not target.exists():
            target.write_bytes(archive.read(member))
            target.chmod(0o755)
        return target


def perf_analyzer() -> tuple[Path, dict[str, str]]:
    """The binary and the environment to run it with; PerfAnalyzerUnavailable says what is missing."""
    if ctypes.util.find_library("b64") is None:
        raise PerfAnalyzerUnavailable("libb64 is missing: apt-get install -y libb64-0d")
    binary = _extract(_wheel(TRITONCLIENT), "/bin/perf_analyzer")
    _extract(_wheel(CUDA_RUNTIME), "/lib/libcudart.so.12")
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(FOLDER), os.environ.get("LD_LIBRARY_PATH")])))
    return binary, env


def perf_analyzer_for_test() -> tuple[Path, dict[str, str]]:
    """``perf_analyzer()`` in a test: where it cannot run, the test is skipped, or fails where
    it must run (CI, or GATEWAY_REQUIRE_PERF_ANALYZER=1)."""
    import pytest

    try:
        return perf_analyzer()
    except PerfAnalyzerUnavailable as missing:
        if os.environ.get(REQUIRE_ENV) == "1" or os.environ.get("CI") == "true":
            pytest.fail(f"perf_analyzer is required here: {missing}")
        pytest.skip(f"perf_analyzer cannot run here: {missing}")


def run_perf_analyzer_for_test(*options: str, trials: int = 5, interval_ms: int = 1000) -> tuple[str, int]:
    """perf_analyzer with ``options`` (the model, the URL, ...) until stable or ``trials`` are
    done; the test fails where it exits non-zero. Its output, and the requests it counted sent."""
    import re
    import subprocess

    binary, env = perf_analyzer_for_test()
    done = subprocess.run(
        [str(binary), *options, "--measurement-interval", str(interval_ms), "--stability-percentage", "100"]
        + ["--max-trials", str(trials)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    sent = re.search(r"Client: \s+Request count: (\d+)", done.stdout)
    return done.stdout, int(sent.group(1)) if sent else 0
