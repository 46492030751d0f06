"""The finalists stage replayed over the kept tables (issue 56, item 5): how often a search's answer, chosen on
several seeds by the one-standard-error rule, ends within 0.5 and 1 point of the table's best configuration, and at
what share of the grid's GPU-seconds, beside the ceiling.

Each replay is ``benchmarks.search_replay.replay`` with TPE + ASHA (the search's default) and the baselines'
reference trials first (full finetuning and the probe at the rates ``vitplast_tune.space.baselines.sweep`` picks
from the table's, never stopped, unheard by TPE). With one trial at a time a replay of T trials is the first T
trials of a longer one, so one replay of the most trials answers every T. After its T trials the finalists stage
runs as the search runs it: the K best configurations by best validation accuracy (the baselines left out), full
finetuning and the probe at the rate of their best trial, each on N of the table's seeds (the same N for every
configuration, none a seed the search drew for it, so that no finalist repeats a search trial's noise), at the whole
recorded cost; the answer is ``vitplast_tune.records.finalists.final_answer``'s on those runs (K = 0: the search's
best trial, no stage). An answer is judged by its configuration's TEST accuracy averaged over all of the table's
seeds, against the table's best such mean (``Table.best``). The ceiling: the whole grid, each configuration on every
seed (5 x the grid's GPU-seconds), its configuration of the best mean validation accuracy taken.

The goal: the default (T, K, N) within 0.5 points in at least 0.9 of the ceiling's share, at no more than 0.4 of the
grid's GPU-seconds (median over replays). ``--page`` writes the dated page from the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from benchmarks import common
from benchmarks.replay_tables import Key, Run, Table, discover, load_table
from benchmarks.search_replay import cache_folder, quantiles, replay

VERSION = 1  # of the replay's rules here: a change makes every cached replay stale
TRIALS = (20, 30, 40, 60)  # the search's own trials (TPE's), beside the reference trials
TOPS = (0, 1, 2, 3, 5)  # K: the best configurations trained again (0: no stage, the best trial answers)
SEEDS = (2, 3, 4)  # N: the seeds each finalist trains on (the tables hold 5; a search trial drew one)
TOLERANCES = (0.005, 0.01)
GOAL_SHARE, GOAL_COST = 0.9, 0.4  # of the ceiling's share within 0.5 points; of the grid's GPU-seconds
BASELINES = ("all", "head")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = common.parser(__doc__)
    p.add_argument(
        "--tables",
        nargs="*",
        type=common.folder,
        help="kept folders to replay (default: every lab and check of lab-v2)",
    )
    p.add_argument("--seeds", type=common.at_least(1), default=50, help="search seeds per table (default: 50)")
    p.add_argument(
        "--trials",
        type=common.listed(common.at_least(1)),
        default=",".join(map(str, TRIALS)),
        help="T values, comma-separated",
    )
    p.add_argument(
        "--tops",
        type=common.listed(common.at_least(0)),
        default=",".join(map(str, TOPS)),
        help="K values, comma-separated",
    )
    p.add_argument(
        "--finalist-seeds",
        type=common.listed(common.at_least(1)),
        default=",".join(map(str, SEEDS)),
        help="N values, comma-separated",
    )
    p.add_argument(
        "--rates", type=common.at_least(1), default=3, help="rates per baseline of the reference trials (default: 3)"
    )
    p.add_argument("--cache", type=common.output_dir, help="cache folder (default: $VITPLAST_CACHE_DIR/search_replay)")
    p.add_argument("--page", type=common.output, help="write the dated page (Markdown) here")
    common.add_json_flag(p)
    return p.parse_args(argv)


def references(table: Table, rates: int) -> tuple[Key, ...]:
    """The reference trials' configurations: each baseline at the rates the search's sweep picks from the table's
    recorded ones, rate by rate, full finetuning then the probe (``vitplast_tune.space.baselines.references``)."""
    from vitplast_tune.space.baselines import sweep
    from vitplast_tune.space.distributions import Choice

    picked = {b: sweep(Choice("lr", tuple(table.rates(b))), rates) for b in BASELINES if table.rates(b)}
    return tuple((b, float(picked[b][i])) for i in range(rates) for b in picked if i < len(picked[b]))


def cached_search(folder: Path, table: Table, seed: int, most: int, rates: int) -> dict:
    """One replayed search (``replay``, TPE + ASHA, the reference trials first, ``most`` trials of TPE), cached."""
    path = folder / "finalists" / f"{table.name}-{table.digest}" / f"v{VERSION}-r{rates}-t{most}" / f"{seed}.json"
    if path.is_file():
        return json.loads(path.read_text())
    refs = references(table, rates)
    result = replay(table, "TPE + ASHA", seed, 0.005, 1e9, len(refs) + most, 1, refs)
    result["references"] = len(refs)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(result))
    os.replace(partial, path)
    return result


def parameters(table: Table) -> dict[str, float]:
    """Each subset's trainable parameters, from the table's kept trials (the one-SE rule picks the fewest)."""
    trials = pd.read_csv(table.path / "trials.csv", usecols=["subset", "trainable_params"])
    return trials.groupby("subset")["trainable_params"].first().astype(float).to_dict()


def _best_val(run: Run) -> float | None:
    values = [a for _, a in run.curve if not math.isnan(a)]
    return None if run.diverged or not values else max(values)


def finalists(
    table: Table, ended: Sequence[list], top: int, n: int, seed: int, params: dict[str, float]
) -> tuple[Key | None, Key | None, float]:
    """The stage after a search's trials (``ended``: subset, lr, best validation accuracy or None, seed, seconds):
    the configuration its answer names, the one of the best mean validation accuracy, and the stage's GPU-seconds.

    Args:
        table: The table.
        ended: The search's trials as they ended (the reference trials first).
        top: K (0: no stage; the best trial's configuration answers).
        n: N, the seeds of each finalist.
        seed: The search seed (the finalists' seeds are drawn from it).
        params: Each subset's trainable parameters.

    Returns:
        The answer's (subset, lr) by the one-SE rule, the finalists' best mean's (both the best trial's without a
        stage) and the stage's seconds; (None, None, 0) when no trial reported a validation accuracy.
    """
    from vitplast_tune.records.finalists import final_answer

    ranked = sorted((e for e in ended if e[2] is not None), key=lambda e: -e[2])
    if not ranked:
        return None, None, 0.0
    if top == 0:
        return (ranked[0][0], ranked[0][1]), (ranked[0][0], ranked[0][1]), 0.0
    picked: list[Key] = []
    for subset, lr, *_ in ranked:
        if len(picked) < top and subset not in BASELINES and (subset, lr) not in picked:
            picked.append((subset, lr))
    for name in BASELINES:
        own = next(((s, lr) for s, lr, *_ in ranked if s == name), None)
        rates = table.rates(name)
        if own is None and rates:  # the search ran none: the best trial's rate, the nearest recorded
            own = (name, min(rates, key=lambda r: abs(math.log(r / ranked[0][1]))))
        if own is not None:
            picked.append(own)
    order = random.Random(f"{seed}:finalists")
    every = sorted({r.seed for runs in table.runs.values() for r in runs})
    order.shuffle(every)
    rows, spent = [], 0.0
    for index, key in enumerate(picked, start=1):
        drawn = {e[3] for e in ended if (e[0], e[1]) == key}  # the seeds the search trained it on
        by_seed = {r.seed: r for r in table.runs[key]}
        for s in [s for s in every if s in by_seed and s not in drawn][:n]:
            run = by_seed[s]
            spent += run.seconds
            val = _best_val(run)
            rows.append(
                {"trial_id": f"{index}-{s}", "components": key[0], "lr": key[1], "stage": "finalist", "seed": s}
                | {"finalist": index, "lr_from": "own", "best_val_acc": val, "test_acc": run.test_acc}
                | {"trainable_params": params.get(key[0], math.nan), "step": table.max_steps, "diverged": val is None}
                | {"max_steps": table.max_steps, "error": None}
            )
    answer = final_answer(pd.DataFrame(rows)) if rows else None
    if answer is None:
        return (ranked[0][0], ranked[0][1]), (ranked[0][0], ranked[0][1]), spent
    named = lambda c: (str(c.row["components"]), float(c.row["lr"]))
    return named(answer.chosen), named(answer.best), spent


def ceiling(table: Table) -> float:
    """The whole grid on every seed, judged by its mean validation accuracy: points below the table's best."""
    mean_val = {key: statistics.mean(_best_val(r) or 0.0 for r in runs) for key, runs in table.runs.items()}
    return 100 * (table.best[1] - table.mean_test(max(mean_val, key=mean_val.__getitem__)))


def measure(tables: list[Table], args: argparse.Namespace) -> dict[str, Any]:
    """Every (T, K, N) over every table and search seed: the shares within each tolerance and the GPU-seconds."""
    trials = [int(t) for t in args.trials.split(",")]
    tops = [int(k) for k in args.tops.split(",")]
    ns = [int(n) for n in args.finalist_seeds.split(",")]
    folder, most = cache_folder(args), max(trials)
    regrets: dict[tuple[int, int, int], list[tuple[float, float, float]]] = {}
    for table in tables:
        started, params, best = time.time(), parameters(table), table.best[1]
        for seed in range(args.seeds):
            result = cached_search(folder, table, seed, most, args.rates)
            for t in trials:
                ended = result["ended"][: result["references"] + t]
                searched = sum(e[4] for e in ended)
                for k in tops:
                    for n in ns if k else [0]:
                        key, top_mean, spent = finalists(table, ended, k, n, seed, params)
                        regret = math.inf if key is None else 100 * (best - table.mean_test(key))
                        by_mean = math.inf if top_mean is None else 100 * (best - table.mean_test(top_mean))
                        cost = (searched + spent) / table.grid_seconds
                        regrets.setdefault((t, k, n), []).append((regret, cost, by_mean))
        print(f"{table.name}: {args.seeds} search seeds, {time.time() - started:.1f} s", flush=True)
    rows = []
    for (t, k, n), pairs in sorted(regrets.items()):
        costs = [c for _, c, _ in pairs]
        within = {tol: sum(r <= 100 * tol + 1e-7 for r, _, _ in pairs) / len(pairs) for tol in TOLERANCES}
        by_mean = {tol: sum(r <= 100 * tol + 1e-7 for _, _, r in pairs) / len(pairs) for tol in TOLERANCES}
        rows.append(
            {"trials": t, "top": k, "seeds": n, "within": within, "regret": quantiles([r for r, _, _ in pairs])}
            | {"within_best_mean": by_mean, "cost": quantiles(costs), "replays": len(pairs)}
        )
    ceilings = [ceiling(t) for t in tables]
    top = {tol: sum(r <= 100 * tol + 1e-7 for r in ceilings) / len(ceilings) for tol in TOLERANCES}
    return {"rows": rows, "ceiling": {"within": top, "regrets": ceilings, "cost": 5.0}, "choice": choose(rows, top)}


def meets(row: dict[str, Any], ceiling_share: float) -> bool:
    """Whether a (T, K, N) meets the goal: within 0.5 points in >= 0.9 of the ceiling's share, at a median of <= 0.4
    of the grid's GPU-seconds."""
    return row["within"][0.005] >= GOAL_SHARE * ceiling_share - 1e-9 and row["cost"][0] <= GOAL_COST


def choose(rows: list[dict[str, Any]], ceiling: dict[float, float]) -> dict[str, Any]:
    """The default the figures point to, by the one-standard-error rule the answer uses: among the (T, K, N) that
    meet the goal (where none does, those at no more than 0.4 of the grid's GPU-seconds), the cheapest (median
    GPU-seconds) whose share within 0.5 points is within one binomial standard error of the best share there; ``met``
    says whether the goal is met, ``best`` is that best share's row."""
    met = [r for r in rows if meets(r, ceiling[0.005])]
    pool = met or [r for r in rows if r["cost"][0] <= GOAL_COST] or rows
    best = max(pool, key=lambda r: (r["within"][0.005], r["within"][0.01], -r["cost"][0]))
    p = best["within"][0.005]
    se = math.sqrt(p * (1 - p) / best["replays"])
    tied = [r for r in pool if r["within"][0.005] >= p - se - 1e-9]
    chosen = min(tied, key=lambda r: (r["cost"][0], -r["within"][0.005]))
    return {"met": bool(met), "se": se, "best": best, **chosen}


def said(row: dict[str, Any]) -> str:
    """A (T, K, N) in words."""
    stage = f"finalists top {row['top']} on {row['seeds']} seeds" if row["top"] else "no finalists stage"
    return f"{row['trials']} trials of TPE + ASHA, {stage}"


def lines(summary: dict[str, Any]) -> list[str]:
    """The figures' table (Markdown) and the sentences generated from them (``sentences``)."""
    c, rows = summary["ceiling"], summary["rows"]
    head = "| trials T | top K | seeds N | within 0.5 points | within 1 point | by best mean: within 0.5 | within 1 "
    head += "| points below the best, median [IQR] | grid's GPU-seconds, median [IQR] | goal |"
    out = [head, "|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda v: f"{v:.2f}" if math.isfinite(v) else "inf"
    for r in rows:
        m, q1, q3 = r["regret"]
        cm, c1, c3 = r["cost"]
        out.append(
            f"| {r['trials']} | {r['top'] or '-'} | {r['seeds'] or '-'} | {r['within'][0.005]:.2f} | "
            f"{r['within'][0.01]:.2f} | {r['within_best_mean'][0.005]:.2f} | {r['within_best_mean'][0.01]:.2f} | "
            f"{f(m)} [{f(q1)}, {f(q3)}] | {cm:.3f} [{c1:.3f}, {c3:.3f}] | "
            f"{'met' if meets(r, c['within'][0.005]) else ''} |"
        )
    share = c["within"][0.005]
    out.append(
        f"| ceiling: the whole grid on every seed, by mean validation | | | {share:.2f} | {c['within'][0.01]:.2f} | "
        f"| | {statistics.median(c['regrets']):.2f} (median over {len(c['regrets'])} tables) | {c['cost']:.1f} | |"
    )
    return [*out, "", *sentences(summary)]


def sentences(summary: dict[str, Any]) -> list[str]:
    """What the figures say, generated from them: the goal, the default chosen, the stage's gain, the rule's cost."""
    rows, share = summary["rows"], summary["ceiling"]["within"][0.005]
    chosen, best = summary["choice"], summary["choice"]["best"]
    goal = GOAL_SHARE * share
    out = [f"- The ceiling comes within 0.5 points on {share:.2f} of the tables, so the goal is a share of at least "]
    out[-1] += f"{goal:.2f} at no more than {GOAL_COST} of the grid's GPU-seconds (median over replays)."
    where = "that meet it" if chosen["met"] else f"at no more than {GOAL_COST} of the grid's GPU-seconds"
    out.append(
        f"- The goal is {'met' if chosen['met'] else 'not met'}. The best share {where}: {said(best)}, within 0.5 "
        f"points in {best['within'][0.005]:.2f} of the replays"
        + ("" if chosen["met"] else f", {goal - best['within'][0.005]:.2f} short of {goal:.2f}")
        + f"; within 1 point in {best['within'][0.01]:.2f}, at {best['cost'][0]:.3f} of the grid's GPU-seconds."
    )
    out.append(
        f"- The default, chosen by the one-standard-error rule the answer itself uses (the cheapest setting whose share "
        f"within 0.5 points is within one binomial standard error, {chosen['se']:.3f}, of that best share): "
        f"{said(chosen)}, within 0.5 points in {chosen['within'][0.005]:.2f} of the replays and within 1 point in "
        f"{chosen['within'][0.01]:.2f}, at {chosen['cost'][0]:.3f} [{chosen['cost'][1]:.3f}, {chosen['cost'][2]:.3f}]"
        " of the grid's GPU-seconds."
    )
    alone = next((r for r in rows if r["trials"] == chosen["trials"] and r["top"] == 0), None)
    if alone is not None and chosen["top"]:
        out.append(
            f"- Without the finalists stage, the same {chosen['trials']} trials answer within 0.5 points in "
            f"{alone['within'][0.005]:.2f} of the replays and within 1 point in {alone['within'][0.01]:.2f}, at "
            f"{alone['cost'][0]:.3f} of the grid's GPU-seconds: the stage adds "
            f"{_signed(chosen['within'][0.005] - alone['within'][0.005])} and "
            f"{_signed(chosen['within'][0.01] - alone['within'][0.01])} "
            f"to the shares for {chosen['cost'][0] - alone['cost'][0]:.3f} of the grid's GPU-seconds."
        )
    if chosen["top"]:
        out.append(
            f"- Taking the finalists' best mean validation accuracy instead of the one-SE rule's cheaper choice, the "
            f"default's shares would be {chosen['within_best_mean'][0.005]:.2f} within 0.5 points and "
            f"{chosen['within_best_mean'][0.01]:.2f} within 1 point: the rule's fewer parameters change them by "
            f"{_signed(chosen['within'][0.005] - chosen['within_best_mean'][0.005])} and "
            f"{_signed(chosen['within'][0.01] - chosen['within_best_mean'][0.01])}."
        )
    return out


def _signed(value: float) -> str:
    """A difference of shares, signed, never "-0.00"."""
    return f"{round(value, 2) + 0.0:+.2f}"


def page(summary: dict[str, Any], tables: list[Table], args: argparse.Namespace, command: str) -> str:
    """The dated page: how it was made, the figures and what they say."""
    return "\n".join(
        [
            f"# Search replay with the finalists stage ({time.strftime('%Y-%m-%d')})",
            "",
            "Generated by `benchmarks/replay_finalists.py` (its docstring gives the method):",
            "",
            "```bash",
            command,
            "```",
            "",
            f"{len(tables)} tables ({', '.join(t.name for t in tables)}), {args.seeds} search seeds each; the reference "
            f"trials (full finetuning and the probe, {args.rates} rate(s) each) run first in every replay and count in "
            "its GPU-seconds. A share is of replays (tables x search seeds) whose answer's configuration has a mean "
            "test accuracy over the table's seeds within 0.5 (1) points of the best configuration's; the GPU-seconds "
            "are the search's trials' and the finalists', as a share of the grid's (every configuration once).",
            "",
            *lines(summary),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    folders = [Path(p) for p in args.tables] if args.tables else discover()
    tables = [load_table(f) for f in folders]
    summary = measure(tables, args)
    for line in lines(summary):
        print(line)
    if args.page:
        command = "python -m benchmarks.replay_finalists " + " ".join(argv if argv is not None else sys.argv[1:])
        Path(args.page).parent.mkdir(parents=True, exist_ok=True)
        Path(args.page).write_text(page(summary, tables, args, command))
        print(f"page written to {args.page}")
    common.write_json(args.json, {"args": vars(args), "tables": [t.name for t in tables], **summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
