"""How long a lab takes here: each stage still to run, from a few timed training steps (``workflows.lab.estimate``
times them), and the most its extension rounds add."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Estimate:
    """A lab's estimated wall time here, stage by stage, and its extension rounds' bound.

    Attributes:
        lab: The lab's name.
        stages: Stage -> (trials, seconds) from a few timed steps; None when it finished already.
        extension_s: The most the extension rounds add: every configuration at an end, every round.
        searches: Searches still to run without extensions (each starts Ray and measures the predictors).
    """

    lab: str
    stages: dict[str, tuple[int, float] | None]
    extension_s: float
    searches: int


def describe_estimates(found: list[Estimate]) -> str:
    """Each lab's estimated minutes as text.

    Args:
        found: the labs' estimates.

    Returns:
        One line per lab (stage by stage, its searches, its extensions' bound) and the total.
    """
    lines = [
        "Estimated wall time here (a few training steps timed per stage; Ray's start and the measurements before "
        "each search's trials not counted):"
    ]
    total = 0.0
    for e in found:
        parts = [f"{s} done" if v is None else f"{s} {v[0]} trials {v[1] / 60:.1f} min" for s, v in e.stages.items()]
        base = sum(v[1] for v in e.stages.values() if v is not None)
        total += base
        lines.append(
            f"  {e.lab:<36} {'; '.join(parts)}; {base / 60:.1f} min in {e.searches} searches, extensions up to "
            f"+{e.extension_s / 60:.1f} min"
        )
    lines.append(f"  -> {total / 60:.1f} min in all before extensions")
    return "\n".join(lines)
