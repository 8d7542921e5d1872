"""A pipeline's DAG of steps: its checks, its order and its paths. Pure: no I/O, no clock.

A step reads tensors named "request/NAME" (the pipeline's inputs) or "STEP/NAME" (another step's
outputs) and gives its own outputs; the edges of the DAG are those references. FA2 (Section IV)
gives an SLA to each path from an input to an output; a pipeline without per-path SLAs gives
every path the pipeline's SLA.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gateway.config.schema import PIPELINE_INPUT, PipelineTable


class PipelineError(ValueError):
    """What is wrong with a pipeline's definition, naming the step and the tensor."""


def split_source(source: str) -> tuple[str, str]:
    """("STEP", "TENSOR") of "STEP/TENSOR"; a tensor's own name may hold '/'."""
    step, _, tensor = source.partition("/")
    return step, tensor


@dataclass(frozen=True)
class PipelineGraph:
    name: str
    table: PipelineTable
    order: tuple[str, ...]  # the steps, each after every step it reads from
    needs: Mapping[str, frozenset[str]]  # step -> the steps it reads from
    outputs_of: Mapping[str, frozenset[str]]  # step -> the tensors it gives

    @classmethod
    def build(cls, name: str, table: PipelineTable, model_outputs: Mapping[str, Iterable[str]]) -> PipelineGraph:
        """Check ``table`` and order it. ``model_outputs``: each served model's output names (a
        step that runs a model gives exactly those). Raises PipelineError."""
        steps = {}
        for step in table.steps:
            if step.name in steps:
                raise PipelineError(f"step '{step.name}' is defined twice")
            if step.name == PIPELINE_INPUT:
                raise PipelineError(f"'{PIPELINE_INPUT}' names the pipeline's inputs; give the step another name")
            steps[step.name] = step
        outputs_of: dict[str, frozenset[str]] = {}
        for step in table.steps:
            if (step.model is None) == (step.function is None):
                raise PipelineError(f"step '{step.name}' needs exactly one of model and function")
            if step.model is not None:
                if step.model not in model_outputs:
                    raise PipelineError(f"step '{step.name}': no model '{step.model}' in [models]")
                if step.outputs:
                    raise PipelineError(f"step '{step.name}': a model's outputs come from the model; remove 'outputs'")
                outputs_of[step.name] = frozenset(model_outputs[step.model])
            else:
                if not step.outputs:
                    raise PipelineError(f"step '{step.name}': a function step must list its outputs")
                outputs_of[step.name] = frozenset(step.outputs)
        inputs = {t.name for t in table.inputs}

        def check(reference: str, where: str) -> str | None:
            """The step ``reference`` reads from (None: the pipeline's input)."""
            source, tensor = split_source(reference)
            if source == PIPELINE_INPUT:
                if tensor not in inputs:
                    raise PipelineError(f"{where}: the pipeline has no input '{tensor}' (inputs: {', '.join(sorted(inputs))})")
                return None
            if source not in steps:
                raise PipelineError(f"{where}: no step '{source}' (in '{reference}')")
            if tensor not in outputs_of[source]:
                known = ", ".join(sorted(outputs_of[source]))
                raise PipelineError(f"{where}: step '{source}' gives no '{tensor}' (it gives: {known})")
            return source

        needs: dict[str, frozenset[str]] = {}
        for step in table.steps:
            if not step.inputs:
                raise PipelineError(f"step '{step.name}' reads nothing")
            read = {check(reference, f"step '{step.name}', input '{inp}'") for inp, reference in step.inputs.items()}
            needs[step.name] = frozenset(s for s in read if s is not None)
        for output in table.outputs:
            if output.source is None:
                raise PipelineError(f"output '{output.name}' needs a source (\"STEP/TENSOR\")")
            if check(output.source, f"output '{output.name}'") is None:
                raise PipelineError(f"output '{output.name}' is an input of the pipeline: route it through a step")
        order = _topological(needs)
        graph = cls(name, table, order, needs, outputs_of)
        for path in table.paths:
            graph._check_path(path.steps)
        return graph

    def _check_path(self, steps: tuple[str, ...]) -> None:
        unknown = [s for s in steps if s not in self.needs]
        if unknown:
            raise PipelineError(f"a path names steps the pipeline does not have: {', '.join(unknown)}")
        for before, after in zip(steps, steps[1:], strict=False):
            if before not in self.needs[after]:
                raise PipelineError(f"a path goes from '{before}' to '{after}', but '{after}' does not read from '{before}'")

    @property
    def steps(self) -> dict[str, object]:
        return {step.name: step for step in self.table.steps}

    def levels(self) -> list[list[str]]:
        """The steps in waves: each wave's steps read only from earlier waves, so they may run at once."""
        done: set[str] = set()
        waves = []
        remaining = list(self.order)
        while remaining:
            wave = [s for s in remaining if self.needs[s] <= done]
            waves.append(wave)
            done.update(wave)
            remaining = [s for s in remaining if s not in done]
        return waves

    def paths(self) -> list[tuple[tuple[str, ...], float]]:
        """Every path from a step that reads only the request to a step whose tensors are
        outputs, with its SLA: the one given for it (FA2), else the pipeline's."""
        sinks = {split_source(o.source)[0] for o in self.table.outputs if o.source is not None}
        readers: dict[str, list[str]] = {s: [] for s in self.order}
        for step, needed in self.needs.items():
            for source in needed:
                readers[source].append(step)
        found: list[tuple[str, ...]] = []

        def walk(path: tuple[str, ...]) -> None:
            last = path[-1]
            if last in sinks:
                found.append(path)
            for nxt in sorted(readers[last], key=self.order.index):
                walk((*path, nxt))

        for start in (s for s in self.order if not self.needs[s]):
            walk((start,))
        given = {p.steps: p.sla_ms for p in self.table.paths}
        return [(path, given.get(path, self.table.sla_ms)) for path in found]


def _topological(needs: Mapping[str, frozenset[str]]) -> tuple[str, ...]:
    """Kahn's order, ties in definition order; PipelineError naming a cycle's steps."""
    order: list[str] = []
    placed: set[str] = set()
    pending = list(needs)
    while pending:
        ready = [s for s in pending if needs[s] <= placed]
        if not ready:
            raise PipelineError(f"the steps {', '.join(pending)} read from each other in a cycle")
        order += ready
        placed.update(ready)
        pending = [s for s in pending if s not in placed]
    return tuple(order)
