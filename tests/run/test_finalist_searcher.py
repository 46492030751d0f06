"""The stages around TPE as Tune runs them, driven by hand without Ray: the searcher that suggests the baselines'
reference trials first and the finalists after the search's trials (order, waiting, a resume that neither repeats nor
loses one), the schedulers that never stop a reference trial or a finalist nor rank a trial against one, the count of
trials left unfinished, and the progress lines' total."""

from __future__ import annotations

import copy
import io
from dataclasses import dataclass, field

import pytest
from ray.tune.schedulers import ASHAScheduler, TrialScheduler
from ray.tune.search import Searcher

from vitplast_tune.run.finalists import SparingASHA, StagedSearcher, unfinished
from vitplast_tune.run.progress import Progress
from vitplast_tune.space.finalists import Finalists

CONFIGS = [{"components": c, "lr": lr, "train_mha": c == "mha"} for c, lr in (("mha", 0.1), ("fc1", 0.2), ("ln1", 0.3))]
ACCURACY = {"mha": 0.9, "fc1": 0.95, "ln1": 0.5, "all": 0.6, "head": 0.4}
REFERENCES = [
    {"components": c, "lr": 0.05, "reference": {"index": i + 1, "of": 2}} for i, c in enumerate(("all", "head"))
]


class Stub(Searcher):
    """The search's own searcher: the next of ``CONFIGS`` at each suggestion; what it was told, kept."""

    def __init__(self):
        super().__init__(metric="val_acc", mode="max")
        self.given, self.results, self.completed = 0, [], []

    def suggest(self, trial_id):
        self.given += 1
        return dict(CONFIGS[(self.given - 1) % len(CONFIGS)])

    def on_trial_result(self, trial_id, result):
        self.results.append(trial_id)

    def on_trial_complete(self, trial_id, result=None, error=False):
        self.completed.append(trial_id)


def searcher(main: int = 3) -> StagedSearcher:
    return StagedSearcher(Stub(), main, Finalists(top=1, seeds=2), seeds=[1, 2])


def end(s: StagedSearcher, trial_id: str, config: dict) -> None:
    s.on_trial_result(trial_id, {"val_acc": 0.5, "step": 8})
    s.on_trial_complete(trial_id, {"best_val_acc": ACCURACY[config["components"]], "step": 16, "max_steps": 16})


def named(config) -> tuple:
    return (config["components"], config["lr"], config["seed"], config["finalist"]["index"])


FINALISTS = [("fc1", 0.2, 1, 1), ("all", 0.2, 1, 2), ("head", 0.2, 1, 3)]
FINALISTS += [(c, lr, 2, i) for c, lr, _, i in FINALISTS]


def test_the_finalists_come_after_every_trial_of_the_search_has_ended_then_no_more():
    s = searcher()
    main = {f"t{i}": s.suggest(f"t{i}") for i in range(3)}
    assert [c["components"] for c in main.values()] == ["mha", "fc1", "ln1"]
    assert s.suggest("f0") is None  # two trials still running: wait
    end(s, "t0", main["t0"])
    end(s, "t2", main["t2"])
    assert s.suggest("f0") is None
    end(s, "t1", main["t1"])
    finals = [s.suggest(f"f{i}") for i in range(6)]
    assert [named(c) for c in finals] == FINALISTS  # the best (fc1), then full finetuning and the probe at its rate
    assert s.suggest("f6") == Searcher.FINISHED
    for i in range(len(finals)):  # the finalists' reports and ends are Tune's alone: TPE never hears of them
        s.on_trial_result(f"f{i}", {"val_acc": 0.1})
        s.on_trial_complete(f"f{i}", {"best_val_acc": 0.1})
    inner = s.searcher
    assert isinstance(inner, Stub) and inner.given == 3
    assert inner.completed == ["t0", "t2", "t1"] and set(inner.results) == {"t0", "t1", "t2"}


def test_the_reference_trials_come_first_unheard_by_tpe_and_give_the_finalists_their_baselines_rates():
    s = StagedSearcher(Stub(), 3, Finalists(top=1, seeds=1), seeds=[1], references=REFERENCES)
    made = {f"r{i}": s.suggest(f"r{i}") for i in range(2)}
    main = {f"t{i}": s.suggest(f"t{i}") for i in range(3)}
    assert list(made.values()) == REFERENCES and isinstance(s.searcher, Stub) and s.searcher.given == 3
    assert s.suggest("x") is None  # every trial still running
    for trial_id, config in {**made, **main}.items():
        end(s, trial_id, config)
    finals = [s.suggest(f"f{i}") for i in range(3)]
    said = [(c["components"], c["lr"], c["finalist"]["lr_from"], "reference" in c) for c in finals]
    assert said == [("fc1", 0.2, "own", False), ("all", 0.05, "own", False), ("head", 0.05, "own", False)]
    assert s.suggest("f3") == Searcher.FINISHED
    assert s.searcher.completed == ["t0", "t1", "t2"] and set(s.searcher.results) == {"t0", "t1", "t2"}
    alone = StagedSearcher(Stub(), 1, Finalists(), seeds=[], references=REFERENCES)  # no finalists stage
    assert [alone.suggest(f"a{i}")["components"] for i in range(3)] == ["all", "head", "mha"]
    assert alone.suggest("a3") is None
    for i, c in enumerate(("all", "head", "mha")):
        end(alone, f"a{i}", {"components": c})
    assert alone.suggest("a3") == Searcher.FINISHED


def restored(state: dict, main: int = 3) -> StagedSearcher:
    """A new searcher (as Tune unpickles the Tuner's) given the state Tune saved (``get_state``)."""
    fresh = searcher(main)
    fresh.set_state(copy.deepcopy(state))
    return fresh


def test_a_resume_neither_repeats_nor_loses_a_finalist():
    s = searcher()
    main = {f"t{i}": s.suggest(f"t{i}") for i in range(3)}
    for trial_id, config in main.items():
        end(s, trial_id, config)
    given = [named(s.suggest("f0")), named(s.suggest("f1"))]
    saved = s.get_state()  # Tune saves its experiment: two finalists made
    assert "searcher" not in saved  # the base searcher's state is saved apart by Tune
    lost = named(s.suggest("f2"))  # made after the save: the killed driver's Tune state never holds it
    again = restored(saved)
    rest = []
    while (config := again.suggest(f"g{len(rest)}")) != Searcher.FINISHED:
        rest.append(named(config))
    assert given + rest == FINALISTS and rest[0] == lost  # the lost one once more, none of the two again


def test_a_resume_before_the_search_ended_chooses_from_all_its_trials():
    s = searcher()
    main = {f"t{i}": s.suggest(f"t{i}") for i in range(3)}
    end(s, "t0", main["t0"])
    again = restored(s.get_state())  # t1 and t2 were running: Tune runs them again, and they end now
    assert again.suggest("x") is None
    end(again, "t1", main["t1"])
    end(again, "t2", main["t2"])
    assert [named(again.suggest(f"f{i}")) for i in range(6)] == FINALISTS
    assert again.suggest("f6") == Searcher.FINISHED


@dataclass(eq=False)
class FakeTrial:
    trial_id: str
    config: dict = field(default_factory=dict)


FINALIST = {"finalist": {"index": 1, "of": 2, "lr_from": "own"}, "seed": 1}


def asha(kind=SparingASHA):
    return kind(time_attr="step", metric="val_acc", mode="max", max_t=100, grace_period=10, reduction_factor=2)


def test_the_schedulers_never_stop_a_reference_trial_or_a_finalist_nor_rank_a_trial_against_one():
    a, b = FakeTrial("a"), FakeTrial("b")
    f1, f3 = (FakeTrial(f"f{i}", FINALIST) for i in (1, 3))
    f2 = FakeTrial("f2", REFERENCES[0])  # a baseline's reference trial
    reports = ((a, 0.5), (f1, 0.99), (f2, 0.2), (b, 0.8), (f3, 0.01))  # all at ASHA's first rung, step 10
    actions = {}
    for kind in (SparingASHA, ASHAScheduler):
        scheduler = asha(kind)
        for trial, _ in reports:
            scheduler.on_trial_add(None, trial)
        actions[kind] = [scheduler.on_trial_result(None, t, {"step": 10, "val_acc": v}) for t, v in reports]
        for trial, _ in reports:  # a finalist's end leaves the rungs alone
            scheduler.on_trial_complete(None, trial, {"step": 100, "val_acc": 0.5})
    go, stop = TrialScheduler.CONTINUE, TrialScheduler.STOP
    assert actions[ASHAScheduler] == [go, go, stop, go, stop]  # f2 below a and f1, f3 below everyone
    assert actions[SparingASHA] == [go] * 5  # b ranked against a alone; no reference trial nor finalist stopped
    with pytest.raises(KeyError):
        asha(ASHAScheduler).on_trial_remove(None, FakeTrial("never added"))
    asha().on_trial_remove(None, FakeTrial("f4", FINALIST))  # never added, never removed


@dataclass
class Saved:
    status: str
    config: dict
    last_result: dict | None = None


def test_unfinished_counts_the_finalists_once_the_search_has_ended():
    stage = Finalists(top=1, seeds=2)
    done = [Saved("TERMINATED", c, {"best_val_acc": ACCURACY[c["components"]]}) for c in CONFIGS]
    assert unfinished(done, 3, Finalists()) == 0
    assert unfinished(done[:2], 3, stage) == 1 + stage.trials  # a trial of the search left: the stage not begun
    assert unfinished(done, 3, stage) == 6  # ended: its 3 configurations x 2 seeds, none made yet
    marked = [Saved("TERMINATED", {**c, "finalist": {"index": 1, "of": 6}}) for c in CONFIGS[:2]]
    assert unfinished(done + marked + [Saved("RUNNING", {"finalist": {"index": 2, "of": 6}})], 3, stage) == 4
    failed = [Saved("ERROR", c, {"best_val_acc": 0.9}) for c in CONFIGS]
    assert unfinished(failed, 3, stage) == 0  # no trial of the search trained: no finalist to run


def test_the_progress_total_counts_the_finalists_as_the_first_one_says():
    out = io.StringIO()
    progress = Progress(total=3, stream=out, bar=False, finalists=12)
    assert progress.total == 15
    progress.on_trial_start(0, [], FakeTrial("f", {"components": "mha", "lr": 0.1, **FINALIST}))
    assert progress.total == 3 + 2
