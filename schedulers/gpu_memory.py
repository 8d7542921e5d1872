"""GPU memory as a cache of models (Clockwork Section 4: LOAD and UNLOAD actions; Section 4.2's
"GPU memory as a cache" managed by the controller, least recently used first).

Each GPU holds the models that fit its memory budget. A batch of a model the GPU does not hold
needs a LOAD first, which takes the model's load time (Clockwork's LOAD: weights copied to the
GPU, part of the action's duration), and room: the least recently used models that are not
running are UNLOADed until the model fits. A model larger than the whole budget can never be
loaded. The dispatch core asks ``plan`` when it starts a batch on a GPU, ``commit``s the plan,
and counts the load time into the batch's end and into the deadlines it checks; the executor
carries the actions out. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


class ModelTooLarge(ValueError):
    """The model needs more memory than a GPU has for models."""


@dataclass(frozen=True)
class ModelFootprint:
    memory_mb: float
    load_ms: float


@dataclass(frozen=True)
class Load:
    """A LOAD of ``model`` on ``gpu`` (taking ``load_ms``), after UNLOADing ``evict``."""

    gpu: str
    model: str
    load_ms: float
    evict: tuple[str, ...]


@dataclass
class GpuMemory:
    """What each GPU holds, least recently used first; ``capacity_mb`` per GPU."""

    capacity_mb: float
    footprints: dict[str, ModelFootprint]
    held: dict[str, OrderedDict[str, None]] = field(default_factory=dict)

    def add_gpu(self, gpu: str) -> None:
        self.held.setdefault(gpu, OrderedDict())

    def holds(self, gpu: str, model: str) -> bool:
        return model in self.held.get(gpu, ())

    def held_anywhere(self, model: str) -> bool:
        return any(model in models for models in self.held.values())

    def used_mb(self, gpu: str) -> float:
        return sum(self.footprints[m].memory_mb for m in self.held.get(gpu, ()))

    def load_ms(self, model: str) -> float:
        return self.footprints[model].load_ms

    def check_fits(self, model: str) -> None:
        size = self.footprints[model].memory_mb
        if size > self.capacity_mb:
            raise ModelTooLarge(
                f"model '{model}' needs {size:g} MB of GPU memory, over the {self.capacity_mb:g} MB a GPU has for models"
            )

    def plan(self, gpu: str, model: str) -> Load | None:
        """None where ``gpu`` holds ``model``; else its LOAD, evicting the least recently used
        models until it fits (ModelTooLarge where it never can)."""
        if self.holds(gpu, model):
            return None
        self.check_fits(model)
        held = self.held.setdefault(gpu, OrderedDict())
        free = self.capacity_mb - self.used_mb(gpu)
        need = self.footprints[model].memory_mb
        evict = []
        for victim in held:  # oldest use first
            if free >= need:
                break
            evict.append(victim)
            free += self.footprints[victim].memory_mb
        return Load(gpu, model, self.footprints[model].load_ms, tuple(evict))

    def commit(self, load: Load) -> None:
        held = self.held.setdefault(load.gpu, OrderedDict())
        for victim in load.evict:
            held.pop(victim, None)
        held[load.model] = None

    def used(self, gpu: str, model: str) -> None:
        """A batch of ``model`` started on ``gpu``: it is now the most recently used."""
        held = self.held.get(gpu)
        if held is not None and model in held:
            held.move_to_end(model)

    def forget(self, gpu: str) -> None:
        """The GPU's executor went down (restarted): it holds nothing."""
        if gpu in self.held:
            self.held[gpu].clear()
