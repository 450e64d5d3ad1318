"""What measuring one trial gives, and what measures it (the search's measurement interface)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Protocol

from ..vocabulary import Problem

__all__ = ["TrialOutcome", "Measurer"]


@dataclass
class TrialOutcome:
    """What measuring one config gave: a time, or why it is invalid. ``results`` holds the
    BenchResult dicts to store (the candidate and the references it was timed with)."""

    status: str                       # "ok" or "invalid"
    median_us: Optional[float] = None
    reason: str = ""
    results: list = field(default_factory=list)
    gpu_state: dict = field(default_factory=dict)
    bnb_median_us: Optional[float] = None
    copy_gbps: Optional[float] = None


class Measurer(Protocol):
    def measure(self, problem: Problem, config) -> TrialOutcome: ...
