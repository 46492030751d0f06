"""The summary a search prints at its end, kept as printed (``summary.txt``): ``vitplast search`` prints the text it
keeps, and ``Search.summary()`` reads it back, timings and all, where a text made again from the records has none."""

from __future__ import annotations

import pandas as pd

import vitplast_tune as vt
from vitplast_tune.config import FinetuneConfig
from vitplast_tune.records.printed import SUMMARY_FILE, forget_summary, keep_summary
from vitplast_tune.records.search import Search
from vitplast_tune.records.table import write_trials
from vitplast_tune.space.files import load_space
from vitplast_tune.storage import SearchPlace, write_record
from vitplast_tune.timings import Timings


def trial(trial_id, components, lr, best, params):
    return {"trial_id": trial_id, "components": components, "lr": lr, "best_val_acc": best, "val_acc": best,
            "test_acc": best - 0.01, "trainable_params": params, "step": 100, "max_steps": 100, "diverged": False,
            "over_budget": False, "error": None}  # fmt: skip


def finished_search(storage) -> Search:
    """A finished search "s" as the driver returns it (timed, its wall time known), its record and table written."""
    trials = pd.DataFrame([trial("t1", "fc1", 0.1, 0.97, 100_000), trial("t2", "head", 0.3, 0.80, 1_000)])
    spec, settings = load_space("component_subsets"), FinetuneConfig()
    place = SearchPlace("s", str(storage), f"sqlite:///{storage / 'mlflow.db'}", "vitplast_tune", "id")
    record = {"name": "s", "space_path": str(spec.path), "fingerprint": spec.fingerprint}
    record |= {"tracking_uri": place.tracking_uri, "parent_run_id": "parent", "settings": settings.to_dict()}
    result = Search(place, record, trials, elapsed_s=90.0, timings=Timings({"trials": 80.0}))
    write_record(place.results_dir, record)
    write_trials(trials, place.results_dir)
    return result


def test_the_search_command_keeps_what_it_prints_and_the_search_reads_it_back(tmp_path, monkeypatch, capsys):
    from vitplast_tune.cli import search as command
    from vitplast_tune.run import driver

    result = finished_search(tmp_path)
    monkeypatch.setattr(driver, "run", lambda options, timings: result)  # the search ran: no Ray here
    monkeypatch.setattr(command, "quiet_library", lambda quiet, verbose=False: None)
    assert command.search_main(["--space", "component_subsets", "--name", "s", "--storage", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    folder = tmp_path / "s"
    assert (folder / SUMMARY_FILE).read_text(encoding="utf-8") == printed  # the very text, its last newline too
    assert [p.name for p in folder.iterdir() if p.name.endswith(".tmp")] == []
    assert "Time: 80.0 s" in printed and "Search s: 2 trials in 1.5 min" in printed

    search = vt.load_search("s", storage=tmp_path)
    assert search.status == "finished" and search.summary() + "\n" == printed
    again = search.summary(k=1)  # not the printed top 10: made again from the records, which hold no timings
    assert again.startswith("Answer: finetune fc1 at lr 0.1") and "Time:" not in again
    forget_summary(folder)  # an analysis done again: the text kept no longer says it
    assert not (folder / SUMMARY_FILE).exists() and "Time:" not in search.summary()  # made again from the records
    assert keep_summary(result) + "\n" == printed and search.summary() + "\n" == printed  # kept again
