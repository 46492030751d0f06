"""How many steps until full finetuning has levelled off: the criteria lab's second budget.

Full finetuning (``components: all``) of the testbed on digits with the criteria lab's settings (SGD,
warm-up 15% of the budget, cosine decay to zero), at each budget in ``--budgets``, each learning rate and
seed: the final and best validation accuracy and the test accuracy at the best-validation weights (what
the lab ranks), and the validation curve inside each run. The budget at which a longer run no longer gains
(within the seeds' spread) is long enough for the lab's second budget. Accuracy figures do not depend on
the machine's load; the seconds do (``to be timed alone``).

    python -m benchmarks.budget --json docs/budget_curve.json --png docs/budget_curve.png
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks import common
from vitplast_tune.config import FinetuneConfig
from vitplast_tune.vit.training import finetune


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The budgets, learning rates and seeds to run, and where to write the table and the plot."""
    p = common.parser(__doc__)
    p.add_argument("--budgets", type=common.at_least(1), nargs="+", default=[150, 300, 600, 1200], help="step budgets")
    p.add_argument("--lrs", type=common.above(0), nargs="+", default=[0.03, 0.1], help="learning rates (the lab's)")
    p.add_argument("--seeds", type=common.at_least(0), nargs="+", default=[0, 42], help="seeds (split, head, batches)")
    p.add_argument(
        "--components", type=common.subset, default="all", help="the subset to train (default: full finetuning)"
    )
    p.add_argument("--eval-every", type=common.at_least(1), default=50, help="validation every this many steps")
    p.add_argument("--json", type=common.output_path, default=None, help="write every run's curve and finals here")
    p.add_argument(
        "--png", type=common.output_path, default=None, help="plot the curves and the finals per budget here"
    )
    p.add_argument("--add", type=Path, default=None, help="a --json of earlier runs to add these to (table and plot)")
    return p.parse_args(argv)


def run_one(budget: int, lr: float, seed: int, args: argparse.Namespace) -> dict:
    """One finetuning run with the lab's settings; its validation curve and final figures."""
    cfg = FinetuneConfig(
        components=args.components,
        lr=lr,
        seed=seed,
        max_steps=budget,
        warmup_fraction=0.15,
        eval_every=args.eval_every,
        threads=1,
    )
    curve: list[tuple[int, float]] = []
    started, cpu = time.perf_counter(), time.process_time()
    _, final = finetune(cfg, report=lambda m, _state: curve.append((m["step"], m["val_acc"])))
    return {
        "budget": budget,
        "lr": lr,
        "seed": seed,
        "val_acc": final["val_acc"],
        "best_val_acc": final["best_val_acc"],
        "test_acc": final["test_acc"],
        "curve": curve,
        "seconds": round(time.perf_counter() - started, 1),
        "cpu_seconds": round(time.process_time() - cpu, 1),  # one thread: the run's own work, whatever the load
    }


def summary(runs: list[dict]) -> list[dict]:
    """Per budget and learning rate: mean and spread (min, max) over seeds of each final figure."""
    rows = []
    for budget in sorted({r["budget"] for r in runs}):
        for lr in sorted({r["lr"] for r in runs}):
            group = [r for r in runs if r["budget"] == budget and r["lr"] == lr]
            if not group:
                continue
            row = {"budget": budget, "lr": lr, "seeds": len(group)}
            for key in ("val_acc", "best_val_acc", "test_acc"):
                values = [r[key] for r in group]
                row[key] = statistics.fmean(values)
                row[f"{key}_min"], row[f"{key}_max"] = min(values), max(values)
            rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    """The summary as a markdown table (accuracy in %, mean over seeds and [min, max])."""
    lines = [
        "| budget (steps) | lr | seeds | final val acc | best val acc | test acc (best-val weights) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [
            f"{100 * r[k]:.2f}% [{100 * r[k + '_min']:.2f}, {100 * r[k + '_max']:.2f}]"
            for k in ("val_acc", "best_val_acc", "test_acc")
        ]
        lines.append(f"| {r['budget']} | {r['lr']:g} | {r['seeds']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(runs: list[dict], rows: list[dict], path: Path) -> None:
    """Left: the validation curve of each run (one colour per budget); right: final test accuracy per budget."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.4), layout="constrained")
    left, right = fig.subplots(1, 2)
    budgets = sorted({r["budget"] for r in runs})
    styles = {lr: style for lr, style in zip(sorted({r["lr"] for r in runs}), ("--", "-", ":", "-."))}
    for r in runs:
        steps, acc = zip(*r["curve"])
        color = f"C{budgets.index(r['budget'])}"
        left.plot(steps, [100 * a for a in acc], styles[r["lr"]], color=color, lw=1, alpha=0.8)
    for i, budget in enumerate(budgets):
        left.plot([], [], color=f"C{i}", label=f"{budget} steps")
    for lr, style in styles.items():
        left.plot([], [], style, color="0.3", label=f"lr {lr:g}")
    left.set(xlabel="step", ylabel="validation accuracy (%)", title="full finetuning, validation curves")
    left.legend(frameon=False, fontsize=7)
    for lr, style in styles.items():
        group = [r for r in rows if r["lr"] == lr]
        mean = [100 * r["test_acc"] for r in group]
        err = [
            [m - 100 * r["test_acc_min"] for m, r in zip(mean, group)],
            [100 * r["test_acc_max"] - m for m, r in zip(mean, group)],
        ]
        right.errorbar([r["budget"] for r in group], mean, yerr=err, fmt="o" + style, capsize=3, label=f"lr {lr:g}")
    right.set(xscale="log", xlabel="budget (steps)", ylabel="test accuracy (%)", title="at the end of each budget")
    right.set_xticks(budgets, [str(b) for b in budgets])
    right.minorticks_off()
    right.legend(frameon=False, fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, format="png")


def main(argv: list[str] | None = None) -> None:
    """Run every budget x lr x seed (seeds outermost, so a first pass covers every budget), print and write."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    runs = json.loads(args.add.read_text())["runs"] if args.add else []
    for seed in args.seeds:
        for budget in args.budgets:
            for lr in args.lrs:
                runs.append(run_one(budget, lr, seed, args))
                r = runs[-1]
                print(
                    f"budget {budget:>5} lr {lr:<5g} seed {seed:<5} val {100 * r['val_acc']:.2f}% "
                    f"best val {100 * r['best_val_acc']:.2f}% test {100 * r['test_acc']:.2f}% ({r['seconds']} s)",
                    flush=True,
                )
                common.write_json(args.json, {"runs": runs, "summary": summary(runs)})  # after each run
    rows = summary(runs)
    print(markdown(rows))
    if args.png:
        plot(runs, rows, args.png)


if __name__ == "__main__":
    main()
