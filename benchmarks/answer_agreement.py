"""The same answer twice (issue 56, item 4): whether searches that differ only in their seed (``--seed 0``, ``1``,
``2``) name configurations the others cannot tell apart from their own answer.

Each finished search's answer is its finalists' (``vitplast_tune.records.finalists.FinalAnswer``): the chosen
configuration and its one-standard-error set (the chosen one and every finalist within one standard error of the best
mean validation accuracy). A configuration's rate is continuous and drawn by each search's TPE, so two searches
rarely train the same rate: the chosen configurations are compared by subset (and depth), with their rates said. For
each pair of searches: is A's chosen subset in B's one-SE set? ``--page`` writes the dated page.

    python -m benchmarks.answer_agreement --names qs-seed0 qs-seed1 qs-seed2 --storage DIR --page PAGE.md
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from benchmarks import common
from vitplast_tune.errors import did_you_mean


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = common.parser(__doc__)
    p.add_argument("--names", nargs="+", required=True, help="the searches, by name")
    p.add_argument("--storage", help="where they are recorded (default: the results folder)")
    p.add_argument("--page", type=common.output, help="write the dated page (Markdown) here")
    p.add_argument("--note", default="", help="a line on how the searches ran, for the page")
    common.add_json_flag(p)
    args = p.parse_args(argv)
    from vitplast_tune import list_searches

    recorded = list_searches(args.storage)  # each name checked before any is read
    for name in args.names:
        if name not in recorded:
            p.error(
                f'argument --names: no search "{name}" in {args.storage or "the results folder"}{did_you_mean(name, recorded)}'
            )
    return args


def subset(configuration) -> str:
    """A finalist configuration's subset and depth: what the searches are compared by."""
    depth = configuration.row.get("depth")
    where = f" @{depth}" if isinstance(depth, str) and depth not in ("", "all") else ""
    return f"{configuration.row['components']}{where}"


def agreement(answers: dict[str, Any]) -> dict[str, Any]:
    """Each search's chosen subset, its one-SE set, and for each ordered pair whether the first's chosen subset is
    in the second's set.

    Args:
        answers: Each search's ``FinalAnswer``, by name.

    Returns:
        ``searches`` (name -> chosen, its rate, its set, its line) and ``pairs`` ((a, b, a's chosen in b's set)).
    """
    searches = {
        name: {
            "chosen": subset(a.chosen),
            "lr": float(a.chosen.row["lr"]),
            "set": sorted({subset(c) for c in (a.chosen, *a.tied)}),
            "finalists": len(a.configurations),
            "test": a.chosen.mean_test,
            "gains": {g.label: g.points for g in a.gains if g.kind == "compared"},
            "line": a.line,
        }
        for name, a in answers.items()
    }
    pairs = [(a, b, searches[a]["chosen"] in searches[b]["set"]) for a in searches for b in searches if a != b]
    return {"searches": searches, "pairs": pairs}


def lines(found: dict[str, Any]) -> list[str]:
    """The table of the searches and the pairs, and the sentence generated from them."""
    out = ["| search | chosen (rate) | its one-SE set |", "|---|---|---|"]
    for name, s in found["searches"].items():
        out.append(f"| {name} | {s['chosen']} (lr {s['lr']:.3g}) | {', '.join(s['set'])} |")
    agree = sum(ok for *_, ok in found["pairs"])
    out += ["", f"{agree} of {len(found['pairs'])} ordered pairs agree (A's chosen subset in B's one-SE set):", ""]
    out += [
        f"- {a}'s {found['searches'][a]['chosen']} {'is' if ok else 'is not'} in {b}'s set"
        for a, b, ok in found["pairs"]
    ]
    return [*out, "", *beside(found)]


def beside(found: dict[str, Any]) -> list[str]:
    """What the searches share beside the sets, generated from their answers: the chosen ones' test accuracies, their
    gains over the baselines, the components every chosen subset holds, and what a one-SE set can hold."""
    searches = list(found["searches"].values())
    tests = [100 * s["test"] for s in searches]
    out = [
        f"- The chosen configurations' mean test accuracies over their finalists' seeds: "
        f"{', '.join(f'{t:.2f}%' for t in tests)} (a spread of {max(tests) - min(tests):.2f} points)."
    ]
    for label in dict.fromkeys(k for s in searches for k in s["gains"]):
        gains = [s["gains"][label] for s in searches if label in s["gains"]]
        out.append(f"- Their gains over {label}: {', '.join(f'{g:+.2f}' for g in gains)} points.")
    common = set.intersection(*(set(s["chosen"].split(" @")[0].split("+")) for s in searches))
    out.append(f"- Components in every chosen subset: {', '.join(sorted(common)) or 'none'}.")
    out.append(
        "- A one-SE set holds only configurations its own search trained again (its finalists: "
        + ", ".join(str(s["finalists"]) for s in searches)
        + ", the baselines included): another search's choice is in it only where both searches' best "
        "configurations held the same subset."
    )
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import vitplast_tune as vt
    from vitplast_tune.records.finalists import FinalAnswer

    answers = {name: vt.load_search(name, storage=args.storage).answer for name in args.names}
    missing = [name for name, a in answers.items() if not isinstance(a, FinalAnswer)]
    if missing:
        print(f"error: no finalists' answer in {', '.join(missing)} (not finished, or no finalists stage)")
        return 2
    found = agreement(answers)
    said = lines(found)
    print("\n".join(said))
    if args.page:
        answers_said = [f"- {name}: `{s['line']}`" for name, s in found["searches"].items()]
        text = [f"# The same answer on three seeds ({time.strftime('%Y-%m-%d')})", "", args.note, ""]
        text += ["Generated by `benchmarks/answer_agreement.py` (its docstring gives the rule).", "", *said, ""]
        text += ["Each search's answer, as it printed it:", "", *answers_said, ""]
        Path(args.page).write_text("\n".join(text))
        print(f"page written to {args.page}")
    common.write_json(args.json, {"args": vars(args), **found})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
