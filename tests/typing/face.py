"""A user's script of the Python face, never run: the type checker (pyright, in CI) reads it, so a public name that
moves, or a signature that changes under a user, fails CI."""

from __future__ import annotations

import pandas as pd

import vitplast_tune as vt


def a_users_script(storage: str) -> None:
    names: list[str] = vt.list_searches(storage)
    search: vt.Search = vt.load_search(names[0], storage=storage)
    trials: pd.DataFrame = search.trials
    runs: pd.DataFrame = search.runs()
    fronts: dict[str, pd.DataFrame] = search.pareto()
    text: str = search.summary()
    print(len(trials), len(runs), len(fronts), text, search.study.study_name, repr(search))
    try:
        vt.load_search("missing", storage=storage)
    except vt.SearchNotFound as exc:
        assert isinstance(exc, vt.UserError)
    spec = vt.load_space("component_subsets")
    options = vt.SearchOptions(space=str(spec.path), name="quickstart", storage=storage)
    print(options.name, spec.algorithm)
