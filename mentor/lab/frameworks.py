"""The book's training step run by PyTorch Lightning and by Hugging Face Accelerate, with metrics the documented way
or with the suite, timed in short alternating blocks (the chapter on frameworks).

Each framework gets its own :class:`mentor.lab.comparison.Comparison`, with its own baseline (the framework's loop
without metrics) and an A/A run of that baseline:

- Lightning (``LIGHTNING_WAYS``): a ``LightningModule`` whose ``training_step`` calls a torchmetrics
  ``MetricCollection`` and hands the batch's values and the loss to ``self.log_dict(..., on_step=True,
  prog_bar=True)``; or one that updates a :class:`mentor.suite.FusedMetrics` and reports it with
  :class:`mentor.lightning.LogEvery`. A block is one ``Trainer.fit`` with a new ``Trainer`` (no logger, no progress
  bar, no checkpoints); the module, its metrics and the callback are kept for the whole comparison.
- Accelerate (``ACCELERATE_WAYS``): a loop over ``accelerator.prepare``'d model and optimizer with
  ``accelerator.backward``; the batch's logits and labels go through ``accelerator.gather_for_metrics`` into the
  same ``MetricCollection`` at every step, read back with ``.item()`` at each report; or the suite, reported through
  :class:`mentor.readback.DeferredReadback`.

A block runs ``settle`` untimed batches, ``steps`` timed ones and one more batch, whose start closes the last timed
step: a step's time runs from the start of one batch to the start of the next (CUDA events on the GPU), so it holds
all that the framework does between batches. Each block reports once, at timed position ``steps // 2``: the report
and the step after it are timed, and reports come every ``settle + steps + 1`` batches. ``LogEvery`` also reports
when each fit ends (the batches since its last report), after the block's last timed step: that report is not timed.

Example:
    >>> from mentor.lab.configs import OperatingPoint
    >>> from mentor.lab.env import get_profile
    >>> out = compare_frameworks(OperatingPoint("tiny", 2, 16), get_profile("smoke").with_(num_classes=10),
    ...                          rounds=2, steps=3, settle=1, warmup_blocks=0, count_syncs=False)
    >>> list(out), out["Lightning"].baseline, out["Accelerate"].rounds
    (['Lightning', 'Accelerate'], 'no metrics', 2)
"""

from __future__ import annotations

import contextlib
import logging
import random
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import Any

import torch
import torch.nn.functional as F
from torchmetrics import MetricCollection

from mentor.lab.blocks import _int_at_least
from mentor.lab.comparison import Comparison
from mentor.lab.configs import OperatingPoint, point_setup
from mentor.lab.env import Profile, environment_report
from mentor.lab.metric_sets import metric_set
from mentor.lab.stats import CPU_NOTE, NOT_COUNTED, Result
from mentor.lab.train import _StepClock
from mentor.readback import DeferredReadback
from mentor.suite import FusedMetrics

LIGHTNING_WAYS = ("no metrics", "no metrics again", "self.log per step", "suite, LogEvery")
"""The Lightning configurations, the baseline first."""
ACCELERATE_WAYS = ("no metrics", "no metrics again", "gather_for_metrics", "suite, readback")
"""The Accelerate configurations, the baseline first."""
FRAMEWORKS = {"Lightning": LIGHTNING_WAYS, "Accelerate": ACCELERATE_WAYS}

DESCRIPTIONS = {
    ("Lightning", "no metrics"): "training_step returns the loss; nothing logged",
    ("Lightning", "no metrics again"): "the same, a second time (A/A)",
    ("Lightning", "self.log per step"): "MetricCollection called each step; log_dict(on_step=True, prog_bar=True)",
    ("Lightning", "suite, LogEvery"): "FusedMetrics.update in training_step; LogEvery callback",
    ("Accelerate", "no metrics"): "prepare(model, optimizer), accelerator.backward; no metrics",
    ("Accelerate", "no metrics again"): "the same, a second time (A/A)",
    ("Accelerate", "gather_for_metrics"): "gather_for_metrics each step, MetricCollection.update; .item() at reports",
    ("Accelerate", "suite, readback"): "FusedMetrics.update each step; compute and DeferredReadback at reports",
}


def torchmetrics_collection(num_classes: int) -> MetricCollection:
    """The metrics of the documented ways: accuracy, precision, recall and F1 with torchmetrics' defaults
    (``task="multiclass"``, micro average), in a ``MetricCollection`` with its default ``compute_groups``.

    Example:
        >>> list(torchmetrics_collection(10))
        ['accuracy', 'f1_score', 'precision', 'recall']
    """
    return metric_set("naive", num_classes, compute_groups=True).scores


def _images(images: torch.Tensor, channels_last: bool) -> torch.Tensor:
    return images.contiguous(memory_format=torch.channels_last) if channels_last else images


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Lightning's and Accelerate's info lines and warnings about the setup (no workers, no logger), silenced
    for the measurement and restored after it."""
    before = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(before)


# ---- Lightning ---------------------------------------------------------------------------------------------------

def _lightning_runner(way: str, model: torch.nn.Module, num_classes: int, point: OperatingPoint, device: torch.device,
                      report_batches: int) -> Callable[[Any, int, list[Any]], None]:
    """A function ``run(batches, n, callbacks)`` that fits ``n`` batches with a new Trainer and this way's module."""
    import lightning as L

    from mentor.lightning import LogEvery

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.scores = torchmetrics_collection(num_classes) if way == "self.log per step" else None
            self.suite = FusedMetrics(num_classes) if way == "suite, LogEvery" else None

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            images, labels = batch
            logits = self.model(_images(images, point.channels_last))
            loss = F.cross_entropy(logits, labels)
            if self.scores is not None:  # the documented way: the batch's values, logged every step
                self.log("loss", loss, on_step=True, prog_bar=True)
                self.log_dict(self.scores(logits, labels), on_step=True, prog_bar=True)
            if self.suite is not None:
                self.suite.update(loss.detach(), logits.detach(), labels)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    module = Module()
    extra = [LogEvery(module.suite, every=report_batches)] if module.suite is not None else []
    precision = "bf16-mixed" if point.precision == "bf16" else "32-true"

    def run(batches: Any, n: int, callbacks: list[Any]) -> None:
        trainer = L.Trainer(accelerator="gpu" if device.type == "cuda" else "cpu", devices=1, precision=precision,
                            max_steps=n, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, num_sanity_val_steps=0, callbacks=[*callbacks, *extra])
        trainer.fit(module, train_dataloaders=batches)

    run.module = module  # type: ignore[attr-defined]
    return run


def _lightning_marks(first: int, on_batch: Callable[[int], None]) -> Any:
    """A callback that calls ``on_batch(batch_idx)`` at the start of every batch from ``first`` on."""
    from lightning.pytorch.callbacks import Callback

    class Marks(Callback):
        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if batch_idx >= first:
                on_batch(batch_idx)

    return Marks()


# ---- Accelerate --------------------------------------------------------------------------------------------------

def _accelerate_runner(way: str, model: torch.nn.Module, num_classes: int, point: OperatingPoint,
                       device: torch.device, every: int) -> Callable[[Any, int, list[Any]], None]:
    """A function ``run(batches, n, callbacks)`` that trains ``n`` batches in an Accelerate loop; each callback is
    called with the batch's index at its start, and the loop reports after every ``every``-th batch it has run."""
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="bf16" if point.precision == "bf16" else "no",
                              cpu=device.type != "cuda")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    net, optimizer = accelerator.prepare(model, optimizer)
    scores = torchmetrics_collection(num_classes).to(accelerator.device) if way == "gather_for_metrics" else None
    suite = FusedMetrics(num_classes).to(accelerator.device) if way == "suite, readback" else None
    readback = DeferredReadback()
    count = [0]  # batches so far, over every block
    logged: list[Any] = [None]  # the reading logged last

    def run(batches: Any, n: int, callbacks: list[Any]) -> None:
        it = iter(batches)
        for index in range(n):
            for mark in callbacks:
                mark(index)
            images, labels = next(it)
            optimizer.zero_grad(set_to_none=True)
            logits = net(_images(images, point.channels_last))
            loss = F.cross_entropy(logits, labels)
            accelerator.backward(loss)
            optimizer.step()
            count[0] += 1
            report = count[0] % every == 0
            if scores is not None:
                preds, targets = accelerator.gather_for_metrics((logits.detach(), labels))
                scores.update(preds, targets)
                if report:
                    values = {k: v.item() for k, v in scores.compute().items()}
                    accelerator.log(values, step=count[0])
                    scores.reset()
            if suite is not None:
                suite.update(loss.detach(), logits.detach(), labels)
                if report:
                    readback.push(suite.compute(), step=count[0])
                    suite.reset()
                reading = readback.latest()
                if reading is not None and reading is not logged[0]:
                    accelerator.log(dict(reading.values), step=reading.step)
                    logged[0] = reading

    run.accelerator, run.suite, run.scores = accelerator, suite, scores  # type: ignore[attr-defined]
    return run


# ---- the comparison ----------------------------------------------------------------------------------------------

def compare_frameworks(point: OperatingPoint, profile: Profile, *, rounds: int, steps: int = 16, settle: int = 3,
                       warmup_blocks: int = 1, count_syncs: bool = True, seed: int = 0,
                       frameworks: tuple[str, ...] = ("Lightning", "Accelerate")) -> dict[str, Comparison]:
    """Time each framework's configurations at ``point`` in ``rounds`` rounds of one block each (order shuffled
    anew every round), after ``warmup_blocks`` untimed blocks of each; one :class:`Comparison` per framework.

    Every configuration has its own ResNet-18 built from the same seed (``point_setup``), and the same batches.
    ``settings`` records ``orders``, ``block``, ``settle``, ``steps``, ``report_every`` (batches between
    reports) and ``report_at`` (the timed position of each block's report); with ``count_syncs`` on CUDA,
    ``syncs_per_step`` and ``report_syncs`` come from :func:`mentor.syncs.sync_guard` over one more block, and
    ``settings["sync_sites"]`` holds, per configuration, each ``file:line`` of a sync with its count in that block;
    ``settings["trace_syncs"]`` holds, per configuration, the sync calls in each timed batch of one more block run
    under the PyTorch profiler (:func:`mentor.lab.profiling.step_syncs`, whose docstring says what it cannot see).
    """
    if not isinstance(point, OperatingPoint):
        raise TypeError(f"point must be an OperatingPoint, e.g. OPERATING_POINTS[0], not {type(point).__name__}.")
    if not isinstance(profile, Profile):
        raise TypeError(f"profile must be a mentor.lab.env.Profile from get_profile(), not {type(profile).__name__}.")
    _int_at_least("rounds", rounds, 1)
    _int_at_least("steps", steps, 2)
    _int_at_least("settle", settle, 0)
    _int_at_least("warmup_blocks", warmup_blocks, 0)
    if isinstance(frameworks, str) or not frameworks or any(f not in FRAMEWORKS for f in frameworks):
        raise ValueError(f"frameworks must be a non-empty tuple drawn from {tuple(FRAMEWORKS)}, got {frameworks!r}.")
    report_at = steps // 2  # timed position of each block's report
    block = settle + steps + 1  # batches per block: the last one's start closes the last timed step
    out: dict[str, Comparison] = {}
    with _quiet():
        for framework in frameworks:
            out[framework] = _compare_one(framework, point, profile, rounds=rounds, steps=steps, settle=settle,
                                          block=block, report_at=report_at, warmup_blocks=warmup_blocks,
                                          count_syncs=count_syncs, seed=seed)
    return out


def _compare_one(framework: str, point: OperatingPoint, profile: Profile, *, rounds: int, steps: int, settle: int,
                 block: int, report_at: int, warmup_blocks: int, count_syncs: bool, seed: int) -> Comparison:
    runners: dict[str, Callable[[Any, int, list[Any]], None]] = {}
    batches = None
    device = profile.device
    if framework == "Accelerate":
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)  # a new precision needs a new state
    try:
        for way in FRAMEWORKS[framework]:
            setup, stream = point_setup(point, profile)  # the same seed: the same weights for every configuration
            batches = batches if batches is not None else stream
            if framework == "Lightning":
                runners[way] = _lightning_runner(way, setup.model, profile.num_classes, point, device, block)
            else:
                runners[way] = _accelerate_runner(way, setup.model, profile.num_classes, point, device, block)
        return _time(framework, runners, batches, rounds=rounds, steps=steps, settle=settle, block=block,
                     report_at=report_at, warmup_blocks=warmup_blocks, count_syncs=count_syncs, seed=seed,
                     point=point, cuda=device.type == "cuda")
    finally:
        if framework == "Accelerate":
            AcceleratorState._reset_state(reset_partial_state=True)


def _mark_callback(framework: str, first: int, on_batch: Callable[[int], None]) -> Any:
    if framework == "Lightning":
        return _lightning_marks(first, on_batch)

    def mark(index: int) -> None:
        if index >= first:
            on_batch(index)

    return mark


def _time(framework: str, runners: dict[str, Callable[[Any, int, list[Any]], None]], batches: Any, *, rounds: int,
          steps: int, settle: int, block: int, report_at: int, warmup_blocks: int, count_syncs: bool, seed: int,
          point: OperatingPoint, cuda: bool) -> Comparison:
    device = torch.device("cuda" if cuda else "cpu")
    # Line the reports up: the first report comes after `block` batches, counted from here, so a lead-in of
    # steps - report_at batches puts it, and every later one, at timed position report_at of a block.
    for run in runners.values():
        run(batches, steps - report_at + warmup_blocks * block, [])
    rng = random.Random(seed)
    names = list(runners)
    per_round: dict[str, list[list[float]]] = {n: [] for n in names}
    orders: list[list[str]] = []
    for _ in range(rounds):
        order = names[:]
        rng.shuffle(order)
        clocks = {}
        for way in order:
            clock = _StepClock(device)
            runners[way](batches, block, [_mark_callback(framework, settle, lambda i, c=clock: c.mark())])
            clocks[way] = clock
        for way in order:
            per_round[way].append(clocks[way].durations_ms())
        orders.append(order)
    sites: dict[str, dict[str, int]] = {}
    traced: dict[str, list[int]] = {}
    results = []
    for way in names:
        name = way
        syncs = report_syncs = note = None
        if not count_syncs:
            note = NOT_COUNTED
        elif not cuda:
            note = CPU_NOTE
        else:
            syncs, report_syncs, sites[name] = _count(framework, runners[way], batches, settle, steps, report_at)
            traced[name] = _trace_counts(framework, runners[way], batches, settle, steps)
        results.append(Result(name, DESCRIPTIONS[framework, way], per_round[way], [report_at], syncs, report_syncs, note))
    images, _ = next(iter(batches))
    settings = dict(design="blocks", framework=framework, block=block, settle=settle, steps=steps, warmup=settle,
                    rounds=rounds, report_every=block, report_at=report_at, warmup_blocks=warmup_blocks, seed=seed,
                    orders=orders, sync_sites=sites, trace_syncs=traced, point=asdict(point))
    return Comparison(results, baseline=names[0], batch_size=int(images.shape[0]),
                      settings=settings, environment=environment_report())


def _count(framework: str, run: Callable[[Any, int, list[Any]], None], batches: Any, settle: int, steps: int,
           report_at: int) -> tuple[float, float, dict[str, int]]:
    """One more block under :func:`mentor.syncs.sync_guard`, one guard per timed batch (from the start of one batch
    to the start of the next): the mean syncs of a batch that does not report, those of the report batch, and
    every sync's ``file:line`` with its count over the timed batches."""
    from mentor.syncs import sync_guard

    counts: list[int] = []
    lines: dict[str, int] = {}
    stack = contextlib.ExitStack()
    open_report: list[Any] = []

    def on_batch(index: int) -> None:
        if open_report:
            report = open_report.pop()
            stack.close()
            counts.append(report.count)
            for where, n in report.by_line().items():
                lines[where] = lines.get(where, 0) + n
        if index < settle + steps:
            open_report.append(stack.enter_context(sync_guard()))

    try:
        run(batches, settle + steps + 1, [_mark_callback(framework, settle, on_batch)])
    finally:
        stack.close()
    plain = [c for k, c in enumerate(counts) if k != report_at]
    per_step = sum(plain) / len(plain)
    return per_step, max(0.0, counts[report_at] - per_step), lines


def _trace_counts(framework: str, run: Callable[[Any, int, list[Any]], None], batches: Any, settle: int,
                  steps: int) -> list[int]:
    """One more block under the PyTorch profiler, one ``ProfilerStep`` window per timed batch (from the start of one
    batch to the start of the next): the sync calls the trace shows in each window."""
    from torch.profiler import ProfilerActivity, profile, schedule

    from mentor.lab.profiling import step_syncs

    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/block.json"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        with profile(activities=activities,
                     schedule=schedule(wait=0, warmup=settle, active=steps, repeat=1),
                     on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
            run(batches, settle + steps + 1, [_mark_callback(framework, 1, lambda i: prof.step())])
        return [s.count for s in step_syncs(path)]
