"""What a search optimises (``--objective``): accuracy (the space file's metric), accuracy per GPU-hour of the trial's
own training seconds, or the Pareto front of accuracy and training seconds (Optuna's multi-objective TPE)."""

from __future__ import annotations

from dataclasses import replace

from vitplast_tune.errors import UserError, did_you_mean
from vitplast_tune.space.files import SearchSpec
from vitplast_tune.space.samplers import check_sampler

OBJECTIVES = ("accuracy", "accuracy_per_gpu_hour", "pareto")
PER_GPU_HOUR = "val_acc_per_gpu_hour"  # val_acc * 3600 / time_in_steps_s, reported at every evaluation
TRAINING_SECONDS = "time_in_steps_s"  # the trial's seconds in training steps so far (its GPU-seconds)

# What every report of a trial carries that a search can optimise, and the mode in which it is better (the last two:
# second objectives of a Pareto search).
METRICS = {
    "val_acc": "max",
    "best_val_acc": "max",
    "val_loss": "min",
    "train_loss": "min",
    "trainable_params": "min",
    "images_per_s": "max",
    PER_GPU_HOUR: "max",  # --objective accuracy_per_gpu_hour
    TRAINING_SECONDS: "min",  # --objective pareto's cost
}


def with_objective(spec: SearchSpec, objective: str | None) -> SearchSpec:
    """The space with ``objective`` as what the search optimises.

    Args:
        spec: the loaded space.
        objective: one of ``OBJECTIVES``; None or ``accuracy`` keep the space file's metric.

    Returns:
        The space, its metric (and objectives) replaced.

    Raises:
        UserError: an unknown objective, or ``pareto`` with a space that stops trials early (ASHA, median stopping:
            they rank trials by one metric, and Ray's OptunaSearch takes several objectives only without them) or that
            does not sample with Optuna; or a space's metric that trials do not report, or its mode the worse
            direction.
    """
    if objective in (None, "accuracy"):
        _check_metrics(spec)
        return spec
    if objective == "accuracy_per_gpu_hour":
        return replace(spec, metric=PER_GPU_HOUR, mode="max", objectives=((PER_GPU_HOUR, "max"),))
    if objective != "pareto":
        raise UserError(f'--objective "{objective}" is not one of {", ".join(OBJECTIVES)}')
    if spec.scheduler.name != "fifo":
        raise UserError(
            f"--objective pareto needs every trial trained to its budget, but {spec.path.name} stops trials early "
            f"(scheduler {spec.scheduler.name} ranks them by one metric); use a space with scheduler: fifo"
        )
    if spec.algorithm != "optuna":
        raise UserError(
            f"--objective pareto needs algorithm: optuna (its multi-objective TPE), not {spec.algorithm} "
            f"({spec.path.name})"
        )
    check_sampler(spec.sampler, spec.algorithm, spec.parameters, True, f"--objective pareto with {spec.path.name}")
    objectives = (("val_acc", "max"), (TRAINING_SECONDS, "min"))
    return replace(spec, metric="val_acc", mode="max", objectives=objectives)


def _check_metrics(spec: SearchSpec) -> None:
    """Each objective's metric must be one every trial reports, and its mode the direction that is better."""
    for metric, mode in spec.objectives or ((spec.metric, spec.mode),):
        if metric not in METRICS:
            raise UserError(
                f'{spec.path}: metric "{metric}" is not reported by trials{did_you_mean(metric, METRICS)}; '
                f"use one of {', '.join(METRICS)}"
            )
        if mode != METRICS[metric]:
            worst = f'{spec.path}: mode "{mode}" would search for the worst {metric}'
            raise UserError(f"{worst}; use mode: {METRICS[metric]}")


def objective_of(spec: SearchSpec) -> str:
    """The ``--objective`` a space optimises, read from its metrics (``accuracy`` unless it is a cost-aware one)."""
    if spec.metric == PER_GPU_HOUR:
        return "accuracy_per_gpu_hour"
    if spec.multi_objective and (TRAINING_SECONDS, "min") in spec.objectives:
        return "pareto"
    return "accuracy"
