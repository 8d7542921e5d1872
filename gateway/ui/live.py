"""``GET /admin/live``: the per-second series of every model, the node and its GPUs, as JSON.

The live page (/ui) reads it every second; it is usable by itself, by anyone with the admin
token, like the rest of /admin. The series come from ``gateway.ui.series.LiveSeries``, which the
engine fills from its own events; Symphony's autoscaling advice (Section 4.4) is read from the
GPU cluster's last period where the node has GPUs (``Engine.gpu_scaling_signal``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gateway.protocol import InvalidRequest
from gateway.ui.series import SECONDS

if TYPE_CHECKING:
    from gateway.engine import Engine

# What the page asks for unless told: two minutes, enough to see a step of the load and the
# control settle after it.
DEFAULT_SECONDS = 120


def seconds_asked(query: Mapping[str, str]) -> int:
    """The ``seconds`` query parameter: a whole number from 1 to the seconds kept; any other
    parameter is a mistake too (400 naming it)."""
    unknown = sorted(set(query) - {"seconds"})
    if unknown:
        raise InvalidRequest(f"unknown query parameter '{unknown[0]}': /admin/live takes only 'seconds'")
    given = query.get("seconds")
    if given is None:
        return DEFAULT_SECONDS
    if not (given.isascii() and given.isdigit()) or not 1 <= int(given) <= SECONDS:
        raise InvalidRequest(f"the query parameter 'seconds' must be a whole number from 1 to {SECONDS}, got '{given}'")
    return int(given)


def live_document(engine: Engine, seconds: int) -> dict[str, Any]:
    """The last ``seconds`` whole seconds of every model, GPU and the node, and the state now."""
    now = engine.now
    gpus = [executor.id for executor in engine.gpu_executors]
    served = engine.listed_models()  # as GET /admin/models lists them: not one being loaded or unloaded
    snapshot = engine.live.snapshot(now, seconds, {name: r.sla_ms for name, r in served.items()}, gpus)
    models = []
    for name, runtime in served.items():
        series = snapshot["models"][name]
        models.append(
            {
                "name": name,
                "sla_ms": runtime.sla_ms,
                "sla_measure": runtime.config.sla_measure,
                "queue_length": engine.core.queue_length(name) if name in engine.core.models else 0,
                "cpu_executor": bool(runtime.executors),
                "cores": sum(e.cores for e in runtime.executors),
                "mean_rt_ms": runtime.times.mean_ms if runtime.times.requests else None,
                "p99_rt_ms": runtime.times.p99_ms if runtime.times.requests else None,
                "served_on": dict(runtime.devices),
                **series,
            }
        )
    config = engine.config
    return {
        "seconds": len(snapshot["t"]),
        "t": snapshot["t"],
        "period_s": config.control.period_s,
        "node": {
            "cpu_cores": config.node.cpu_cores,
            "controlled": engine.control is not None,
            "policy": config.control.policy,
            "granted_cores": snapshot["node"]["granted_cores"],
            "used_cores": snapshot["node"]["used_cores"],
        },
        "models": models,
        "gpus": [{"id": gpu, **snapshot["gpus"][gpu]} for gpu in gpus],
        "scaling": _scaling(engine, snapshot["node"]),
    }


def _scaling(engine: Engine, node: Mapping[str, Any]) -> dict[str, Any] | None:
    """Symphony's advice for the node's GPUs now, with the per-second bad rate and idle fraction;
    None where the node has no GPUs. Infinitely many GPUs to add (nothing met its SLO) is null."""
    if engine.gpu_cluster is None:
        return None
    signal = engine.gpu_scaling_signal()
    return {
        "gpus": len(engine.gpu_executors),
        "bad_rate": signal.bad_rate,
        "idle_fraction": signal.idle_fraction,
        "gpus_to_add": signal.gpus_to_add if math.isfinite(signal.gpus_to_add) else None,
        "gpus_to_release": signal.gpus_to_release,
        "bad_rate_series": node["bad_rate"],
        "idle_fraction_series": node["idle_fraction"],
    }
