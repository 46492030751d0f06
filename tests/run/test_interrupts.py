"""What an interrupted search does: SIGTERM taken as Ctrl-C, its exit code, and the command that resumes it."""

import os
import shlex
import signal
import time

import pytest

from vitplast_tune.config import FinetuneConfig
from vitplast_tune.plan import SearchOptions, SearchPlan, resume_command
from vitplast_tune.plan.search_plan import Running
from vitplast_tune.run import interrupts
from vitplast_tune.run.interrupts import exit_code, handled, on_sigterm_interrupt, restore_ctrl_c
from vitplast_tune.space import load_space


def test_sigterm_raises_keyboard_interrupt_outside_tune_and_exits_143():
    before = signal.getsignal(signal.SIGTERM)
    # Outside Tune, Ctrl-C is Python's own (a Tuner fitted earlier in this test process may have left its handler).
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _sigterm_outside_tune(before)
    finally:
        signal.signal(signal.SIGINT, previous_int)


def _sigterm_outside_tune(before) -> None:
    with handled():
        on_sigterm_interrupt()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs at once; never reached
        assert exit_code() == 143
    assert signal.getsignal(signal.SIGTERM) is before  # restored when the search ends
    with handled():
        assert exit_code() == 130  # a new search starts with no signal received


def test_sigterm_calls_tunes_graceful_stop_while_tune_runs():
    seen = []
    with handled():
        signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))  # as Tune's fit installs it
        on_sigterm_interrupt()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        assert seen == [signal.SIGINT]  # the stop Ctrl-C asks for, no exception
        restore_ctrl_c()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_resume_command_names_the_space_and_the_flags_the_record_lacks(tmp_path, tiny_space):
    shipped = load_space("paper_grid")
    options = SearchOptions(
        space="paper_grid", plasticity=False, cpus_per_trial=2, resources_per_trial={"a100": 1}, workers_per_trial=2
    )
    plan = SearchPlan(shipped, Running.of(options), "grid-1", str(tmp_path), "sqlite:///x.db", FinetuneConfig())
    words = shlex.split(resume_command(plan))
    assert words[:8] == ["vitplast", "search", "--space", "paper_grid", "--name", "grid-1", "--storage", str(tmp_path)]
    assert words[-1] == "--resume" and "--no-plasticity" in words
    assert words[words.index("--cpus-per-trial") + 1] == "2" and "--gpus-per-trial" not in words
    assert words[words.index("--resources-per-trial") + 1] == '{"a100": 1}'
    assert words[words.index("--workers-per-trial") + 1] == "2"  # a data-parallel trial resumes on as many workers

    tiny_space()  # tmp_path/space.yaml; the test runs in tmp_path (conftest), so the relative name finds it
    own = load_space("space.yaml")
    options = SearchOptions(space="space.yaml", plasticity_variant="in_network", plasticity_pairs=64)
    words = shlex.split(
        resume_command(SearchPlan(own, Running.of(options), "s", "/r", "sqlite:///x.db", FinetuneConfig()))
    )
    assert words[3] == str(tmp_path / "space.yaml")  # absolute: it resumes from any folder
    assert words[words.index("--plasticity-variant") + 1] == "in_network" and "--no-plasticity" not in words
    assert words[words.index("--plasticity-pairs") + 1] == "64" and "--plasticity-reference" not in words


class SigtermReachedTheCaller(Exception):
    """Raised by the test's own SIGTERM handler: the signal was not held back."""


def _raise_on_sigterm(signum, frame):
    raise SigtermReachedTheCaller


def test_sigterm_while_the_results_are_recorded_waits_for_them_and_is_said(library_log):
    said = library_log
    before = signal.signal(signal.SIGTERM, _raise_on_sigterm)  # a caller's handler: what SIGTERM would do after
    try:
        with interrupts.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)
            reached = True  # the block went on
        assert reached and len(said) == 1 and "recorded them first" in said[0]
        assert signal.getsignal(signal.SIGTERM) is _raise_on_sigterm  # the caller's handler is back
        with interrupts.deferred():
            pass
        assert len(said) == 1  # nothing said without a signal
    finally:
        signal.signal(signal.SIGTERM, before)


@pytest.mark.slow
def test_a_search_sent_sigterm_after_its_trials_records_its_results_and_is_complete(ray_local, tmp_path, monkeypatch):
    """SIGTERM once the trials have ended (a batch scheduler's signal before the time limit, landing late): the trial
    table, the analysis and the parent run are written whole, and the search returns as complete."""
    from vitplast_tune.run import driver

    finish = driver._finish

    def signalled_finish(*args):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        return finish(*args)

    monkeypatch.setattr(driver, "_finish", signalled_finish)
    before = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    try:
        options = SearchOptions(
            space="component_subsets",
            name="late",
            storage=str(tmp_path / "results"),
            num_samples=2,
            settings={"max_steps": 8, "eval_every": 4},
            plasticity=False,
            verbose=0,
        )
        result = driver.run(options)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert len(result.trials) == 2 and (tmp_path / "results" / "late" / "trials.csv").is_file()
    from mlflow.tracking import MlflowClient

    assert MlflowClient(result.place.tracking_uri).get_run(result.parent_run_id).info.status == "FINISHED"


def test_the_resume_of_a_search_with_trials_that_never_ran_warns_of_none(tmp_path, ray_local):
    """A stopped search's trials that never ran are what its resume runs: Tune's restore warns that it failed to
    fetch their metrics, the search's restore does not."""
    import logging

    from ray import tune
    from ray.tune.stopper import Stopper

    from vitplast_tune._compat import ray_tune
    from vitplast_tune.run import tuner

    def reports(config):  # defined here: Ray's workers cannot import a test module
        tune.report({"a": float(config["x"])})

    class FirstResult(Stopper):  # the whole search stops at its first result, the second trial still pending
        def __call__(self, trial_id, result):
            return False

        def stop_all(self):
            return True

    run_config = tune.RunConfig(name="e", storage_path=str(tmp_path), stop=FirstResult(), verbose=0)
    tune.Tuner(reports, param_space={"x": tune.grid_search([0, 1])}, run_config=run_config).fit()
    seen, handler = [], logging.Handler()
    handler.emit = seen.append
    logger = logging.getLogger(ray_tune.EXPERIMENT_ANALYSIS_LOGGER)
    logger.addHandler(handler)
    try:
        tune.Tuner.restore(str(tmp_path / "e"), trainable=reports)
        tunes = [r.getMessage() for r in seen]
        seen.clear()
        restored = tuner.restore(str(tmp_path / "e"), reports)
    finally:
        logger.removeHandler(handler)
    assert len(tunes) == 1 and tunes[0].startswith("Failed to fetch metrics for "), tunes
    assert seen == [] and logger.getEffectiveLevel() <= logging.WARNING  # and the level as it was
    assert isinstance(restored, tune.Tuner)


@pytest.mark.parametrize("phase", ["checking the plan", "starting Ray"])
def test_a_signal_during_start_up_ends_with_the_line_and_code_of_a_later_one(
    phase, tiny_space, tmp_path, monkeypatch, capsys
):
    """SIGTERM while the plan is checked or while Ray starts (``ray.init`` has just put in its own
    handler, which exits with status 15 and no word): the line of an interrupt before anything is recorded, exit 143;
    no Ray instance, the caller's handlers back."""
    import ray
    from _commands import ray_sessions, search_args

    from vitplast_tune import cli
    from vitplast_tune.plan import inputs, resources

    def signalled(real):
        def call(*args, **kwargs):
            result = real(*args, **kwargs) if phase == "starting Ray" else None
            os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before the next line
            return result if phase == "starting Ray" else real(*args, **kwargs)

        return call

    if phase == "checking the plan":
        monkeypatch.setattr(inputs, "check_inputs", signalled(inputs.check_inputs))
    else:  # ray.init, right after it put in its SIGTERM handler, before it starts anything
        monkeypatch.setattr(
            ray._private.utils, "set_sigterm_handler", signalled(ray._private.utils.set_sigterm_handler)
        )
        monkeypatch.setattr(ray, "is_initialized", lambda: False)  # this process's Ray (ray_local) is left alone
        monkeypatch.setattr(ray, "shutdown", lambda *args, **kwargs: None)
    monkeypatch.setattr(resources, "ray_running_here", lambda: False)  # as a fresh command-line process
    before = signal.signal(signal.SIGTERM, _raise_on_sigterm)  # a caller's handler: what SIGTERM did unhandled
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(SystemExit) as exited:
            cli.COMMANDS["search"](search_args(tiny_space(), "s", tmp_path / "results"))
        assert {s: signal.getsignal(s) for s in handlers} == handlers  # the caller's handlers back
    finally:
        signal.signal(signal.SIGTERM, before)
    err = capsys.readouterr().err.strip()
    assert exited.value.code == 143 and "Traceback" not in err, err
    assert err.splitlines()[-1] == (
        "interrupted: stopped before its trials ended, before anything was recorded: nothing to resume; run the same "
        "command again"
    )
    assert ray_sessions() == set()


def test_ctrl_c_while_a_resume_checks_its_plan_says_the_same_command_continues_it():
    from vitplast_tune.errors import SearchInterrupted

    with pytest.raises(SearchInterrupted) as stopped, interrupts.before_start(resuming=True):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the handler runs at once; never reached
    assert stopped.value.exit_code == 130
    assert (
        str(stopped.value)
        == "stopped before its trials ended; nothing is lost: continue the search with the same command"
    )


def test_sigterm_while_a_labs_ray_starts_ends_as_a_later_one(monkeypatch):
    """The lab starts one Ray for its stages: SIGTERM just after ``ray.init`` put in its handler (which exits 15
    without a word) ends in SearchInterrupted with 143, which the lab command says in one line."""
    import ray

    from vitplast_tune.errors import SearchInterrupted
    from vitplast_tune.workflows import lab

    real = ray._private.utils.set_sigterm_handler

    def signalled(handler):
        real(handler)
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before the next line

    monkeypatch.setattr(ray._private.utils, "set_sigterm_handler", signalled)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # this process's Ray (ray_local) is left alone
    monkeypatch.setattr(ray, "shutdown", lambda *args, **kwargs: None)
    before = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    try:
        with pytest.raises(SearchInterrupted) as stopped, lab.ray_session():
            pass
        assert signal.getsignal(signal.SIGTERM) is _raise_on_sigterm
    finally:
        signal.signal(signal.SIGTERM, before)
    assert stopped.value.exit_code == 143
