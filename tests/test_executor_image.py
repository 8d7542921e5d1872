"""The self-contained executor image (executors/Dockerfile) holds every module the worker imports.

The image copies executors/worker.py and the modules it needs one by one (not the gateway); the
tests' Docker runs mount the whole checkout instead, so a module the worker comes to import and
the image lacks would only show where the image is used.
"""

from __future__ import annotations

import ast
import re

from tests.helpers import ROOT


def imported_executor_modules(module: str, seen: set[str] | None = None) -> set[str]:
    """``module`` (a file of executors/) and the executors modules it imports, transitively."""
    seen = seen if seen is not None else set()
    if module in seen:
        return seen
    seen.add(module)
    tree = ast.parse((ROOT / "executors" / module).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("executors."):
            imported_executor_modules(node.module.split(".")[1] + ".py", seen)
    return seen


def test_the_image_copies_every_module_the_worker_imports():
    dockerfile = (ROOT / "executors" / "Dockerfile").read_text()
    copied = {path.removeprefix("executors/") for line in re.findall(r"^COPY (.+)$", dockerfile, re.M) for path in line.split()}
    needed = imported_executor_modules("worker.py")
    assert {"worker.py", "batch_shapes.py", "wire.py", "tensors.py"} <= needed
    assert needed <= copied, f"executors/Dockerfile does not copy {sorted(needed - copied)}"
