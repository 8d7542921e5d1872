"""The picture of a ``gateway bench`` run: each request's response time at the moment it was
sent, against the model's SLA, and the histogram of the response times with the SLA and the
p50 and p99 marked. Written beside the run's JSON (``--output run.json`` -> ``run.png``).

matplotlib draws it with its file-only backend (Agg): no display is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np


def write_report(
    path: Path,
    model: str,
    sent_s: Sequence[float],
    latencies_ms: Sequence[float],
    sla_ms: float | None,
    title: str,
) -> None:
    """``sent_s[i]``: when request i left, seconds from the start; ``latencies_ms[i]``: its
    response time (requests that failed are not in either)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sent, latencies = np.asarray(sent_s, dtype=float), np.asarray(latencies_ms, dtype=float)
    figure, (over_time, histogram) = plt.subplots(2, 1, figsize=(10, 7), constrained_layout=True)
    figure.suptitle(title)

    over_time.scatter(sent, latencies, s=4, alpha=0.5, color="tab:blue", label="response time")
    if len(sent):
        # The mean of each second, so a trend shows through a cloud of points.
        seconds = np.floor(sent).astype(int)
        buckets = np.unique(seconds)
        means = [latencies[seconds == b].mean() for b in buckets]
        over_time.plot(buckets + 0.5, means, color="tab:orange", linewidth=2, label="mean per second")
    if sla_ms is not None:
        over_time.axhline(sla_ms, color="tab:red", linestyle="--", label=f"SLA {sla_ms:g} ms")
    over_time.set_xlabel("time sent (s)")
    over_time.set_ylabel("response time (ms)")
    over_time.set_title(f"{model}: response time over time")
    over_time.set_ylim(bottom=0)
    over_time.legend(loc="upper right")

    if len(latencies):
        histogram.hist(latencies, bins=min(60, max(10, len(latencies) // 20)), color="tab:blue", alpha=0.8)
        for q, style in ((50, ":"), (99, "-.")):
            value = float(np.percentile(latencies, q))
            histogram.axvline(value, color="black", linestyle=style, label=f"p{q} {value:.1f} ms")
    if sla_ms is not None:
        histogram.axvline(sla_ms, color="tab:red", linestyle="--", label=f"SLA {sla_ms:g} ms")
    histogram.set_xlabel("response time (ms)")
    histogram.set_ylabel("requests")
    histogram.set_title("latency histogram")
    histogram.legend(loc="upper right")

    figure.savefig(path, dpi=100)
    plt.close(figure)
