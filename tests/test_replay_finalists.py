"""The finalists stage replayed (benchmarks.replay_finalists): reference trials first and never stopped, the stage's
configurations, seeds and cost, the one-SE answer, the ceiling, and the page from a few cached replays."""

import json

import pytest

from benchmarks import replay_finalists, replay_tables, search_replay
from benchmarks.replay_tables import Run, Table

KEPT = replay_tables.DATA / "lab-v2" / "checks" / "lab.s0.digits_c-contrast"  # 26 configurations, 5 seeds each


def test_the_reference_trials_come_first_and_train_to_the_end_under_asha():
    table = replay_tables.load_table(KEPT)
    refs = replay_finalists.references(table, 3)
    assert refs == (("all", 0.03), ("head", 0.1), ("all", 0.3), ("head", 1.0), ("all", 1.0), ("head", 3.0))
    out = search_replay.replay(table, "TPE + ASHA", 0, 0.005, 1e9, len(refs) + 8, 1, refs)
    ended = out["ended"]
    assert len(ended) == 14 and [tuple(e[:2]) for e in ended[:6]] == list(refs)
    for subset, lr, _, seed, cost in ended[:6]:  # the whole budget: the scheduler spared them
        run = next(r for r in table.runs[(subset, lr)] if r.seed == seed)
        assert cost == pytest.approx(run.seconds, abs=1e-3)


def _table() -> Table:
    """b and c and the baselines on seeds 0-3: b the best by mean, c within one SE of it on its new seeds."""
    vals = {("b", 0.1): [0.95, 0.96, 0.97, 0.96], ("c", 0.1): [0.90, 0.955, 0.956, 0.954]}
    vals |= {("all", 0.1): [0.80] * 4, ("head", 0.1): [0.50] * 4, ("head", 1.0): [0.60] * 4}
    runs = {
        key: [Run(seed, ((10, v),), v - 0.01, 1.0 if key[0] != "all" else 3.0) for seed, v in enumerate(values)]
        for key, values in vals.items()
    }
    return Table("synthetic", replay_tables.DATA, runs, final_only=False)


def test_the_stage_trains_the_best_and_both_baselines_on_new_seeds_and_answers_by_one_se():
    table, params = _table(), {"b": 300.0, "c": 100.0, "all": 1000.0, "head": 1.0}
    ended = [["all", 0.1, 0.80, 0, 30.0], ["head", 1.0, 0.60, 0, 10.0], ["b", 0.1, 0.97, 2, 10.0]]
    ended += [["c", 0.1, 0.90, 0, 10.0]]
    no_stage = replay_finalists.finalists(table, ended, 0, 0, 0, params)
    assert no_stage == (("b", 0.1), ("b", 0.1), 0.0)  # the best trial
    key, best_mean, spent = replay_finalists.finalists(table, ended, 2, 3, 0, params)
    # on seeds the search did not draw, b has the best mean (95.67%, SE 0.33 points) and c (95.50%) is within one SE
    # of it with a third of its parameters: the answer
    assert key == ("c", 0.1) and best_mean == ("b", 0.1)
    assert spent == pytest.approx(3 * (10 + 10 + 30 + 10))  # b, c, full finetuning and the probe at its own rate
    one = replay_finalists.finalists(table, ended, 1, 3, 0, params)
    assert one[0] == ("b", 0.1) and one[2] == pytest.approx(3 * (10 + 30 + 10))
    assert replay_finalists.ceiling(table) == pytest.approx(0.0)  # b by mean validation is b by mean test


def test_the_page_and_the_figures_come_from_a_few_cached_replays(tmp_path, capsys):
    page, out = tmp_path / "page.md", tmp_path / "f.json"
    argv = ["--tables", str(KEPT), "--seeds", "2", "--trials", "4", "--tops", "0,1", "--finalist-seeds", "2"]
    argv += ["--cache", str(tmp_path / "cache"), "--page", str(page), "--json", str(out)]
    assert replay_finalists.main(argv) == 0
    assert replay_finalists.main(argv) == 0  # again, from the cache
    assert len(list((tmp_path / "cache").rglob("*.json"))) == 2
    text = page.read_text()
    assert text.startswith("# Search replay with the finalists stage (") and "| 4 | 1 | 2 |" in text
    assert "| ceiling: the whole grid on every seed, by mean validation |" in text and "The goal is" in text
    figures = json.loads(out.read_text())
    assert [(r["trials"], r["top"], r["seeds"], r["replays"]) for r in figures["rows"]] == [(4, 0, 0, 2), (4, 1, 2, 2)]
    staged = figures["rows"][1]
    assert staged["cost"][0] > figures["rows"][0]["cost"][0]  # the stage's runs are charged
    assert figures["choice"]["best"]["trials"] == 4 and "The default, chosen by the one-standard-error rule" in text


def test_the_default_is_the_cheapest_setting_within_one_standard_error_of_the_best_share():
    def row(t, share, cost):
        return {"trials": t, "top": 1, "seeds": 2, "within": {0.005: share, 0.01: share}, "cost": (cost, cost, cost)}

    rows = [row(10, 0.40, 0.2), row(20, 0.50, 0.3), row(30, 0.52, 0.35), row(60, 0.9, 0.9)]
    rows = [{**r, "replays": 100} for r in rows]
    picked = replay_finalists.choose(rows, {0.005: 0.75, 0.01: 0.8})  # the goal: 0.675 at 0.4; none meets it
    assert not picked["met"] and picked["best"]["trials"] == 30  # the best share at no more than 0.4
    assert picked["trials"] == 20 and picked["se"] == pytest.approx((0.52 * 0.48 / 100) ** 0.5)  # 0.50 >= 0.52 - 0.05
    met = replay_finalists.choose(rows, {0.005: 0.5, 0.01: 0.5})  # the goal: 0.45 at 0.4
    assert met["met"] and met["trials"] == 20


def test_the_agreement_of_answers_compares_each_chosen_subset_with_the_others_one_se_sets():
    from benchmarks import answer_agreement
    from vitplast_tune.records.finalists import Configuration, FinalAnswer

    def config(components, lr, depth="all"):
        return Configuration(1, {"components": components, "lr": lr, "depth": depth}, {1: 0.9}, {1: 0.9})

    def answer(chosen, *tied):
        return FinalAnswer(chosen, chosen, (chosen, *tied), tuple(tied), (), (1,))

    answers = {
        "s0": answer(config("fc1", 0.1), config("mha+fc1", 0.2)),
        "s1": answer(config("mha+fc1", 0.3)),  # another rate: the same subset
        "s2": answer(config("fc1", 0.1, depth="last")),
    }
    found = answer_agreement.agreement(answers)
    assert found["searches"]["s0"]["set"] == ["fc1", "mha+fc1"] and found["searches"]["s2"]["chosen"] == "fc1 @last"
    assert found["pairs"] == [
        ("s0", "s1", False),
        ("s0", "s2", False),
        ("s1", "s0", True),
        ("s1", "s2", False),
        ("s2", "s0", False),
        ("s2", "s1", False),
    ]
    said = answer_agreement.lines(found)
    assert "1 of 6 ordered pairs agree (A's chosen subset in B's one-SE set):" in said
    assert "| s1 | mha+fc1 (lr 0.3) | mha+fc1 |" in said
    assert "- Components in every chosen subset: fc1." in said  # fc1, mha+fc1 and fc1 @last share fc1
