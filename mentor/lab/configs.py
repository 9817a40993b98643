"""The configurations the book compares: named ways of running the training loop, and its operating points.

A :class:`Config` makes fresh ``(on_step, on_report)`` hooks for :func:`mentor.lab.train.train`;
:func:`catalogue` and :func:`available_configs` hold every configuration the chapters measure, by name.
An :class:`OperatingPoint` is one training regime (batch, image size, precision, memory format).

Example:
    >>> from mentor.lab.env import get_profile
    >>> list(available_configs(get_profile("smoke")))[:3]
    ['no metrics', 'naive', 'float weight']
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from mentor.lab.env import Profile
from mentor.lab.metric_sets import ARTICLE_SETS, METRIC_SETS, metric_set
from mentor.lab.train import ReportHook, Setup, StepHook, build_setup

Hooks = tuple[StepHook | None, ReportHook | None]
"""What ``Config.make`` returns: the step hook and the report hook, either of them None."""


@dataclass
class Config:
    """A named way of running the training loop: ``make()`` returns fresh ``(on_step, on_report)`` hooks.

    Example:
        >>> Config("no metrics").make()
        (None, None)
    """

    name: str
    make: Callable[[], Hooks] = lambda: (None, None)
    description: str = ""
    batches: Iterable | None = None
    """Data for this configuration only; ``None`` uses the batches given to :func:`mentor.lab.compare.compare`."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Config name must be a non-empty string, got {self.name!r}.")
        if not callable(self.make):
            raise TypeError(f"Config.make must be a function returning (on_step, on_report), not {self.make!r}.")


def metrics_config(variant: str, num_classes: int, device: torch.device | str, name: str | None = None,
                   **options: Any) -> Config:
    """A :class:`Config` that updates one of ``mentor.lab.metric_sets.METRIC_SETS`` every step and reports periodically.

    ``options`` (``compute_groups``, ``forward``) go to :func:`mentor.lab.metric_sets.metric_set`.

    Example:
        >>> cfg = metrics_config("naive", num_classes=10, device="cpu")
        >>> on_step, on_report = cfg.make()
        >>> callable(on_step), callable(on_report)
        (True, True)
    """
    if variant not in METRIC_SETS:
        raise ValueError(f"Unknown metric set {variant!r}: pass one of {list(METRIC_SETS)}.")
    unknown = set(options) - {"compute_groups", "forward"}
    if unknown:
        raise TypeError(f"metrics_config got unknown option(s) {sorted(unknown)}; it takes compute_groups and forward.")
    metric_set(variant, num_classes=2, **options)  # check the options now, not in the first run

    def make() -> Hooks:
        ms = metric_set(variant, num_classes=num_classes, device=device, **options)
        return (lambda s: ms.update(s.loss, s.output, s.labels)), ms.report

    return Config(name or variant, make, METRIC_SETS[variant])


def suite_config(num_classes: int, device: torch.device | str, name: str = "fused suite") -> Config:
    """A :class:`Config` that updates one :class:`mentor.suite.FusedMetrics` every step and, at each report,
    computes every value, reads them back in one copy and resets.

    Example:
        >>> on_step, on_report = suite_config(10, "cpu").make()
        >>> callable(on_step), callable(on_report)
        (True, True)
    """
    from mentor.suite import FusedMetrics

    def make() -> Hooks:
        suite = FusedMetrics(num_classes).to(device)

        def on_report(_: int) -> None:
            # compute() reads nothing back; the values, its count of invalid labels too, come back in one copy
            torch.stack(list(suite.compute().values())).tolist()
            suite.reset()

        return (lambda s: suite.update(s.loss, s.output, s.labels)), on_report

    return Config(name, make, "mentor.suite.FusedMetrics: the loss mean and every score in one update per step")


def step_time_config(name: str, device: str, update: str, sync_on_compute: bool = True) -> Config:
    """A :class:`Config` that averages the host-measured step time in a ``MeanMetric`` on ``device``.

    ``update`` is ``"float"`` (``metric.update(seconds)``) or ``"tensor"`` (a 0-dim CPU tensor,
    :func:`mentor.sync_free.host_scalar`).

    Example:
        >>> step_time_config("cpu", "cpu", "float").make()[0] is not None
        True
    """
    from torchmetrics import MeanMetric

    from mentor.sync_free import host_scalar

    if update not in ("float", "tensor"):
        raise ValueError(f"update must be 'float' or 'tensor', got {update!r}.")

    def make() -> Hooks:
        metric = MeanMetric(sync_on_compute=sync_on_compute).to(device)
        convert = host_scalar if update == "tensor" else float

        def on_step(step: Any) -> None:
            metric.update(convert(step.host_seconds))

        def on_report(_: int) -> None:
            metric.compute()
            metric.reset()

        return on_step, on_report

    where = "GPU" if str(device).startswith("cuda") else "CPU"
    return Config(name, make, f"MeanMetric of the step time on the {where}, updated with a {update}")


def catalogue(profile: Profile) -> dict[str, Config]:
    """Every configuration part I of the book measures, by name; its chapters pick from it and its summary runs
    them all.

    Example:
        >>> from mentor.lab.env import get_profile
        >>> list(catalogue(get_profile("smoke")))[:3]
        ['no metrics', 'naive', 'float weight']
    """
    device = profile.device
    configs = [Config("no metrics", description="the training step alone")]
    configs += [metrics_config(v, profile.num_classes, device) for v in ARTICLE_SETS]
    configs += [
        step_time_config("step time: CPU", "cpu", "float"),
        step_time_config("step time: GPU float", str(device), "float"),
        step_time_config("step time: GPU tensor", str(device), "tensor"),
    ]
    return {c.name: c for c in configs}


DEFAULT_CONFIGS = ("no metrics", "naive", "optimized")
"""The article's comparison, and what ``python -m mentor.lab.bench`` runs without ``--configs``."""


def article_configs(profile: Profile) -> list[Config]:
    """The article's comparison (``DEFAULT_CONFIGS``): no metrics, the naive set and the optimized set.

    Example:
        >>> from mentor.lab.env import get_profile
        >>> [c.name for c in article_configs(get_profile("smoke"))]
        ['no metrics', 'naive', 'optimized']
    """
    cat = catalogue(profile)
    return [cat[name] for name in DEFAULT_CONFIGS]


def available_configs(profile: Profile) -> dict[str, Config]:
    """What ``python -m mentor.lab.bench --configs`` can run: :func:`catalogue`, the macro sets and the fused suite.

    Example:
        >>> from mentor.lab.env import get_profile
        >>> list(available_configs(get_profile("smoke")))[-3:]
        ['macro', 'macro sync-free', 'fused suite']
    """
    extra = [metrics_config(v, profile.num_classes, profile.device) for v in METRIC_SETS if v not in ARTICLE_SETS]
    extra.append(suite_config(profile.num_classes, profile.device))
    return {**catalogue(profile), **{c.name: c for c in extra}}


SWEEP_CONFIGS = ("no metrics", "naive", "optimized", "macro", "macro sync-free", "fused suite")
"""The configurations part II compares at every operating point."""


@dataclass(frozen=True)
class OperatingPoint:
    """One training regime: batch size, image size, precision and memory format of the ResNet-18 step.

    Example:
        >>> OperatingPoint("bf16 b32", 32, precision="bf16", channels_last=True).label
        'bf16 b32: batch 32, 224 px, bf16, channels-last'
    """

    name: str
    batch_size: int
    image_size: int = 224
    precision: str = "fp32"
    channels_last: bool = False

    def __post_init__(self) -> None:
        for label in ("batch_size", "image_size"):
            value = getattr(self, label)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"OperatingPoint.{label} must be an int >= 1, got {value!r}.")
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(f"OperatingPoint.precision must be 'fp32' or 'bf16', got {self.precision!r}.")

    @property
    def label(self) -> str:
        """The name and every setting, for tables and legends."""
        layout = ", channels-last" if self.channels_last else ""
        return f"{self.name}: batch {self.batch_size}, {self.image_size} px, {self.precision}{layout}"


OPERATING_POINTS = (
    OperatingPoint("fp32 b128", 128),
    OperatingPoint("fp32 b64", 64),
    OperatingPoint("fp32 b32", 32),
    OperatingPoint("bf16 b128", 128, precision="bf16", channels_last=True),
    OperatingPoint("bf16 b32", 32, precision="bf16", channels_last=True),
    OperatingPoint("bf16 b32 96px", 32, 96, precision="bf16", channels_last=True),
)
"""Part II's operating points: the article's step, then shorter ones (smaller batches, bf16 with channels-last,
smaller images)."""


def operating_points(profile: Profile) -> tuple[OperatingPoint, ...]:
    """``OPERATING_POINTS`` on a CUDA profile; on the CPU smoke profile the same points shrunk to its sizes
    (batch at most the profile's, the profile's image size), so that the code runs in seconds.

    Example:
        >>> from mentor.lab.env import get_profile
        >>> [(p.batch_size, p.image_size) for p in operating_points(get_profile("smoke"))][:2]
        [(8, 32), (8, 32)]
    """
    if profile.is_cuda:
        return OPERATING_POINTS
    return tuple(OperatingPoint(p.name, min(p.batch_size, profile.batch_size), profile.image_size, p.precision,
                                p.channels_last) for p in OPERATING_POINTS)


def point_setup(point: OperatingPoint, profile: Profile) -> tuple[Setup, Iterable]:
    """A fresh model for ``point`` (its precision and memory format) and endless batches of its size, on the
    profile's device with the profile's number of classes.

    Example:
        >>> from mentor.lab.env import get_profile
        >>> setup, batches = point_setup(OperatingPoint("tiny", 2, 32), get_profile("smoke").with_(num_classes=10))
        >>> tuple(next(iter(batches))[0].shape), setup.autocast
        ((2, 3, 32, 32), None)
    """
    from mentor.lab.data import device_batches

    if not isinstance(point, OperatingPoint):
        raise TypeError(f"point must be an OperatingPoint, e.g. OPERATING_POINTS[0], not {type(point).__name__}.")
    setup = build_setup(profile.num_classes, profile.device, precision=point.precision,
                        channels_last=point.channels_last)
    return setup, device_batches(point.batch_size, point.image_size, profile.num_classes, profile.device)
