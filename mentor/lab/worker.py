"""The ``torchrun`` worker for metrics under DDP: ``torchrun --nproc-per-node=2 -m mentor.lab.worker TASK --out DIR``.

Each rank runs one task of :data:`TASKS` and writes ``DIR/rank<r>.json``; :func:`run` starts
``torchrun`` on this machine and reads the files back. The process group uses ``--backend``
(``nccl`` with one GPU per process, the default when CUDA is present; ``gloo`` on CPUs, which is
how ``make test`` runs the same worker; or a device map such as ``cpu:gloo,cuda:nccl``).

On several machines, start the same command on each with the launcher's rendezvous options, for
example on 2 nodes of 8 GPUs (``$HEAD`` is the first node's address, reachable from the others)::

    torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint=$HEAD:29400 \\
        --rdzv-id=metrics-1 -m mentor.lab.worker agree --out results/

Every rank then writes its own file on its own machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from mentor.lab.blocks import _int_at_least

TASKS: dict[str, str] = {
    "agree": "metrics over the ranks' shards equal one process's metrics over all the data (suite and torchmetrics)",
    "sync-cost": "step and report-step times and collectives of each way to synchronize metrics (interleaved rounds)",
    "placements": "CPU-resident metrics across real ranks: what compute() does in each placement",
}
"""What the worker can run, by name."""

SYNC_CONFIGS: tuple[str, ...] = ("no metrics", "macro, compute", "macro, per step",
                                 "suite, compute", "suite, one all-reduce")
"""The configurations that task ``sync-cost`` compares: no metrics (the baseline); "macro": torchmetrics' four macro
classes made sync-free (:func:`mentor.sync_free.scatter_stat_scores`, one compute group; not stock torchmetrics, whose
macro classes sync at every update) and a loss mean, synced by ``compute()``;
the same called each step with ``dist_sync_on_step=True``, which syncs at every step; the fused suite synced by
``compute()``; the fused suite synced in one all-reduce (:func:`mentor.flat_sync.flat_sync`)."""

REPO = Path(__file__).resolve().parents[2]
"""The repository root (it holds the mentor package), put on the workers' PYTHONPATH."""


def _agree_data(num_classes: int, samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The whole data set of task ``agree``: logits, targets and one loss per batch of 8.

    The last class never occurs as a target (an absent class), the losses are multiples of 1/8
    (so their sums are exact in any order), and ``samples`` need not divide among the ranks.
    """
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(samples, num_classes, generator=g)
    targets = torch.randint(0, num_classes - 1, (samples,), generator=g)
    losses = torch.randint(0, 24, ((samples + 7) // 8,), generator=g).double() / 8
    return logits, targets, losses


def _agree_metrics(num_classes: int, device: torch.device, sync_on_compute: bool) -> dict[str, Any]:
    from torchmetrics import MeanMetric
    from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

    from mentor.flat_sync import flat_sync
    from mentor.suite import FusedMetrics

    options = dict(sync_on_compute=sync_on_compute)
    return {
        "suite": FusedMetrics(num_classes, **options).to(device),
        "flat suite": flat_sync(FusedMetrics)(num_classes, **options).to(device),
        "loss": MeanMetric(**options).to(device),
        "accuracy_micro": MulticlassAccuracy(num_classes, average="micro", **options).to(device),
        "accuracy_macro": MulticlassAccuracy(num_classes, average="macro", **options).to(device),
        "f1_weighted": MulticlassF1Score(num_classes, average="weighted", **options).to(device),
    }


def _feed(metrics: dict[str, Any], logits: torch.Tensor, targets: torch.Tensor, losses: torch.Tensor,
          batches: Sequence[int]) -> dict[str, list[float]]:
    """Update ``metrics`` with the given batches of 8 and return every computed value as a list of floats."""
    device = metrics["suite"].tp.device
    for b in batches:
        x, y = logits[8 * b: 8 * b + 8].to(device), targets[8 * b: 8 * b + 8].to(device)
        loss = losses[b].to(device)
        metrics["suite"].update(loss, x, y)
        metrics["flat suite"].update(loss, x, y)
        metrics["loss"].update(loss)
        for name in ("accuracy_micro", "accuracy_macro", "f1_weighted"):
            metrics[name].update(x, y)
    values = {f"suite/{k}": v for k, v in metrics["suite"].compute().items()}
    values.update({f"flat suite/{k}": v for k, v in metrics["flat suite"].compute().items()})
    values.update({f"torchmetrics/{k}": metrics[k].compute() for k in metrics if "suite" not in k})
    return {k: v.double().reshape(-1).cpu().tolist() for k, v in values.items()}


def agree(rank: int, world_size: int, device: torch.device, num_classes: int = 5, samples: int = 203,
          seed: int = 0) -> dict[str, Any]:
    """Rank ``rank`` updates with batches ``rank, rank + world_size, ...`` of the data and computes, synced.

    Returns ``{"distributed", "local", "reference", "batches"}``: the synced values, this rank's
    values without syncing, one process's values over every batch (metrics made with
    ``sync_on_compute=False``), and this rank's batches. The values are
    ``{"suite/<name>", "flat suite/<name>" (the suite synced in one all-reduce, :mod:`mentor.flat_sync`) or
    "torchmetrics/<name>": [floats]}``; distributed should equal reference.

    Example (one rank and no process group: nothing to sync, so this rank sees all the data):
        >>> result = agree(0, 1, torch.device("cpu"))
        >>> result["distributed"] == result["local"] == result["reference"], len(result["batches"])
        (True, 26)
    """
    logits, targets, losses = _agree_data(num_classes, samples, seed)
    batches = list(range(len(losses)))
    distributed = _feed(_agree_metrics(num_classes, device, True), logits, targets, losses, batches[rank::world_size])
    local = _feed(_agree_metrics(num_classes, device, False), logits, targets, losses, batches[rank::world_size])
    reference = _feed(_agree_metrics(num_classes, device, False), logits, targets, losses, batches)
    return {"distributed": distributed, "local": local, "reference": reference, "batches": batches[rank::world_size]}


def _scores_config(name: str, num_classes: int, device: torch.device, **options: Any) -> Any:
    """torchmetrics' macro scores made sync-free (one compute group) and a mean loss, with Metric ``options``."""
    from torchmetrics import MeanMetric, MetricCollection

    from mentor.lab.configs import Config
    from mentor.lab.metric_sets import _MACRO_CLASSES, SCORES, LossAndScores
    from mentor.sync_free import scatter_stat_scores, suppress_nan_check

    forward = bool(options.get("dist_sync_on_step"))

    def make() -> Any:
        scores = MetricCollection({n: scatter_stat_scores(c)(num_classes, average="macro", **options)
                                   for n, c in zip(SCORES, _MACRO_CLASSES)}, compute_groups=[list(SCORES)])
        loss = suppress_nan_check(MeanMetric)(**options).to(device)
        metrics = LossAndScores(loss, scores.to(device), forward=forward)
        return (lambda s: metrics.update(s.loss, s.output, s.labels)), metrics.report

    how = "called (forward) with dist_sync_on_step=True" if forward else "updated, synced by compute()"
    return Config(name, make, f"macro scores (scatter_stat_scores) and a mean loss, {how}")


def sync_configs(num_classes: int, device: torch.device) -> list[Any]:
    """The configurations of :data:`SYNC_CONFIGS`, as ``mentor.lab.configs.Config``.

    Example:
        >>> [c.name for c in sync_configs(10, torch.device("cpu"))] == list(SYNC_CONFIGS)
        True
    """
    from mentor.lab.configs import Config, suite_config
    from mentor.flat_sync import flat_sync
    from mentor.suite import FusedMetrics

    def flat_suite() -> Any:
        suite = flat_sync(FusedMetrics)(num_classes).to(device)

        def on_report(_: int) -> None:
            # compute() reads nothing back; the values, its count of invalid labels too, come back in one copy
            torch.stack(list(suite.compute().values())).tolist()
            suite.reset()

        return (lambda s: suite.update(s.loss, s.output, s.labels)), on_report

    return [Config(SYNC_CONFIGS[0]),
            _scores_config(SYNC_CONFIGS[1], num_classes, device),
            _scores_config(SYNC_CONFIGS[2], num_classes, device, dist_sync_on_step=True),
            suite_config(num_classes, device, name=SYNC_CONFIGS[3]),
            Config(SYNC_CONFIGS[4], flat_suite, "FusedMetrics synced in one all-reduce of one float64 buffer")]


def collectives_per_report(config: Any, setup: Any, batches: Any, steps: int = 2) -> dict[str, Any]:
    """The ``torch.distributed`` calls one configuration makes per training step and per report, by kind.

    Counted with the wrappers of :func:`mentor.syncs.sync_guard` (which also work on CPU);
    DDP's own gradient all-reduce is issued from C++ and is not among them.
    """
    from mentor.syncs import SyncReport, _intercept
    from mentor.lab.train import train

    on_step, on_report = config.make()
    train(setup, batches, steps=1, on_step=on_step)  # first updates allocate state
    with _intercept(SyncReport()) as per_steps:
        train(setup, batches, steps=steps, on_step=on_step)
    per_report = SyncReport()
    if on_report is not None:
        with _intercept(per_report):
            on_report(steps + 1)
    return {"per_step": {k: n / steps for k, n in sorted(per_steps.by_kind().items())},
            "per_report": dict(sorted(per_report.by_kind().items()))}


def sync_cost(rank: int, world_size: int, device: torch.device, seed: int = 0,
              rounds: int | None = None) -> dict[str, Any]:
    """Task ``sync-cost``: :func:`mentor.lab.compare.compare` of :func:`sync_configs` on a DDP ResNet-18, on this rank.

    Sizes come from ``MENTOR_PROFILE`` (:func:`mentor.lab.env.get_profile`), and so do the interleaved rounds unless
    ``rounds`` is given; every rank uses the same seed, so all ranks run the configurations in the same order, as
    their collectives require.
    """
    from dataclasses import replace

    from torch.nn.parallel import DistributedDataParallel

    from mentor.lab.compare import compare
    from mentor.lab.data import device_batches
    from mentor.lab.env import get_profile
    from mentor.lab.train import build_setup

    profile = get_profile()
    rounds = profile.rounds if rounds is None else _int_at_least("rounds", rounds, 1)
    setup = build_setup(profile.num_classes, device, seed=seed)
    ids = [device.index] if device.type == "cuda" else None
    setup = replace(setup, model=DistributedDataParallel(setup.model, device_ids=ids))
    batches = device_batches(profile.batch_size, profile.image_size, profile.num_classes, device, seed=seed + rank)
    configs = sync_configs(profile.num_classes, device)
    comparison = compare(configs, setup, batches, steps=profile.steps, warmup=profile.warmup, rounds=rounds,
                         report_every=profile.report_every, progress=False, seed=seed)
    collectives = {c.name: collectives_per_report(c, setup, batches) for c in configs}
    return {"comparison": comparison.to_dict(), "collectives": collectives}


def placements(rank: int, world_size: int, device: torch.device, repeats: int = 20) -> list[dict[str, Any]]:
    """Task ``placements``: :func:`mentor.lab.ddp.placement_compute` for every placement that this backend allows."""
    from mentor.lab.ddp import PLACEMENTS, placement_compute

    names = [p for p in PLACEMENTS if p != "gpu" or device.type == "cuda"]
    return [placement_compute(rank, world_size, p, repeats) for p in names]


def _rounds_argument(text: str) -> int:
    try:
        return _int_at_least("--rounds", int(text), 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number of interleaved rounds >= 1, not {text!r}") from None


def _device(backend: str) -> torch.device:
    if "nccl" in backend:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m mentor.lab.worker`` under ``torchrun``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="torchrun --nproc-per-node=N -m mentor.lab.worker",
                                     description="one rank of a DDP measurement; writes OUT/rank<r>.json")
    parser.add_argument("task", choices=list(TASKS))
    parser.add_argument("--out", type=Path, required=True, help="folder for the per-rank JSON files")
    parser.add_argument("--backend", default=None, help="nccl, gloo or a device map (default: nccl with CUDA)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=_rounds_argument, default=None,
                        help="interleaved rounds of task sync-cost (default: the MENTOR_PROFILE's)")
    args = parser.parse_args(argv)
    if args.rounds is not None and args.task != "sync-cost":
        parser.error(f"--rounds applies to task sync-cost only, not {args.task}: leave it out.")
    missing = [k for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        parser.error(f"{', '.join(missing)} not set: start the worker with torchrun "
                     f"(torchrun --nproc-per-node=2 -m mentor.lab.worker {args.task} --out DIR), or mentor.lab.worker.run().")
    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    device = _device(backend)
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    try:
        if args.task == "agree":
            result: Any = agree(rank, world_size, device, seed=args.seed)
        elif args.task == "sync-cost":
            result = sync_cost(rank, world_size, device, seed=args.seed, rounds=args.rounds)
        else:
            result = placements(rank, world_size, device)
        args.out.mkdir(parents=True, exist_ok=True)
        record = {"task": args.task, "rank": rank, "world_size": world_size, "backend": backend,
                  "device": str(device), "result": result}
        (args.out / f"rank{rank}.json").write_text(json.dumps(record, indent=1))
    finally:
        dist.destroy_process_group()
    return 0


def run(task: str, nproc: int = 2, out: str | Path | None = None, backend: str | None = None, seed: int = 0,
        timeout: float = 600.0, rounds: int | None = None) -> list[dict[str, Any]]:
    """Start ``torchrun --standalone --nproc-per-node=nproc -m mentor.lab.worker task`` here; return each rank's record.

    Ranks' records are read from ``out`` (a temporary folder by default), rank 0 first. ``rounds`` sets the
    interleaved rounds of task ``sync-cost`` (``--rounds``; by default its ``MENTOR_PROFILE``'s); ``timeout`` is
    torchrun's, in seconds. A failed run raises ``RuntimeError`` with the end of torchrun's output.

    Example:
        >>> [r["result"]["batches"][:2] for r in run("agree", 2, backend="gloo")]   # doctest: +SKIP
        [[0, 2], [1, 3]]
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}: pass one of {list(TASKS)}.")
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be a whole number of processes >= 1, not {nproc!r}.")
    if rounds is not None:
        if task != "sync-cost":
            raise ValueError(f"rounds applies to task 'sync-cost' only, not {task!r}: leave it out.")
        _int_at_least("rounds", rounds, 1)
    with tempfile.TemporaryDirectory(prefix="mentor-worker-") as scratch:
        folder = Path(out) if out is not None else Path(scratch)
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                   "-m", "mentor.lab.worker", task, "--out", str(folder), "--seed", str(seed)]
        if backend is not None:
            command += ["--backend", backend]
        if rounds is not None:
            command += ["--rounds", str(rounds)]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
                   OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
            raise RuntimeError(f"torchrun of mentor.lab.worker {task} failed (exit {done.returncode}):\n{tail}")
        return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(nproc)]



def comparison_of(record: dict[str, Any]) -> Any:
    """The :class:`mentor.lab.comparison.Comparison` of one rank's ``sync-cost`` record, rebuilt from its JSON.

    Example:
        >>> from mentor.lab.comparison import Comparison
        >>> from mentor.lab.stats import Result
        >>> cmp = Comparison([Result("a", "", [[10.0], [20.0]]), Result("b", "", [[11.0], [22.0]])], "a", 1)
        >>> str(comparison_of({"task": "sync-cost", "result": {"comparison": cmp.to_dict()}}).overhead("b"))
        '+10.0 % [10.0, 10.0]'
    """
    from mentor.lab.comparison import Comparison

    if not isinstance(record, dict) or record.get("task") != "sync-cost":
        raise ValueError("comparison_of takes one rank's record of task 'sync-cost', as run('sync-cost') returns.")
    with tempfile.TemporaryDirectory(prefix="mentor-comparison-") as folder:
        path = Path(folder) / "comparison.json"
        path.write_text(json.dumps(record["result"]["comparison"]))
        return Comparison.load_json(path)


if __name__ == "__main__":
    sys.exit(main())
