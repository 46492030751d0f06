"""Progress lines and the bar, driven by Ray Tune's callback hooks with fake trials and a fake clock (past one hour)."""

import io
import os
from types import SimpleNamespace

import pytest

from vitplast_tune.run import Progress
from vitplast_tune.run.progress import clock, eta_s


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def trial(trial_id: str, status: str = "RUNNING", **result) -> SimpleNamespace:
    config = {"components": "mha+fc1", "lr": 0.05}
    return SimpleNamespace(trial_id=trial_id, status=status, config=config, last_result=result)


def test_the_clock_reads_hours_past_one_hour():
    assert clock(0) == "00:00"
    assert clock(59.9) == "00:59"
    assert clock(25 * 60 + 3) == "25:03"
    assert clock(3599) == "59:59"
    assert clock(3600) == "1:00:00"
    assert clock(3912) == "1:05:12"  # printed 05:12 before
    assert clock(26 * 3600 + 61) == "26:01:01"


def test_eta_shares_the_remaining_work_among_the_trials_running_at_once():
    assert eta_s(5, [], [], 2) is None  # nothing finished: no basis yet
    assert eta_s(4, [100.0, 300.0], [], 2) == pytest.approx(4 * 200 / 2)
    assert eta_s(4, [200.0], [150.0, 50.0], 2) == pytest.approx((4 * 200 - 200) / 2)  # running trials' time deducted
    assert eta_s(1, [200.0], [500.0], 4) == 0.0  # a trial running longer than the mean: no negative time
    assert eta_s(1, [200.0], [], 4) == pytest.approx(200.0)  # the last trial runs alone


def test_lines_past_one_hour_with_best_and_eta():
    fake, out = FakeClock(), io.StringIO()
    progress = Progress(total=4, stream=out, clock=fake)
    progress.setup()
    assert progress.bar is None  # a StringIO is no terminal: lines only
    a, b = trial("a"), trial("b")
    progress.on_trial_start(0, [a, b], a)
    progress.on_trial_start(0, [a, b], b)
    fake.now += 3912
    a.status, a.last_result = "TERMINATED", {"best_val_acc": 0.9, "best_step": 40, "step": 40, "max_steps": 40}
    progress.on_trial_complete(1, [a, b], a)
    line = out.getvalue().strip()
    # 3 trials left at 3,912 s each, b already 3,912 s in: (3 x 3912 - 3912) / 2 at once = 3,912 s.
    assert (
        line
        == "[1:05:12] 1/4 trials done | mha+fc1 lr=0.05: best val_acc 90.00% at step 40 | best so far 90.00% (mha+fc1 lr=0.05) | ETA 1:05:12"
    )
    fake.now += 31
    progress.on_step_end(2, [a, b])  # the heartbeat, every 30 s without a bar
    assert out.getvalue().splitlines()[-1].startswith("[1:05:43] 1/4 trials done | 1 running | best so far 90.00%")


def test_early_stopped_diverged_and_failed_trials_are_said():
    fake, out = FakeClock(), io.StringIO()
    progress = Progress(total=3, stream=out, clock=fake, bar=False)
    progress.setup()
    trials = [trial(i) for i in "abc"]
    for t in trials:
        progress.on_trial_start(0, trials, t)
    fake.now += 10
    trials[0].status, trials[0].last_result = "TERMINATED", {"best_val_acc": 0.5, "step": 10, "max_steps": 40}
    progress.on_trial_complete(1, trials, trials[0])
    trials[1].status, trials[1].last_result = "TERMINATED", {"diverged": 1, "error": "loss became nan"}
    progress.on_trial_complete(1, trials, trials[1])
    trials[2].status = "ERROR"
    progress.on_trial_error(1, trials, trials[2])
    lines = out.getvalue().splitlines()
    assert "(stopped early)" in lines[0] and "diverged (loss became nan)" in lines[1]
    assert lines[2].startswith("[00:10] 3/3 trials done | mha+fc1 lr=0.05: failed") and "ETA" not in lines[2]


def test_a_bar_on_a_terminal_keeps_the_lines_above_it():
    fake, out = FakeClock(), io.StringIO()
    progress = Progress(total=2, stream=out, clock=fake, bar=True)
    progress.setup()
    a = trial("a")
    progress.on_trial_start(0, [a], a)
    fake.now += 4000
    a.status, a.last_result = "TERMINATED", {"best_val_acc": 0.75, "step": 8, "max_steps": 8}
    progress.on_trial_complete(1, [a], a)
    progress.on_step_end(2, [a])
    assert progress.bar.n == 1 and "ETA 1:06:40" in progress.bar.postfix
    b = trial("b")
    progress.on_trial_start(2, [a, b], b)
    fake.now += 10
    b.status, b.last_result = "TERMINATED", {"best_val_acc": 0.5, "step": 8, "max_steps": 8}
    progress.on_trial_complete(3, [a, b], b)
    assert progress.bar.n == 2 and "ETA" not in progress.bar.postfix  # done: no ETA left on the bar
    progress.on_experiment_end([a, b])
    text = out.getvalue()
    assert "[1:06:40] 1/2 trials done | mha+fc1 lr=0.05: best val_acc 75.00%" in text
    assert "trials 2/2 |" in text and progress.bar is None  # the bar was drawn, then closed


@pytest.mark.parametrize("columns", [0, 100])
def test_a_bar_shows_on_a_pseudo_terminal_sized_or_not(columns):
    """On a pseudo-terminal nobody sized (``script``, a harness: 0 x 0), the bar's class said use_bar True and tqdm
    drew nothing, taking its 0 rows for -1 and the bar for below the screen (issue 57): only the lines showed."""
    import fcntl
    import struct
    import termios

    master, follower = os.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40 if columns else 0, columns, 0, 0))
    fake = FakeClock()
    with os.fdopen(follower, "w", buffering=1) as terminal:
        progress = Progress(total=3, stream=terminal, clock=fake)
        assert progress.use_bar
        progress.setup()
        a = trial("a")
        progress.on_trial_start(0, [a], a)
        fake.now += 5
        a.status, a.last_result = "TERMINATED", {"best_val_acc": 0.5, "best_step": 8, "step": 8, "max_steps": 8}
        progress.on_trial_complete(1, [a], a)
        progress.on_experiment_end([a])
    os.set_blocking(master, False)
    shown = b""
    while chunk := _read(master):
        shown += chunk
    os.close(master)
    shown = shown.decode()
    assert "[00:05] 1/3 trials done | mha+fc1 lr=0.05: best val_acc 50.00%" in shown
    assert "\rtrials 1/3 |" in shown and "best 50.00% (mha+fc1 lr=0.05) | ETA 00:10" in shown  # the bar, drawn


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 1 << 16)
    except (BlockingIOError, OSError):  # nothing more written; OSError (EIO): the other end closed
        return b""


def test_every_hook_of_the_search_s_callbacks_is_one_tune_calls():
    """A callback's ``on_*`` method Tune does not know is never called (the heartbeat once sat in ``on_step``, which
    Tune has not, so no heartbeat line was ever printed and the bar's clock stood still between trials)."""
    import importlib

    from ray.tune import Callback

    for module in ("records.trial_runs", "run.progress", "run.guard", "run.live_study", "run.parallel"):
        importlib.import_module(f"vitplast_tune.{module}")
    ours = [c for c in _subclasses(Callback) if c.__module__.startswith("vitplast_tune.")]
    assert {c.__name__ for c in ours} >= {"Progress", "MlflowTracker", "ReleaseOrphans"}
    hooks = {name for name in vars(Callback) if name.startswith("on_")}
    unknown = [f"{c.__name__}.{name}" for c in ours for name in vars(c) if name.startswith("on_") and name not in hooks]
    assert unknown == []


def _subclasses(cls: type) -> list[type]:
    return [s for sub in cls.__subclasses__() for s in (sub, *_subclasses(sub))]
