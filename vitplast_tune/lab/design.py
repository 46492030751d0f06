"""Read the pre-registered design that the lab's analysis judges, refusing claims and labs it does not name."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from vitplast_tune.errors import UserError

PREREGISTRATION = "preregistration.yaml"
CLAIMS = ("better", "equivalent", "narrower")  # superiority, equivalence within the margin, single components
SCOPES = ("pooled",)
CORRECTIONS = ("holm", "bonferroni")  # the statsmodels methods that the family may name


@dataclass(frozen=True)
class Claim:
    """Name one pre-registered claim about ``predictor`` against the baseline."""

    claim: str
    predictor: str
    scope: str = "pooled"

    @property
    def key(self) -> str:
        return f"{self.claim}:{self.predictor}:{self.scope}"


@dataclass(frozen=True)
class Design:
    """Hold the keys of ``preregistration.yaml`` that the analysis reads.

    Attributes:
        registered: The date it was registered.
        models: The timm name of each short name.
        candidate_tasks: The tasks a lab may be of.
        predictors: Every predictor judged, possibly the baseline too.
        baseline: The predictor every other is compared with.
        family: Every claim that may be said in words.
        alpha: The family-wise error rate.
        margin: The equivalence margin on the Spearman difference.
        correction: The correction over the family.
        resamples: Crossed resamples per lab.
        bootstrap_seed: The resamples' seed.
        seeds_joint: Whether seeds are drawn jointly across subsets.
        test_images_joint: Whether test images are drawn jointly.
        undecided_mc_se: Monte Carlo errors from alpha within which a decision is undecided.
        headline: The headline figure.
        seeds: Seeds per configuration the design asks for.
        tasks_per_model: The labs each model has in the verdict, 0 when the file names no number.
        source: The file it was read from.
        sha256: The SHA-256 of that file's bytes.
        amends_sha256: For an amendment, the SHA-256 of the pre-registration it amends.
    """

    registered: str
    models: dict[str, str]
    candidate_tasks: tuple[str, ...]
    predictors: tuple[str, ...]
    baseline: str
    family: tuple[Claim, ...]
    alpha: float = 0.05
    margin: float = 0.10
    correction: str = "holm"
    resamples: int = 20000
    bootstrap_seed: int = 0
    seeds_joint: bool = True
    test_images_joint: bool = True
    undecided_mc_se: float = 3.0
    headline: str = "random_effects"
    seeds: int = 5
    tasks_per_model: int = 0
    source: str = ""
    sha256: str = ""
    amends_sha256: str = ""

    def ran_under(self, recorded: str | None, name: str) -> None:
        """Check that a lab ran under this file, or under the file this amendment amends.

        Args:
            recorded: The lab's ``preregistration_sha256``, None for a lab that predates it.
            name: The lab's name, for the message.

        Raises:
            UserError: If it ran under another file, or this one was edited after it ran.
        """
        if recorded is None or recorded in (self.sha256, self.amends_sha256):
            return
        raise UserError(
            f"lab {name} ran under the pre-registration of SHA-256 {recorded[:12]}, not {self.source} (SHA-256 "
            f"{self.sha256[:12]}): the design was edited after the lab ran, or is another; pool it under the file it "
            "ran under (--design FILE)"
        )

    def claims(self, kind: str) -> list[Claim]:
        """Return the family's claims of one kind, in the file's order.

        Args:
            kind: "better", "equivalent" or "narrower".

        Returns:
            Those claims.
        """
        return [c for c in self.family if c.claim == kind]

    def check_lab(self, name: str, model: str, task: str) -> None:
        """Refuse a lab whose model or task the design does not name.

        Args:
            name: The lab's name, for the message.
            model: Its model, by short or timm name.
            task: Its task.

        Raises:
            UserError: If the design does not name them.
        """
        if model not in self.models and model not in self.models.values():
            raise UserError(f"lab {name}: its model {model} is not in the pre-registration {self.source}")
        if task not in self.candidate_tasks:
            raise UserError(f"lab {name}: its task {task} is not among the pre-registered tasks ({self.source})")


def _claims(entries, predictors: tuple[str, ...], source: str) -> tuple[Claim, ...]:
    out = []
    for entry in entries or []:
        if not isinstance(entry, dict) or set(entry) - {"claim", "predictor", "scope"}:
            raise UserError(f"{source}: a family entry must be {{claim, predictor, scope}}, got {entry!r}")
        claim, predictor, scope = entry.get("claim"), entry.get("predictor"), entry.get("scope", "pooled")
        if claim not in CLAIMS:
            raise UserError(f"{source}: the analysis has no test for the claim {claim!r} (known: {', '.join(CLAIMS)})")
        if scope not in SCOPES:
            raise UserError(f"{source}: the analysis judges no claim at scope {scope!r} (known: {', '.join(SCOPES)})")
        named = predictors if predictor in ("each", "<each>") else (predictor,)
        for p in named:
            if p not in predictors:
                raise UserError(f"{source}: the family names {p!r}, which is not among its predictors")
            out.append(Claim(claim, p, scope))
    if not out:
        raise UserError(f"{source}: the pre-registration names no family of verdicts")
    return tuple(out)


def _amended(path: Path, amendment: dict[str, Any]) -> dict[str, Any]:
    """Read the pre-registration an amendment amends, check its SHA-256 and add the amendment's tasks."""
    keys = ("amends", "amends_sha256", "candidate_tasks_added")
    if any(k not in amendment for k in keys) or set(amendment) - {*keys, "registered", "reason"}:
        raise UserError(f"{path}: an amendment names {', '.join(keys)} (and its date and reason) only")
    base = path.parent / str(amendment["amends"])
    if not base.is_file():
        raise UserError(f"{path}: the pre-registration it amends, {base}, is not there")
    text = base.read_bytes()
    if hashlib.sha256(text).hexdigest() != amendment["amends_sha256"]:
        raise UserError(f"{path}: {base.name} is not the file it amends (its SHA-256 differs)")
    data = yaml.safe_load(text) or {}
    if "amends" in data:
        raise UserError(f"{path}: it amends {base.name}, itself an amendment")
    added = [str(t) for t in amendment["candidate_tasks_added"] or []]
    return data | {"candidate_tasks": [*data.get("candidate_tasks", []), *added]}


def read_design(path: str | Path) -> Design:
    """Read the design from a pre-registration file, or from an amendment with its tasks added.

    Args:
        path: The YAML file.

    Returns:
        The design.

    Raises:
        UserError: If the file is missing, lacks a key or names what the analysis does not know.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"no pre-registration at {path}")
    data = yaml.safe_load(path.read_text()) or {}
    amends = str(data.get("amends_sha256", "")) if isinstance(data, dict) else ""
    if isinstance(data, dict) and "amends" in data:
        data = _amended(path, data)
    missing = [k for k in ("registered", "models", "predictors", "baseline", "family") if k not in data]
    if missing:
        raise UserError(f"{path}: the pre-registration lacks {', '.join(missing)}")
    predictors = tuple(str(p) for p in data["predictors"])
    resampling = data.get("resampling") or {}
    if resampling.get("seeds", "joint") != "joint":  # analysis.crossed draws one set of seeds for all subsets
        raise UserError(f"{path}: the analysis draws seeds jointly across subsets only (resampling: {{seeds: joint}})")
    correction = str(data.get("correction", "holm"))
    if correction not in CORRECTIONS:
        raise UserError(f"{path}: correction {correction!r} is not one the analysis applies ({', '.join(CORRECTIONS)})")
    if str(data.get("headline", "random_effects")) != "random_effects":  # the pooled headline computes only this
        raise UserError(f"{path}: headline {data['headline']!r} is not one the analysis computes (random_effects)")
    design = Design(
        registered=str(data["registered"]),
        models={str(k): str(v) for k, v in data["models"].items()},
        candidate_tasks=tuple(str(t) for t in data.get("candidate_tasks", [])),
        predictors=predictors,
        baseline=str(data["baseline"]),
        family=_claims(data["family"], predictors, str(path)),
        alpha=float(data.get("alpha", 0.05)),
        margin=float(data.get("margin", 0.10)),
        correction=correction,
        resamples=int(resampling.get("resamples", 20000)),
        bootstrap_seed=int(resampling.get("bootstrap_seed", 0)),
        seeds_joint=resampling.get("seeds", "joint") == "joint",
        test_images_joint=resampling.get("test_images", "joint") == "joint",
        undecided_mc_se=float(data.get("undecided_mc_se", 3)),
        headline=str(data.get("headline", "random_effects")),
        seeds=int(data.get("seeds", 5)),
        tasks_per_model=int(data.get("tasks_per_model", 0)),
        source=str(path),
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        amends_sha256=amends,
    )
    if not (0 < design.alpha < 1 and design.margin > 0 and design.resamples >= 1000):
        raise UserError(f"{path}: alpha in (0, 1), a positive margin and at least 1000 resamples are required")
    if not math.isfinite(design.undecided_mc_se) or design.undecided_mc_se < 0:
        raise UserError(f"{path}: undecided_mc_se must be a non-negative number")
    return design
