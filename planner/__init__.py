"""Cost planning of multi-model pipelines under per-path SLAs: pure functions of typed data.

``plan_pipeline(pipeline) -> Plan | None`` is the planner; ``even_split_plan``, ``fa2_plan`` and
``harpagon_plan`` are the papers' baselines; ``brute_force_plan`` the exhaustive search.
"""

from planner.brute_force import brute_force_plan
from planner.dag_program import fa2_plan
from planner.latency_model import LatencyModel, TableLatency
from planner.latency_split import HarpagonPlan, harpagon_plan
from planner.pipeline import Device, Path, Pipeline, Step
from planner.plan import even_split_plan, plan_pipeline
from planner.plan_types import PathLatency, Plan
from planner.step_options import StepChoice

__all__ = [
    "Device",
    "HarpagonPlan",
    "LatencyModel",
    "Path",
    "PathLatency",
    "Pipeline",
    "Plan",
    "Step",
    "StepChoice",
    "TableLatency",
    "brute_force_plan",
    "even_split_plan",
    "fa2_plan",
    "harpagon_plan",
    "plan_pipeline",
]
