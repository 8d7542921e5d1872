"""The decisions schedulers return; the gateway carries them out."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Assign:
    """Give the executor ``executor_id`` one batch from the head of ``model``'s queue."""

    model: str
    executor_id: str
