"""A model's inputs and outputs, and the rule that decides whether its requests may be batched."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

from executors.tensors import KSERVE_TO_NUMPY


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]  # -1 where the model leaves a dimension free

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass(frozen=True)
class ModelSignature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    # False once stacking requests was seen to change their results (gateway/stacking_check.py):
    # what the gateway found by running the model, not what its executor reads from the file,
    # so two signatures that differ only in it are the same model's.
    stacks: bool = field(default=True, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelSignature:
        def specs(items: list[dict[str, Any]]) -> tuple[TensorSpec, ...]:
            return tuple(TensorSpec(i["name"], i["datatype"], tuple(i["shape"])) for i in items)

        return cls(specs(data["inputs"]), specs(data["outputs"]))

    def problem(self) -> str | None:
        """Why a client could not use this model over KServe v2, or None: a request must name at
        least one input, and every tensor's datatype must be one the protocol carries."""
        if not self.inputs:
            return "it has no inputs, and a KServe v2 request must carry at least one"
        for kind, specs in (("input", self.inputs), ("output", self.outputs)):
            for spec in specs:
                if spec.datatype not in KSERVE_TO_NUMPY:
                    return (
                        f"{kind} '{spec.name}' is {spec.datatype}, a type the KServe v2 protocol does not carry "
                        f"(served: {', '.join(KSERVE_TO_NUMPY)})"
                    )
        return None

    @property
    def batchable(self) -> bool:
        """True when every input and output has a free leading dimension: the batch dimension.

        Only then can requests be stacked along it and their results split back without
        changing any result, and only if running the model showed so (``stacks``); any other
        model is served one request at a time.
        """
        return self.stacks and all(len(t.shape) >= 1 and t.shape[0] == -1 for t in self.inputs + self.outputs)

    def unstacked(self) -> ModelSignature:
        """The same model, served one request at a time."""
        return dataclasses.replace(self, stacks=False)

    @functools.cached_property
    def text_inputs(self) -> tuple[str, ...]:
        """The BYTES inputs: ONNX Runtime's string tensors, which hold UTF-8 text only."""
        return tuple(t.name for t in self.inputs if t.datatype == "BYTES")

    def input(self, name: str) -> TensorSpec | None:
        return next((t for t in self.inputs if t.name == name), None)

    def output(self, name: str) -> TensorSpec | None:
        return next((t for t in self.outputs if t.name == name), None)
