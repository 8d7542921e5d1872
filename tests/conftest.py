from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.helpers import EXAMPLES, run_gateway

sys.path.insert(0, str(EXAMPLES))


@pytest.fixture(scope="session")
def example_models() -> Path:
    """The example zoo (examples/make_models.py), built once if it is not there yet."""
    import make_models

    models = EXAMPLES / "models"
    if not all((models / f"{n}.onnx").exists() for n in ("mlp", "cnn_small", "cnn_large", "ppocr_det", "upconv_xl")):
        make_models.main(["--out", str(models)])
    return models


@pytest.fixture(scope="module")
def example_gateway(example_models: Path):
    with run_gateway(EXAMPLES / "config.toml") as gateway:
        yield gateway


@pytest.fixture
def tmp_models(tmp_path: Path, example_models: Path) -> Path:
    """A folder with a copy of the MLP, for configs written by a test."""
    shutil.copy(example_models / "mlp.onnx", tmp_path / "mlp.onnx")
    return tmp_path
