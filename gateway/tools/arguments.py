"""Argument types of the sub-commands: a wrong value is argparse's one-line error (exit 2)
naming the option, before any work, rather than a traceback or a run that sends nothing."""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable
from pathlib import Path

# The least Gamma shape of arrival gaps: under it the gaps are all but all zeros in floating
# point, their mean held by gaps too rare ever to be drawn, and time stood still (a shape of
# 1e-300 never ended). Symphony's are 0.1 to 1.
MIN_GAMMA_SHAPE = 0.01
# The most arrivals a run draws before it begins (each one kept for the run: 1e9 a second for
# 10 s took the machine's memory before a request was sent or simulated).
MAX_ARRIVALS = 5_000_000


def _number(text: str) -> float:
    """``text`` as a float (inf and NaN too: each caller says what it takes)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def _whole(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least {least}")
    return value


def positive_float(text: str) -> float:
    """A finite number over 0 (a rate, a duration, a Gamma shape)."""
    value = _number(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number over 0")
    return value


def gamma_shape(text: str) -> float:
    """A Gamma shape of arrival gaps: a finite number of at least ``MIN_GAMMA_SHAPE``."""
    value = positive_float(text)
    if value < MIN_GAMMA_SHAPE:
        raise argparse.ArgumentTypeError(f"{text!r} is under {MIN_GAMMA_SHAPE:g}, the least Gamma shape (its gaps round to 0)")
    return value


def refuse_too_many_arrivals(tool: str, steps: Iterable[tuple[float, float]]) -> None:
    """A one-line error (exit 1) where (rate, seconds) steps ask for more than ``MAX_ARRIVALS``."""
    expected = sum(rate * seconds for rate, seconds in steps)
    if expected > MAX_ARRIVALS:
        raise SystemExit(
            f"gateway {tool}: the rates and seconds ask for {expected:.3g} arrivals, more than the {MAX_ARRIVALS:,} one run draws"
        )


def non_negative_float(text: str) -> float:
    """A finite number of at least 0 (a delay, a price, a time that may be none)."""
    value = _number(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number of at least 0")
    return value


def share(text: str) -> float:
    """A number over 0 and under 1 (a set point, a bisection's width as a share of its range)."""
    value = positive_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be under 1")
    return value


def positive_floats(text: str) -> list[float]:
    """A,B,...: finite numbers over 0 (core counts, Gamma shapes)."""
    return [positive_float(part) for part in text.split(",")]


def seed(text: str) -> int:
    """A random seed: a whole number from 0 (numpy refuses a negative one)."""
    return _whole(text, 0)


def positive_int(text: str) -> int:
    """A whole number from 1 (GPUs, clients, seeds)."""
    return _whole(text, 1)


def existing_file(text: str) -> Path:
    """A file to read, there now."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no file at {path}")
    return path


def output_file(text: str) -> str:
    """A file to write: its folder must be there already, writable, and the name no folder's
    (found out before a run, not after it, when the results would be lost)."""
    path = Path(text)
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"no folder {path.parent} to write {text} in")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file's name")
    existed = path.exists()
    try:  # opened for appending, as the run will write it: nothing of a file there now is lost
        path.open("ab").close()
    except OSError as error:
        raise argparse.ArgumentTypeError(f"{text} cannot be written: {error.strerror}") from None
    if not existed:
        path.unlink()
    return text


def json_output_file(text: str) -> str:
    """A JSON file to write with a PNG report beside it (the same name, .png): so not a .png itself,
    which the JSON would overwrite."""
    if Path(text).suffix.lower() == ".png":
        raise argparse.ArgumentTypeError(
            f"{text!r} is the report's name: give the JSON's ({Path(text).with_suffix('.json')}), the report goes beside it"
        )
    output_file(str(Path(text).with_suffix(".png")))  # the report's too: a folder of its name lost the run's results
    return output_file(text)


def rate_steps(text: str) -> list[tuple[float, float]]:
    """RATE:SECONDS,RATE:SECONDS,...: a schedule of rates (a rate may be 0, a pause)."""
    steps = []
    for part in text.split(","):
        rate, colon, seconds = part.partition(":")
        try:
            step = (float(rate), float(seconds))
        except ValueError:
            step = (math.nan, math.nan)
        if not colon or not all(math.isfinite(v) for v in step) or step[0] < 0 or step[1] <= 0:
            raise argparse.ArgumentTypeError(f"{part!r} is not RATE:SECONDS (a rate of at least 0, seconds over 0)")
        steps.append(step)
    return steps


def tensor_shape(text: str) -> tuple[str, list[int]]:
    """NAME=D1,D2,...: an input's shape."""
    name, equals, dims = text.partition("=")
    try:
        shape = [int(d) for d in dims.split(",")]
    except ValueError:
        shape = []
    if not equals or not name or not shape or any(d < 0 for d in shape):
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=D1,D2,... (whole numbers of at least 0)")
    return name, shape
