"""Harpagon's module scheduling (Sections II and III-B, III-C): configurations, their worst-case
latency under round-robin and batch-aware dispatch, multi-tuple configuration sets (Algorithm 1),
dummy requests and latency reassignment.

A configuration is (hardware with unit price p, batch size b, duration d(b)); its throughput is
t = b / d and its throughput-cost ratio r = t / p. Costs are Harpagon's frame-rate-proportional cost
(Section III-A): a machine assigned rate f at configuration c costs p f / t, so a machine at partial
capacity counts as its share ("0.3 machines" in Table II).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

# Rates are floats (198 - 4 x 40 = 38.000000001): this much rate counts as none.
RATE_EPSILON = 1e-9


class Dispatch(Enum):
    ROUND_ROBIN = "round_robin"  # Nexus, InferLine, Clipper: each machine collects its own batch
    BATCH_AWARE = "batch_aware"  # Harpagon's throughput-cost (TC) dispatch


@dataclass(frozen=True)
class Configuration:
    hardware: str
    price: float
    batch: int
    duration_s: float

    @property
    def throughput(self) -> float:
        return self.batch / self.duration_s

    @property
    def throughput_cost_ratio(self) -> float:
        return self.throughput / self.price


@dataclass(frozen=True)
class Allocation:
    """``machines`` machines at ``configuration`` taking ``rate`` requests/s; ``collection_rate`` is
    the rate at which they collect their batches (Theorem 1's remaining workload w under batch-aware
    dispatch, the machine's own rate under round-robin)."""

    configuration: Configuration
    machines: float
    rate: float
    collection_rate: float

    @property
    def worst_case_latency_s(self) -> float:
        return self.configuration.duration_s + self.configuration.batch / self.collection_rate

    @property
    def cost(self) -> float:
        return self.configuration.price * self.machines


@dataclass(frozen=True)
class ConfigurationSet:
    allocations: tuple[Allocation, ...]
    dummy_rate: float = 0.0

    @property
    def cost(self) -> float:
        return sum(allocation.cost for allocation in self.allocations)

    @property
    def whole_machine_cost(self) -> float:
        """Cost when every partial machine is paid as a whole one (what a deployment pays)."""
        grouped: dict[Configuration, float] = {}
        for allocation in self.allocations:
            grouped[allocation.configuration] = grouped.get(allocation.configuration, 0.0) + allocation.machines
        return sum(config.price * math.ceil(machines - RATE_EPSILON) for config, machines in grouped.items())

    @property
    def worst_case_latency_s(self) -> float:
        """Theorem 1: the module's worst case is the largest of its machines'."""
        return max((allocation.worst_case_latency_s for allocation in self.allocations), default=0.0)


def round_robin_latency(config: Configuration, machine_rate: float) -> float:
    """Round-robin dispatch (Section II): a machine collects its batch at its own rate; at full
    capacity (machine_rate = t) that is 2d."""
    return config.duration_s + config.batch / machine_rate


def batch_aware_latency(config: Configuration, remaining_rate: float) -> float:
    """Theorem 1: under TC dispatch a machine collects its batch at its remaining workload w,
    Lwc = d + b / w (d + b / T for a single configuration taking the whole rate T)."""
    return config.duration_s + config.batch / remaining_rate


def by_throughput_cost_ratio(profile: Sequence[Configuration]) -> list[Configuration]:
    return sorted(profile, key=lambda c: (-c.throughput_cost_ratio, c.price, c.batch))


def generate_config(rate: float, budget_s: float, profile: Sequence[Configuration]) -> ConfigurationSet | None:
    """Algorithm 1 (GenerateConfig), batch-aware dispatch: the majority of the workload at the most
    cost-efficient configuration that meets the budget, each residual at the next one that does.
    None where no configuration meets the budget (the algorithm's ``return False``)."""
    ordered = by_throughput_cost_ratio(profile)
    remaining = rate
    allocations: list[Allocation] = []
    k = 0
    while remaining > RATE_EPSILON:
        config = ordered[k]
        if batch_aware_latency(config, remaining) <= budget_s:
            machines = remaining / config.throughput
            if machines >= 1:
                whole = math.floor(machines + RATE_EPSILON)
                allocations.append(Allocation(config, whole, whole * config.throughput, remaining))
                remaining -= whole * config.throughput
            else:
                allocations.append(Allocation(config, machines, remaining, remaining))
                remaining = 0.0
        else:
            while batch_aware_latency(ordered[k], remaining) > budget_s:
                k += 1
                if k >= len(ordered):
                    return None
    return ConfigurationSet(tuple(allocations))


def _residual_allocations(config: Configuration, residual: float, dispatch: Dispatch) -> tuple[Allocation, ...] | None:
    """The whole residual on one configuration: its full machines, then one at partial capacity,
    which collects at its own rate under either dispatch (it is last in the TC order)."""
    allocations: list[Allocation] = []
    whole = math.floor(residual / config.throughput + RATE_EPSILON)
    partial_rate = residual - whole * config.throughput
    if whole:
        collection = config.throughput if dispatch is Dispatch.ROUND_ROBIN else residual
        allocations.append(Allocation(config, whole, whole * config.throughput, collection))
    if partial_rate > RATE_EPSILON:
        allocations.append(Allocation(config, partial_rate / config.throughput, partial_rate, partial_rate))
    return tuple(allocations)


def two_tuple_config(
    rate: float, budget_s: float, profile: Sequence[Configuration], dispatch: Dispatch
) -> ConfigurationSet | None:
    """The existing systems' two-round heuristic (Section II, Table II's S1 and S2): floor(T / t_opt)
    machines at the feasible configuration of the highest throughput-cost ratio, the residual on the
    one configuration that serves it at the least cost within the budget."""

    def full_machine_latency(config: Configuration, remaining: float) -> float:
        if dispatch is Dispatch.ROUND_ROBIN:
            return round_robin_latency(config, config.throughput)
        return batch_aware_latency(config, remaining)

    feasible = [c for c in by_throughput_cost_ratio(profile) if full_machine_latency(c, rate) <= budget_s]
    if not feasible:
        return None
    best = feasible[0]
    whole = math.floor(rate / best.throughput + RATE_EPSILON)
    majority = (
        (Allocation(best, whole, whole * best.throughput, full_machine_latency_rate(best, rate, dispatch)),) if whole else ()
    )
    residual = rate - whole * best.throughput
    if residual <= RATE_EPSILON:
        return ConfigurationSet(majority)
    options = []
    for config in profile:
        allocations = _residual_allocations(config, residual, dispatch)
        if allocations and all(a.worst_case_latency_s <= budget_s for a in allocations):
            options.append(ConfigurationSet(majority + allocations))
    return min(options, key=lambda s: s.cost, default=None)


def full_machine_latency_rate(config: Configuration, rate: float, dispatch: Dispatch) -> float:
    return config.throughput if dispatch is Dispatch.ROUND_ROBIN else rate


def leftover_rates(config_set: ConfigurationSet) -> dict[Configuration, float]:
    """Section III-C: a configuration's leftover workload u_i is the rate assigned to configurations
    of lower throughput-cost ratio."""
    rates: dict[Configuration, float] = {}
    for allocation in config_set.allocations:
        rates[allocation.configuration] = rates.get(allocation.configuration, 0.0) + allocation.rate
    return {
        config: sum(r for other, r in rates.items() if other.throughput_cost_ratio < config.throughput_cost_ratio)
        for config in rates
    }


def with_dummy_requests(rate: float, budget_s: float, profile: Sequence[Configuration]) -> ConfigurationSet | None:
    """The dummy generator (Section III-C, Theorem 2): for each configuration c_i of Algorithm 1's set
    with leftover u_i < t_i, try adding dum_i = t_i - u_i requests/s and keep the cheapest set."""
    best = generate_config(rate, budget_s, profile)
    if best is None:
        return None
    for config, leftover in leftover_rates(best).items():
        if RATE_EPSILON < leftover < config.throughput:
            dummy = config.throughput - leftover
            padded = generate_config(rate + dummy, budget_s, profile)
            if padded is not None and padded.cost < best.cost - RATE_EPSILON:
                best = ConfigurationSet(padded.allocations, dummy)
    return best


def reassign_latency(
    config_set: ConfigurationSet, rate: float, extra_s: float, budget_s: float, profile: Sequence[Configuration]
) -> ConfigurationSet:
    """The latency reassigner (Section III-C): keep the majority allocation (the first one, full
    machines) and re-run Algorithm 1 (with the dummy generator) on the residual workload with the
    budget raised by the unused latency ``extra_s``; keep the result where it costs less."""
    if not config_set.allocations or extra_s <= 0:
        return config_set
    majority = config_set.allocations[0]
    residual = rate + config_set.dummy_rate - majority.rate
    if residual <= RATE_EPSILON:
        return config_set
    rerun = with_dummy_requests(residual, budget_s + extra_s, profile)
    if rerun is None:
        return config_set
    candidate = ConfigurationSet((majority, *rerun.allocations), config_set.dummy_rate + rerun.dummy_rate)
    return candidate if candidate.cost < config_set.cost - RATE_EPSILON else config_set
