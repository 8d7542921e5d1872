"""A pipeline's Python steps: "FILE.py:NAME", a function of a dict of numpy arrays that returns one.

The file is loaded once, at start, as a module of its own (it need not be on sys.path); a name
that is not there, or not callable, is a config error.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

StepFunction = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def load_function(reference: str, base: Path) -> StepFunction:
    """The function ``reference`` names, its file relative to ``base``; ValueError saying why not."""
    file, colon, name = reference.rpartition(":")
    if not colon or not file.endswith(".py") or not name.isidentifier():
        raise ValueError(f'a function is "FILE.py:NAME", got {reference!r}')
    path = (base / file).resolve()
    if not path.is_file():
        raise ValueError(f"no Python file at {path}")
    module_name = f"gateway_pipeline_{path.stem}_{abs(hash(path)):x}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as error:
            del sys.modules[module_name]
            raise ValueError(f"{path} failed to load: {type(error).__name__}: {error}") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"{path} has no function '{name}'")
    return function
