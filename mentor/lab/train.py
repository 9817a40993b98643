"""The toy training setup (ResNet-18 with random weights) and a loop that times steps without syncing."""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torchvision
from tqdm import tqdm


@dataclass
class Setup:
    """Model, loss and optimizer of the toy problem, on one device."""

    model: torch.nn.Module
    criterion: torch.nn.Module
    optimizer: torch.optim.Optimizer
    device: torch.device
    autocast: torch.dtype | None = None
    """The dtype of ``torch.autocast`` around the forward pass and the loss, or None for none (fp32)."""
    channels_last: bool = False
    """Whether the model's weights and each step's images use the channels-last memory format."""


PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16}


def build_setup(num_classes: int = 1000, device: torch.device | str = "cpu", seed: int = 0,
                precision: str = "fp32", channels_last: bool = False) -> Setup:
    """ResNet-18 with random weights (nothing is downloaded), cross-entropy loss and SGD.

    ``precision="bf16"`` runs the forward pass and the loss under ``torch.autocast`` with
    bfloat16 (the weights and the optimizer stay fp32); ``channels_last=True`` stores the
    weights and the images in the channels-last memory format.

    Example:
        >>> setup = build_setup(num_classes=10)
        >>> type(setup.model).__name__, setup.device.type, setup.autocast
        ('ResNet', 'cpu', None)
        >>> build_setup(num_classes=10, precision="bf16", channels_last=True).autocast
        torch.bfloat16
    """
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes must be an int >= 2, got {num_classes!r}.")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}.")
    if not isinstance(channels_last, bool):
        raise ValueError(f"channels_last must be True or False, got {channels_last!r}.")
    device = torch.device(device)
    torch.manual_seed(seed)
    model = torchvision.models.resnet18(weights=None, num_classes=num_classes).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    return Setup(model=model, criterion=criterion, optimizer=optimizer, device=device,
                 autocast=PRECISIONS[precision], channels_last=channels_last)


@dataclass
class Step:
    """What a per-step hook sees after the optimizer step."""

    index: int
    images: torch.Tensor
    labels: torch.Tensor
    output: torch.Tensor
    loss: torch.Tensor
    host_seconds: float
    """Host wall-clock time since the previous step ended (perf_counter, no sync)."""


StepHook = Callable[[Step], None]
ReportHook = Callable[[int], None]


class _StepClock:
    """Step boundaries: CUDA events on the GPU (read once at the end), perf_counter on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[Any] = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def durations_ms(self) -> list[float]:
        if self.cuda:
            self.marks[-1].synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [(b - a) * 1000.0 for a, b in zip(self.marks, self.marks[1:])]


class RunStats:
    """Per-step times of one run, warm-up excluded, in milliseconds.

    On CUDA the step boundaries are events read only when ``step_ms`` is first used, so a
    ``sync_guard`` around ``train()`` sees the loop alone.
    """

    def __init__(self, clock: _StepClock | list[float], batch_size: int, device: str) -> None:
        if not isinstance(clock, (_StepClock, list)):
            raise TypeError(f"RunStats takes a list of step times in ms (or train()'s clock), "
                            f"not {type(clock).__name__}.")
        _check_count("batch_size", batch_size, 1)
        self._clock = clock
        self._step_ms: list[float] | None = _check_step_ms(list(clock)) if isinstance(clock, list) else None
        self.batch_size = batch_size
        self.device = device

    @property
    def step_ms(self) -> list[float]:
        """Time of each timed step (reading them waits for the GPU once)."""
        if self._step_ms is None:
            self._step_ms = _check_step_ms(self._clock.durations_ms())  # type: ignore[union-attr]
        return self._step_ms

    @property
    def median_ms(self) -> float:
        """Median step time."""
        return statistics.median(self.step_ms)

    @property
    def images_per_s(self) -> float:
        """Throughput from the median step time."""
        return self.batch_size * 1000.0 / self.median_ms

    def __repr__(self) -> str:
        return f"RunStats({len(self.step_ms)} steps, median {self.median_ms:.2f} ms, batch {self.batch_size})"


def _check_step_ms(values: list[Any]) -> list[float]:
    """The step times, or ValueError naming the first one that is not a finite number of milliseconds > 0."""
    if not values:
        raise ValueError("RunStats needs at least one step time; pass a list with one time in ms per timed step.")
    for index, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"step time {index} is {value!r}: each step time must be a finite number of "
                             "milliseconds > 0; pass the measured times (a NaN, negative or zero time is a "
                             "broken clock, not a measurement).")
    return [float(v) for v in values]


def _check_count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}.")
    return value


def train(
    setup: Setup,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    steps: int,
    *,
    warmup: int = 0,
    on_step: StepHook | None = None,
    on_report: ReportHook | None = None,
    report_every: int = 0,
    profiler: Any | None = None,
    progress: str | None = None,
) -> RunStats:
    """Run ``warmup + steps`` training steps and time the last ``steps`` of them.

    ``on_step`` gets a :class:`Step` after each optimizer step (update metrics there);
    ``on_report`` gets the 1-based step number every ``report_every`` steps (compute,
    log and reset there). The timer records CUDA events and reads them once after the
    loop, so it adds no host-device synchronization. ``profiler.step()`` is called after
    each step when a profiler is given. ``progress`` is a label: when set, a plain-text
    progress bar is printed at each quarter of the run.

    Example:
        >>> from mentor.lab.data import device_batches
        >>> setup = build_setup(num_classes=10)
        >>> stats = train(setup, device_batches(2, image_size=32, num_classes=10), steps=2, warmup=1)
        >>> len(stats.step_ms)
        2
    """
    if not isinstance(setup, Setup):
        raise TypeError(f"setup must be a mentor.lab.train.Setup from build_setup(), not {type(setup).__name__}.")
    _check_count("steps", steps, 1)
    _check_count("warmup", warmup, 0)
    _check_count("report_every", report_every, 0)
    if report_every and on_report is None:
        raise ValueError("report_every is set but on_report is None: pass a function that takes the step number.")
    for name, hook in (("on_step", on_step), ("on_report", on_report)):
        if hook is not None and not callable(hook):
            raise TypeError(f"{name} must be callable or None, not {type(hook).__name__}.")
    model, criterion, optimizer, device = setup.model, setup.criterion, setup.optimizer, setup.device
    memory_format = torch.channels_last if setup.channels_last else torch.preserve_format
    model.train()
    total = warmup + steps
    clock = _StepClock(device)
    bar = _Progress(progress, total) if progress else None
    iterator: Iterator = iter(batches)
    host_last = time.perf_counter()
    for index in range(total):
        if index == warmup:
            clock.mark()
        try:
            batch = next(iterator)
        except StopIteration:
            raise ValueError(
                f"batches ran out after {index} of {total} steps (warmup {warmup} + steps {steps}); pass an "
                "endless stream such as mentor.lab.data.device_batches(...) or a loader with enough batches."
            ) from None
        images, labels = _check_batch(index, batch)
        if setup.channels_last and images.dim() != 4:
            raise ValueError(f"batch of step {index} has images of shape {tuple(images.shape)}; channels_last needs "
                             "4-dim (N, C, H, W) images: pass image batches, or build_setup(channels_last=False).")
        images = images.to(device, non_blocking=True, memory_format=memory_format)
        labels = labels.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        if setup.autocast is None:
            output = model(images)
            loss = criterion(output, labels)
        else:
            with torch.autocast(device.type, dtype=setup.autocast):
                output = model(images)
                loss = criterion(output, labels)
        loss.backward()
        optimizer.step()
        now = time.perf_counter()
        if on_step is not None:
            on_step(Step(index, images, labels, output, loss, now - host_last))
        host_last = now
        if report_every and (index + 1) % report_every == 0:
            on_report(index + 1)  # type: ignore[misc]
        if index >= warmup:
            clock.mark()
        if profiler is not None:
            profiler.step()
        if bar is not None:
            bar.update(index + 1)
    return RunStats(clock, batch_size=int(images.shape[0]), device=str(device))


def _check_batch(index: int, batch: object) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images, labels)`` of step ``index``, or an error naming the step and what to pass."""
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2
            and all(isinstance(t, torch.Tensor) for t in batch)):
        raise TypeError(f"batch of step {index} is a {type(batch).__name__}, not an (images, labels) pair of "
                        "tensors; pass batches such as mentor.lab.data.device_batches(...) yields.")
    images, labels = batch
    if images.dim() == 0 or images.shape[0] == 0:
        raise ValueError(f"batch of step {index} has 0 images (images shape {tuple(images.shape)}); "
                         "pass non-empty batches (drop empty ones, or use drop_last=True in the DataLoader).")
    if labels.dim() == 0 or labels.shape[0] != images.shape[0]:
        raise ValueError(f"batch of step {index} has {images.shape[0]} images but labels of shape "
                         f"{tuple(labels.shape)}; pass one label per image.")
    return images, labels


class _Progress:
    """A progress bar printed as whole lines, so that it reads the same in a terminal and in the static book."""

    def __init__(self, label: str, total: int, parts: int = 4) -> None:
        self.label, self.total = label, total
        self.marks = sorted({max(1, round(total * k / parts)) for k in range(1, parts + 1)})
        self.start = time.perf_counter()

    def update(self, done: int) -> None:
        if done in self.marks:
            line = tqdm.format_meter(done, self.total, time.perf_counter() - self.start,
                                     ncols=72, prefix=self.label, ascii=True, unit="step")
            print(line, file=sys.stdout, flush=True)
