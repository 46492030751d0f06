"""Print a running search's progress: one line per finished trial, under a tqdm bar where the output is live."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from ray.tune import Callback

from vitplast_tune.records.table import pct, trial_label
from vitplast_tune.space.baselines import BASELINE, stage_of
from vitplast_tune.space.finalists import finalist_of

if TYPE_CHECKING:
    from ray.tune.experiment import Trial

ENDED = ("TERMINATED", "ERROR")


def clock(seconds: float) -> str:
    """Write a duration as ``MM:SS``, or ``H:MM:SS`` from one hour on."""
    whole = max(int(seconds), 0)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def eta_s(remaining: int, durations: Sequence[float], running_for: Sequence[float], concurrency: int) -> float | None:
    """Estimate the seconds until the last of ``remaining`` trials ends; None before any trial finished."""
    if not durations:
        return None
    mean = sum(durations) / len(durations)
    work = remaining * mean - sum(min(elapsed, mean) for elapsed in running_for)
    return max(work, 0.0) / max(min(concurrency, remaining), 1)


def _interactive(stream: TextIO) -> bool:
    """Tell whether ``stream`` shows a live bar: a terminal, or a Jupyter kernel's output."""
    if getattr(stream, "isatty", lambda: False)():
        return True
    if "IPython" not in sys.modules:
        return False
    shell = sys.modules["IPython"].get_ipython()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def _bar_shape(stream: TextIO) -> dict[str, Any]:
    """Size tqdm's bar to the terminal, or to 80 x 24 where the terminal reports no size."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):  # no terminal (a notebook's stream): tqdm's own sizing
        return {"dynamic_ncols": True}
    return {"ncols": 80, "nrows": 24} if 0 in size else {"dynamic_ncols": True}


class Progress(Callback):
    """Print one line per finished trial, under a tqdm bar or with a heartbeat line.

    Args:
        total: How many trials the search runs before its finalists.
        every_s: Seconds between heartbeat lines when there is no bar.
        stream: Where the lines go (None: stderr).
        clock: What gives the time.
        bar: Whether to show a tqdm bar (None: when ``stream`` is interactive).
        finalists: The most trials its finalists stage runs.
    """

    def __init__(
        self,
        total: int,
        every_s: float = 30.0,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        bar: bool | None = None,
        finalists: int = 0,
    ):
        self.main, self.total, self.every_s, self.clock = total, total + finalists, every_s, clock
        self.stream = stream or sys.stderr  # progress, as the library's messages: results go to stdout
        self.done, self.best, self.started, self.last, self.drawn = 0, None, clock(), clock(), clock()
        self.began: dict[str, float] = {}  # trial id -> when it started (or was restored) in this run: the running
        self.ended: set[str] | None = None  # the trials that ended, counted from Tune's list once, then kept
        self.durations: list[float] = []
        self.peak = 0  # most trials seen running at once: the search's concurrency
        self.use_bar = _interactive(self.stream) if bar is None else bar
        self.bar = None

    def setup(self, **info: Any) -> None:
        """Start the clock, and the bar when there is one."""
        self.started = self.last = self.drawn = self.clock()
        if self.use_bar:
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=self.total,
                desc="trials",
                file=self.stream,
                bar_format="{desc} {n_fmt}/{total_fmt} |{bar}| {elapsed} elapsed{postfix}",
                **_bar_shape(self.stream),
            )

    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        """Note when a trial starts; a finalist's says how many finalists there are."""
        self.began[trial.trial_id] = self.clock()
        if (mark := finalist_of(trial.config or {})) is not None and self.total != self.main + int(mark["of"]):
            self.total = self.main + int(mark["of"])
            if self.bar is not None:
                self.bar.total = self.total
        self.peak = max(self.peak, len(self.began), 1)

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        """Print a finished trial's line: its best validation accuracy, or that it diverged."""
        self._ended(trials, trial)
        r = trial.last_result or {}
        name = trial_label(trial.config)
        if (mark := finalist_of(trial.config or {})) is not None:
            name += f" seed={trial.config.get('seed')} (finalist {mark['index']})"
        elif stage_of(trial.config or {}) == BASELINE:
            name += " (baseline)"
        if r.get("diverged"):
            return self._print(f"{name}: diverged ({r.get('error', '')})", trials)
        acc = r.get("best_val_acc")
        if acc is not None and (self.best is None or acc > self.best[0]):
            self.best = (acc, name)
        early = " (stopped early)" if r.get("step", 0) < r.get("max_steps", 0) else ""
        self._print(f"{name}: best val_acc {pct(acc)} at step {r.get('best_step')}{early}", trials)

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        """Print a crashed trial's line."""
        self._ended(trials, trial)
        self._print(f"{trial_label(trial.config)}: failed; see its MLflow run", trials)

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        """Move the bar, or print a heartbeat line when ``every_s`` seconds passed without a line."""
        now = self.clock()  # Tune steps many times a second: the bar is drawn at most once a second
        if self.bar is not None and now - self.drawn >= 1.0:
            self.drawn = now
            self.bar.set_postfix_str(self._status(trials), refresh=False)
            self.bar.refresh()  # elapsed time and ETA move between trials
        elif self.bar is None and now - self.last >= self.every_s:
            self._print(f"{len(self.began)} running", trials)

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        """Close the bar."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def eta(self, trials: Sequence[Trial]) -> float | None:
        """Estimate the seconds until the search ends from this run's finished and running trials.

        Args:
            trials: Every trial of the search.

        Returns:
            The seconds, or None before any trial finished.
        """
        now = self.clock()
        running = [now - began for began in self.began.values()]
        return eta_s(self.total - self.done, self.durations, running, self.peak)

    def _ended(self, trials, trial) -> None:
        if self.ended is None:  # once: the trials an earlier driver saw end (a resumed search)
            self.ended = {t.trial_id for t in trials if t.status in ENDED and t is not trial}
        self.ended.add(trial.trial_id)
        self.done = len(self.ended)
        if trial.trial_id in self.began:
            self.durations.append(self.clock() - self.began.pop(trial.trial_id))

    def _status(self, trials) -> str:
        """Return the bar's postfix: the best so far and the ETA."""
        best = f"best {pct(self.best[0])} ({self.best[1]})" if self.best else ""
        eta = self.eta(trials) if self.done < self.total else None
        return " | ".join(p for p in (best, f"ETA {clock(eta)}" if eta is not None else "") if p)

    def _print(self, text: str, trials=()) -> None:
        self.last = self.clock()
        best = f" | best so far {pct(self.best[0])} ({self.best[1]})" if self.best else ""
        eta = self.eta(trials)
        left = f" | ETA {clock(eta)}" if eta is not None and self.done < self.total else ""
        line = f"[{clock(self.last - self.started)}] {self.done}/{self.total} trials done | {text}{best}{left}"
        if self.bar is None:
            print(line, file=self.stream, flush=True)
            return
        self.bar.update(self.done - self.bar.n)
        self.bar.set_postfix_str(self._status(trials), refresh=False)
        self.bar.write(line, file=self.stream)
