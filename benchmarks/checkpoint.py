"""Checkpoint cost: bytes and seconds per report of a trial that checkpoints, on local disk and on S3.

A real Ray Tune trial (a local Ray instance, one trial per subset and storage) holds the state a finetuning run
checkpoints: the trainable tensors of a subset of the model, SGD's momentum for them and the best-validation copy
(``run.checkpoints.write_checkpoint``). It reports ``--reports`` times, each with a checkpoint, as a trial does after an
evaluation. Per report: the bytes of the checkpoint, the seconds to write its files, and the seconds of the whole
``tune.report`` call (writing plus Ray Tune's upload to the storage, which holds the trial until it is done). The
storages: a local directory, and S3: an S3 server on 127.0.0.1 (moto's server mode, started here as a process of its own) unless ``--s3``
names a real bucket (credentials from the environment).

    python -m benchmarks.checkpoint                                    # the testbed ViT, all / mha / head
    python -m benchmarks.checkpoint --model vit_base_patch16_224 --reports 3 --json checkpoint.json
    python -m benchmarks.checkpoint --s3 s3://my-bucket/bench          # a real bucket

The seconds say how often to checkpoint: with ``checkpoint_every: k`` a trial pays one report's checkpoint every
k evaluations (and whenever its best accuracy improves), so k should keep that a small share of the training time
between reports.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks import common

DEFAULT_SUBSETS = "all,mha,head"


def parse_args(argv: list[str] | None = None):
    p = common.parser(__doc__)
    p.add_argument("--model", default="vit_testbed_patch8_32", help="timm ViT, randomly initialised")
    p.add_argument(
        "--subsets",
        type=common.listed(common.subset),
        default=DEFAULT_SUBSETS,
        help=f"comma-separated (default: {DEFAULT_SUBSETS})",
    )
    p.add_argument(
        "--reports", type=common.at_least(1), default=4, help="reports with a checkpoint per trial (default: 4)"
    )
    p.add_argument("--s3", help="an s3:// URI to use instead of a local S3 server (moto)")
    p.add_argument(
        "--storages",
        type=common.listed(common.known(["local", "s3"])),
        default="local,s3",
        help="local, s3 or both (default: local,s3)",
    )
    common.add_json_flag(p)
    return p.parse_args(argv)


def checkpointing_trial(config: dict[str, Any]) -> None:
    """A Tune trainable that reports ``config["reports"]`` times with the checkpoint of a run's state; each report
    carries the seconds the previous one took (writing the files and ``tune.report``), the last one without a
    checkpoint."""
    import torch
    from ray import tune

    from vitplast_tune import freezing
    from vitplast_tune.run.checkpoints import write_checkpoint
    from vitplast_tune.vit import models
    from vitplast_tune.vit.families.registry import layout_of

    model = models.create_model(config["model"], 10, pretrained=False)
    freezing.freeze(model, config["subset"], layout=layout_of(model))
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    optimizer = torch.optim.SGD(trainable.values(), lr=0.01, momentum=0.9)
    sum(p.sum() for p in trainable.values()).backward()
    optimizer.step()  # momentum buffers, as after a training step
    best = {"val_acc": 0.5, "step": 1, "trainable": {n: p.detach().clone() for n, p in trainable.items()}}
    previous: dict[str, float] = {}
    measured: list[dict[str, float]] = []
    for step in range(1, config["reports"] + 1):
        state = {"step": step, "trainable": {n: p.detach() for n, p in trainable.items()}, "best": best}
        state["optimizer"] = optimizer.state_dict()
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as directory:
            write_checkpoint(Path(directory), state)
            written = time.perf_counter() - started
            size = sum(f.stat().st_size for f in Path(directory).iterdir())
            tune.report({"step": step, **previous}, checkpoint=tune.Checkpoint.from_directory(directory))
        previous = {"bytes": size, "write_s": written, "report_s": time.perf_counter() - started}
        measured.append(previous)
    kept = measured[1:] or measured  # the first left out: a warm-up
    medians = {f"median_{key}": statistics.median(m[key] for m in kept) for key in ("bytes", "write_s", "report_s")}
    tune.report({"step": config["reports"] + 1, **previous, **medians})


def measure(model: str, subset: str, reports: int, storage: str) -> dict[str, float]:
    """One trial of ``subset`` checkpointing to ``storage`` (a directory or a URI): the median over its reports
    (the first left out: a warm-up) of the bytes of a checkpoint, the seconds to write it and to report it."""
    from ray import tune

    tuner = tune.Tuner(
        tune.with_resources(checkpointing_trial, {"cpu": 1}),
        param_space={"model": model, "subset": subset, "reports": reports},
        run_config=tune.RunConfig(
            name=f"checkpoint-{subset}",
            storage_path=storage,
            verbose=0,
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
        ),
    )
    (result,) = tuner.fit()
    if result.error is not None:
        raise RuntimeError(f"the {subset} trial failed: {result.error}")
    # From the last report the driver holds, not from the trial's files (result.json) read back from the storage.
    return {key: float(result.metrics[f"median_{key}"]) for key in ("bytes", "write_s", "report_s")}


class LocalS3:
    """An S3 server on 127.0.0.1 (``python -m moto.server``, a process of its own, so that it does not share this
    driver's interpreter) with a bucket, for the block; the ``s3://`` URI that reaches it."""

    def __enter__(self) -> str:
        import boto3

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
        self.server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=2).close()
                break
            except OSError:
                if self.server.poll() is not None or time.monotonic() > deadline:
                    self.__exit__()
                    raise RuntimeError("the local S3 server (python -m moto.server) did not start") from None
                time.sleep(0.2)
        os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
        boto3.client("s3", endpoint_url=url).create_bucket(Bucket="bench")
        return f"s3://bench/checkpoints?endpoint_override=127.0.0.1:{port}&scheme=http"

    def __exit__(self, *exc) -> None:
        self.server.terminate()
        try:
            self.server.wait(10)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()


def run(args) -> dict:
    """Every subset on every storage: {storage: {subset: measurements}}."""
    subsets = [s.strip() for s in args.subsets.split(",") if s.strip()]
    storages = [s.strip() for s in args.storages.split(",")]
    result: dict = {"model": args.model, "reports": args.reports, "date": time.strftime("%Y-%m-%d")}
    with common.local_ray(cpus=1, gpus=0), common.scratch("bench_checkpoint_") as tmp:
        if "local" in storages:
            result["local"] = {s: measure(args.model, s, args.reports, str(tmp / "results")) for s in subsets}
        if "s3" in storages:
            if args.s3:
                result["s3"] = {s: measure(args.model, s, args.reports, args.s3) for s in subsets}
            else:
                with LocalS3() as uri:
                    result["s3"] = {s: measure(args.model, s, args.reports, uri) for s in subsets}
    return result


def format_table(result: dict) -> str:
    """The measurements as a text table, a row per subset and storage."""
    lines = [
        f"{result['model']}, {result['reports']} reports with a checkpoint per trial ({result['date']}); medians",
        "subset   storage  MiB/checkpoint  write s  report s  MiB/s",
    ]
    for storage in ("local", "s3"):
        for subset, m in result.get(storage, {}).items():
            mib = m["bytes"] / 2**20
            lines.append(
                f"{subset:<8} {storage:<8} {mib:>14.1f} {m['write_s']:>8.3f} {m['report_s']:>9.3f} "
                f"{mib / max(m['report_s'], 1e-9):>6.0f}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print(format_table(result))
    common.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
