"""Describe a dry run's plan in words, and estimate its wall time from a few training steps timed on this machine.

The estimate is a range: the most if every trial trains its whole budget, the fewest if the scheduler stops every
trial it can. Baselines and finalists always train their whole budget. ``CAVEATS`` say what it leaves out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from vitplast_tune.components import ALL, parse_subset
from vitplast_tune.config import FinetuneConfig, trial_config
from vitplast_tune.errors import UserError
from vitplast_tune.plan.finalists import finalist_seeds
from vitplast_tune.plan.resources import LOWER, TRIAL_PROCESS_CPU, ray_request, show_resources
from vitplast_tune.plan.search_plan import SearchPlan
from vitplast_tune.space.baselines import references
from vitplast_tune.space.distributions import Choice, Constant, Subsets
from vitplast_tune.space.files import SearchSpec

STEPS, BUDGET_S = 5, 4.0  # timed steps per configuration after a warm-up step, and the most seconds they take
GRID_LINES = 12  # a grid's configurations listed before "... and N more"
CAVEATS = (
    "timed alone: trials side by side share memory bandwidth and caches, and cluster nodes may be faster or slower",
    "not counted: starting Ray, the plasticity and gradient measurements before the trials (a cached plasticity "
    "report is reused), and the analysis at the end",
    "linear-probe trials (head) train on cached features, far faster than the timed configurations",
)


@dataclass
class Timing:
    """Seconds a trial of one configuration takes here: its setup, a step and an evaluation."""

    components: str
    precision: str
    setup_s: float
    step_s: float
    val_eval_s: float
    test_eval_s: float
    steps_timed: int

    def trial_s(self, steps: float, eval_every: int) -> float:
        """Return the seconds of a trial of ``steps`` steps, evaluated every ``eval_every`` and tested at the end."""
        evaluations = math.ceil(steps / eval_every)
        return self.setup_s + steps * self.step_s + evaluations * self.val_eval_s + self.test_eval_s


def timed_configs(plan: SearchPlan) -> list[FinetuneConfig]:
    """Return the default trial's settings and, when it differs, the same with the largest subset."""
    first = trial_config(plan.spec.example(), plan.settings)
    largest = replace(first, components=_largest_subset(plan.spec, plan.settings))
    return [first] if largest == first else [first, largest]


def _largest_subset(spec: SearchSpec, settings: FinetuneConfig) -> str:
    """Return the subset with the most components a trial may train."""
    p = spec.parameters.get("components")
    if isinstance(p, Subsets):
        return ALL
    if isinstance(p, Choice):
        return max(p.values, key=lambda subset: len(parse_subset(subset)))
    return p.value if isinstance(p, Constant) else settings.components


def concurrency(plan: SearchPlan, nodes: list[dict[str, float]], where: str) -> int:
    """Return how many trials run at once; UserError when no node holds one trial."""
    trial = plan.running.resources
    request, workers = ray_request(trial.placement_request), trial.workers
    fit = sum(min(int(node.get(k, 0.0) / v + 1e-9) for k, v in request.items()) for node in nodes) // workers
    if fit == 0:
        have = "; ".join(show_resources(node) for node in nodes) or "no node"
        raise UserError(
            f"a trial asks for {show_resources(request)}, more than {where} has ({have}); {LOWER}, or join a "
            "cluster with --address"
        )
    limit = plan.max_concurrent or fit
    return max(min(fit, limit, plan.spec.total_trials), 1)


def describe_trials(plan: SearchPlan) -> list[str]:
    """Describe the trials: their count, algorithm, scheduler and parameters, and what every trial does."""
    spec, s = plan.spec, plan.settings
    sched = spec.scheduler
    stop = {
        "asha": f"ASHA early stopping (grace period {sched.grace_period} steps, reduction factor {sched.reduction_factor})",
        "median": f"median stopping (grace period {sched.grace_period} steps)",
        "fifo": "no early stopping",
    }[sched.name]
    metric = ", ".join(f"{m} ({d})" for m, d in spec.objectives) or f"{spec.metric} ({spec.mode})"
    lines = [f"space:      {spec.path}" + (f": {spec.description}" if spec.description else "")]
    lines.append(f"trials:     {spec.total_trials}, {spec.algorithm} (seed {plan.seed}), {stop}; metric {metric}")
    if made := references(spec.parameters, spec.baselines):
        rates = ", ".join(dict.fromkeys(f"{c['lr']:g}" for c in made if "lr" in c)) or "the settings' rate"
        lines.append(
            f"baselines:  {len(made)} of them, full finetuning and the linear probe at lr {rates}, never stopped"
        )
    if spec.finalists.on:
        seeds = ", ".join(map(str, finalist_seeds(spec, s.seed)))
        lines.append(f"finalists:  {spec.finalists.describe()} (seeds {seeds})")
    if spec.algorithm == "grid":
        grid = spec.grid
        lines.append(f"grid:       {len(grid)} configurations x {spec.num_samples} repeat(s):")
        lines += [f"            {' '.join(f'{k}={v}' for k, v in c.items())}" for c in grid[:GRID_LINES]]
        if len(grid) > GRID_LINES:
            lines.append(f"            ... and {len(grid) - GRID_LINES} more")
    else:
        lines += [
            f"{'parameters:' if i == 0 else '':<12}{n}: {p.describe()}"
            for i, (n, p) in enumerate(spec.parameters.items())
        ]
    decay = f", layer decay {s.layer_decay}" if s.layer_decay else ""
    steps = " or ".join(map(str, spec.budget_steps)) if spec.budgets else s.max_steps  # each budget sets max_steps
    lines.append(
        f"each trial: {s.model} on {s.dataset}, {steps} steps at batch {s.batch_size}, evaluated every "
        f"{s.eval_every}; {s.optimizer}, weight decay {s.weight_decay:g}{decay}; precision {s.precision}"
    )
    lines.append(
        f"recipe:     grad_accum_steps {s.grad_accum_steps}, mixup {_g(s.mixup)}, cutmix {_g(s.cutmix)}, label "
        f"smoothing {_g(s.label_smoothing)}, EMA {_g(s.ema_decay)}, drop path {_g(s.drop_path)}, LoRA rank "
        f"{s.lora_rank} (where lora)"
    )
    if plan.max_trainable_params:
        lines.append(f"budget:     trials over {plan.max_trainable_params:,} trainable parameters are not trained")
    return lines + [f"note:       {note}" for note in plan.notes]


def _g(value: float | None) -> str:
    """Print a recipe setting, 'off' when it is unset."""
    return "off" if value is None else f"{value:g}"


PLACEMENT_WORDS = {"pack": "as few nodes as hold them", "spread": "over different nodes where it can"}


def describe_resources(plan: SearchPlan, where: str, nodes: list[dict[str, Any]], at_once: int) -> list[str]:
    """Describe the resources per trial, what ``where`` has, and how many trials run at once."""
    o, have = plan.running.resources, "; ".join(show_resources(node) for node in nodes)
    limit = f", --max-concurrent {plan.max_concurrent}" if plan.max_concurrent else ""
    lines = [f"resources:  {show_resources(ray_request(o.request))} per trial; {where}: {have}"]
    if (n := o.workers) > 1:
        share = show_resources(ray_request(o.share))
        lines.append(
            f"workers:    {n} per trial, a Ray Train run of torch DDP ({'NCCL' if o.gpus else 'gloo'}), "
            f"each {share}, placement {o.placement} ({PLACEMENT_WORDS[o.placement]}); the trial's own process "
            f"{{CPU: {TRIAL_PROCESS_CPU:g}}}"
        )
    return [*lines, f"at once:    {at_once} trial(s){limit}"]


def step_budget(spec: SearchSpec, max_steps: int, eval_every: int) -> tuple[float, float]:
    """Return the fewest and most training steps the sampler's trials take together."""
    n, s = spec.total_trials - len(references(spec.parameters, spec.baselines)), spec.scheduler
    most = float(n * max_steps)
    at_report = lambda step: min(math.ceil(step / eval_every) * eval_every, max_steps)  # a trial stops at a report
    if s.name == "median":
        return n / 2 * at_report(s.grace_period) + n / 2 * max_steps, most
    if s.name != "asha":
        return most, most
    fewest, going, rung = 0.0, float(n), s.grace_period
    while rung < max_steps:
        stays = going / s.reduction_factor
        fewest += (going - stays) * at_report(rung)
        going, rung = stays, rung * s.reduction_factor
    return max(fewest + going * max_steps, float(max_steps)), most


def wall_range(plan: SearchPlan, timings: list[Timing], at_once: int) -> tuple[float, float]:
    """Return the fewest and most seconds of the search's trials, then its finalists'."""
    made = len(references(plan.spec.parameters, plan.spec.baselines))  # whole-budget trials, counted with the finalists
    s, n, finals = plan.settings, plan.spec.total_trials - made, plan.spec.finalists.trials + made
    fast, slow = min(timings, key=lambda t: t.step_s), max(timings, key=lambda t: t.step_s)
    fewest_steps, _ = step_budget(plan.spec, s.max_steps, s.eval_every)
    most = math.ceil(n / at_once) * slow.trial_s(s.max_steps, s.eval_every)
    per_step = fast.step_s + fast.val_eval_s / s.eval_every
    fewest = (fewest_steps * per_step + n * (fast.setup_s + fast.test_eval_s)) / at_once
    fewest = max(fewest, fast.trial_s(s.max_steps, s.eval_every))
    # the finalists start once the search's trials have ended, and each trains its whole budget
    most += math.ceil(finals / at_once) * slow.trial_s(s.max_steps, s.eval_every)
    return fewest + finals * fast.trial_s(s.max_steps, s.eval_every) / at_once, most


def describe_estimate(plan: SearchPlan, timings: list[Timing], device: str, at_once: int) -> list[str]:
    """Describe the timed steps, the estimated wall time and its caveats."""
    lines = [f"timed here: {device}, one trial alone, {plan.settings.threads} torch thread(s):"]
    for t in timings:
        lines.append(
            f"            {t.components} ({t.precision}): {t.step_s * 1000:.0f} ms/step (median of {t.steps_timed}), "
            f"setup {t.setup_s:.1f} s, evaluation {t.val_eval_s:.1f} s, test {t.test_eval_s:.1f} s"
        )
    fewest, most = wall_range(plan, timings, at_once)
    if plan.spec.scheduler.name == "fifo" and math.isclose(fewest, most, rel_tol=0.05):
        lines.append(f"estimate:   about {minutes(most)} for the trials ({at_once} at a time)")
    else:
        lines.append(
            f"estimate:   {minutes(fewest)} to {minutes(most)} for the trials ({at_once} at a time): the least if "
            f"{plan.spec.scheduler.name} stops every trial it can and trials take the faster time per step, the most "
            "if every trial trains its whole budget at the slower one"
        )
    caveats = list(CAVEATS)
    if plan.running.resources.gpus > 0 and device == "cpu":
        caveats.insert(0, "trials ask for GPUs but this machine has none: timed on the CPU, far slower than a GPU")
    return lines + [f"{'caveats:' if i == 0 else '':<12}{c}" for i, c in enumerate(caveats)]


def minutes(seconds: float) -> str:
    """Show seconds as a person reads them, with tenths of a minute under 10 minutes."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 600:
        return f"{seconds / 60:.1f} min"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
