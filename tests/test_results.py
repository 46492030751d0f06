"""The trial table's helpers on hand-made result grids (no Ray)."""

from types import SimpleNamespace

from vitplast_tune import results


def result(metrics=None, error=None):
    return SimpleNamespace(metrics=metrics, error=error)


def test_unfinished_counts_trials_that_neither_completed_nor_failed():
    grid = [
        result({"step": 400, "done": True}),  # trained its budget
        result({"step": 100, "done": True}),  # stopped early by the scheduler: complete
        result({"step": 8, "diverged": 1, "done": True}),  # diverged: complete (failed in MLflow and Optuna)
        result({"step": 50}, error=RuntimeError("worker died")),  # errored: ended
        result({"step": 150, "done": False}),  # running when Ctrl-C came (Tune then calls it TERMINATED)
        result({}),  # pending: never started
        result(None),
    ]
    assert results.unfinished(grid) == 3
    assert results.unfinished(grid[:4]) == 0
