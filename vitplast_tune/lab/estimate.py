"""Hold and describe how long each lab's stages still to run will take here."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Estimate:
    """Hold a lab's estimated wall time here, stage by stage, and the most its extension rounds add."""

    lab: str
    stages: dict[str, tuple[int, float] | None]  # each stage's trials and seconds, None once it finished
    extension_s: float
    searches: int  # the searches still to run, without extensions


def describe_estimates(found: list[Estimate]) -> str:
    """Describe each lab's estimated minutes as text, one line per lab, and the total."""
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
