"""Progress of a running search on the console: a line per finished trial and a heartbeat, instead of
Tune's large tables."""

from __future__ import annotations

import time

from ray.tune import Callback

from vitplast_tune.search.results import pct, trial_label


class Progress(Callback):
    """One line per finished trial and a heartbeat every ``every_s`` seconds."""

    def __init__(self, total: int, every_s: float = 30.0):
        self.total, self.every_s = total, every_s
        self.done, self.best, self.started, self.last = 0, None, time.time(), time.time()

    def setup(self, **info) -> None:
        self.started = self.last = time.time()

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self.done = 1 + sum(t.status in ("TERMINATED", "ERROR") for t in trials if t is not trial)
        r = trial.last_result or {}
        name = trial_label(trial.config)
        if r.get("diverged"):
            return self._print(f"{name}: diverged ({r.get('error', '')})")
        acc = r.get("best_val_acc")
        if acc is not None and (self.best is None or acc > self.best[0]):
            self.best = (acc, name)
        early = " (stopped early)" if r.get("step", 0) < r.get("max_steps", 0) else ""
        self._print(f"{name}: best val_acc {pct(acc)} at step {r.get('best_step')}{early}")

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self.done = 1 + sum(t.status in ("TERMINATED", "ERROR") for t in trials if t is not trial)
        self._print(f"{trial_label(trial.config)}: failed; see its MLflow run")

    def on_step(self, iteration, trials, **info) -> None:
        if time.time() - self.last >= self.every_s:
            running = sum(t.status == "RUNNING" for t in trials)
            self._print(f"{running} running")

    def _print(self, text: str) -> None:
        self.last = time.time()
        best = f" | best so far {pct(self.best[0])} ({self.best[1]})" if self.best else ""
        elapsed = time.strftime("%M:%S", time.gmtime(time.time() - self.started))
        print(f"[{elapsed}] {self.done}/{self.total} trials done | {text}{best}", flush=True)
