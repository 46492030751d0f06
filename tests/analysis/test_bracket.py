"""Is each configuration at its best rate (analysis/bracket.py)? Where its best rate lies, and the rate to try next."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from vitplast_tune.analysis.bracket import bracket_table, extension_groups, next_rate, on_ladder


def test_the_next_rate_is_the_next_rung_of_the_half_decade_ladder_or_a_geometric_step():
    assert on_ladder(0.3) and on_ladder(1.0) and on_ladder(0.03) and not on_ladder(0.05)
    assert next_rate([0.1, 0.3, 1.0], "high") == 3.0 and next_rate([0.1, 0.3, 1.0], "low") == 0.03
    assert next_rate([0.03, 0.1], "low") == 0.01 and next_rate([1.0, 3.0], "high") == 10.0
    assert next_rate([0.02, 0.04, 0.08], "high") == pytest.approx(0.16)
    assert next_rate([0.02, 0.04, 0.08], "low") == pytest.approx(0.01)


def planted() -> pd.DataFrame:
    """A grid of 0.1, 0.3, 1: fc1 best at 1 (the high end), mha at 0.3, ln1 at 0.1; fc2 best at 1 with its runs at 3
    diverged before any evaluation (no accuracy)."""
    means = {
        "fc1": {0.1: 0.5, 0.3: 0.6, 1.0: 0.7},
        "mha": {0.1: 0.5, 0.3: 0.8, 1.0: 0.6},
        "ln1": {0.1: 0.9, 0.3: 0.6, 1.0: 0.5},
        "fc2": {0.1: 0.5, 0.3: 0.6, 1.0: 0.7, 3.0: np.nan},
    }
    rows = [
        {"components": c, "lr": lr, "seed": s, "best_val_acc": v + 0.001 * s}
        for c, by in means.items()
        for lr, v in by.items()
        for s in (0, 1, 2)
    ]
    return pd.DataFrame(rows)


def test_a_planted_edge_optimum_asks_for_the_rate_beyond_it():
    table = bracket_table(planted()).set_index("components")
    assert table.loc["fc1", "position"] == "high edge" and table.loc["fc1", "next_lr"] == 3.0
    assert table.loc["mha", "position"] == "interior" and np.isnan(table.loc["mha", "next_lr"])
    assert table.loc["ln1", "position"] == "low edge" and table.loc["ln1", "next_lr"] == pytest.approx(0.03)
    assert table.loc["fc2", "position"] == "interior" and table.loc["fc2", "lrs"] == [0.1, 0.3, 1.0, 3.0]
    assert table.loc["fc2", "best_lr"] == 1.0  # the diverged rate counts as the worst: not asked for again
    assert extension_groups(bracket_table(planted())) == {0.03: ["ln1"], 3.0: ["fc1"]}
