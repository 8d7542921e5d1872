"""How late a process on this machine wakes, second by second: the stalls a shared machine puts
into every process on it, measured beside a benchmark's load.

A second process sleeps in steps of ``SLEEP_S`` and writes down each wake-up later than
``REPORT_MS`` past its due time, and once a second the hypervisor's steal time (the CPU time
the virtual machine's CPUs were ready to run but not given, /proc/stat). A late wake-up of
this idle process means that no CPU of the machine was free for it that long: every process
waiting to run then waited at least as long. Steal is CPU time that every process of the
virtual machine lost. The ROMA benchmarks read both beside each violating second, to tell a
second that the control plane lost from one that the machine took.

Times are time.perf_counter's (CLOCK_MONOTONIC on Linux, the same in every process), so they
line up with the clients' samples and the gateway's history.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SLEEP_S = 0.005
# Wake-ups later than this are written down (a 5 ms sleep on an idle core wakes within 0.1-0.2 ms).
REPORT_MS = 5.0
# Heavy steal, as the ROMA benchmarks count it beside their violating seconds: a second of the
# probe in which the hypervisor took this much of the CPUs' time (over both: a tenth of them).
HEAVY_STEAL_MS = 200

PROBE = """
import os, sys, time
sleep_s, report_ms = float(sys.argv[1]), float(sys.argv[2])
ticks = os.sysconf("SC_CLK_TCK")
def steal():
    with open("/proc/stat") as f:
        return int(f.readline().split()[8])
last, next_read = steal(), time.perf_counter() + 1.0
while True:
    before = time.perf_counter()
    time.sleep(sleep_s)
    now = time.perf_counter()
    late_ms = (now - before - sleep_s) * 1000
    if late_ms > report_ms:
        print(f"w {now:.6f} {late_ms:.3f}", flush=True)
    if now >= next_read:
        stolen = steal()
        print(f"s {now:.6f} {(stolen - last) * 1000 / ticks:.1f}", flush=True)
        last, next_read = stolen, next_read + 1.0
"""


@dataclass
class Stalls:
    """What the probe saw: (perf_counter time, ms late) of each late wake-up, and (perf_counter
    time, ms of steal time over all CPUs in the second before it) once a second."""

    late: list[tuple[float, float]] = field(default_factory=list)
    steal: list[tuple[float, float]] = field(default_factory=list)

    def read(self, text: str) -> None:
        for line in text.splitlines():
            kind, at, value = line.split()
            (self.late if kind == "w" else self.steal).append((float(at), float(value)))

    def since(self, start: float) -> dict[str, list[tuple[float, float]]]:
        """Both lists with their times counted from ``start`` (a benchmark's time 0), for its JSON."""
        return {
            "late": [(round(t - start, 4), ms) for t, ms in self.late],
            "steal": [(round(t - start, 4), ms) for t, ms in self.steal],
        }


@contextlib.contextmanager
def probing() -> Iterator[Stalls]:
    """Run the probe while the block runs; the returned ``Stalls`` is filled when it ends."""
    stalls = Stalls()
    with tempfile.TemporaryDirectory(prefix="stall-probe-") as folder:
        out_path = Path(folder) / "probe.txt"
        with out_path.open("w") as out:
            process = subprocess.Popen([sys.executable, "-c", PROBE, str(SLEEP_S), str(REPORT_MS)], stdout=out)
        try:
            yield stalls
        finally:
            process.terminate()
            process.wait(timeout=10)
            # A line cut short by the end of the process is dropped.
            stalls.read("\n".join(line for line in out_path.read_text().splitlines() if len(line.split()) == 3))


def in_window(recorded: dict[str, list[tuple[float, float]]], begin_s: float, end_s: float) -> tuple[float, float]:
    """The longest late wake-up between ``begin_s`` and ``end_s`` of a benchmark's recording
    (``Stalls.since``), and the most steal time (ms over all CPUs) of a probe's second that
    overlaps them."""
    late = max((ms for t, ms in recorded["late"] if begin_s <= t < end_s), default=0.0)
    steal = max((ms for t, ms in recorded["steal"] if begin_s < t < end_s + 1.0), default=0.0)
    return late, steal


def in_second_sent(recorded: dict[str, list[tuple[float, float]]], second: int, sla_ms: float) -> tuple[float, float]:
    """``in_window`` for the requests sent in ``second`` of a benchmark's load: they are answered
    by the end of the next SLA after it."""
    return in_window(recorded, second, second + 1 + sla_ms / 1000)
