"""Time a search's phases, for the summary and the parent run's ``timings.json``."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

# Phase names as the summary prints them, in the order a search goes through them.
PHASES = {
    "imports": "imports",
    "checks": "checks and data",
    "ray_start": "Ray start",
    "plasticity": "plasticity",
    "gradients": "gradient criteria",
    "records": "MLflow records",
    "trials": "trials",
    "ray_stop": "Ray stop",
    "results": "results",
    "best_model": "best model",
    "study": "Optuna study",
    "analysis": "analysis",
}


@dataclass
class Timings:
    """Add up the seconds spent in each phase of a search (``seconds``, by phase name)."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the wall-clock seconds of a block to a phase, a key of ``PHASES`` or any other name."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started

    @property
    def total(self) -> float:
        """Return the seconds of every phase together."""
        return sum(self.seconds.values())

    def describe(self) -> str:
        """Describe the phases in one line: each one's seconds and share of the total, in ``PHASES`` order."""
        total = self.total or 1.0
        order = [n for n in PHASES if n in self.seconds] + [n for n in self.seconds if n not in PHASES]
        parts = [f"{PHASES.get(n, n)} {self.seconds[n]:.1f} s ({100 * self.seconds[n] / total:.0f}%)" for n in order]
        return f"Time: {self.total:.1f} s = " + ", ".join(parts)
