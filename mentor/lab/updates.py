"""The metric updates the book measures, by the names its tables use, each built on one fixed batch.

:data:`UPDATES` maps each name to a builder ``build(inputs, device, num_classes)`` that makes the metric
and returns its update as a function of no arguments. :func:`mentor.lab.update_cost.update_costs` times them
(chapter 9, :func:`book_updates`) and :func:`mentor.lab.releases.measure` counts their syncs under each
torchmetrics release (chapter 13), where a builder that fails on an older release is recorded as such.

Example:
    >>> list(UPDATES)[:3]
    ['MeanMetric(loss)', 'MeanMetric, w=1.0', 'MeanMetric, w=tensor']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Inputs = dict[str, torch.Tensor]
"""One batch: ``logits``, ``target``, ``padded`` (``target`` with every eighth label -100) and ``loss``."""
Update = Callable[[], Any]
"""One metric update on fixed inputs, as a function of no arguments."""


def _mean(**options: Any) -> Callable[[Inputs, torch.device, int], Update]:
    def build(x: Inputs, device: torch.device, c: int) -> Update:
        from torchmetrics import MeanMetric

        m = MeanMetric(**{k: v for k, v in options.items() if k != "weight"}).to(device)
        if "weight" not in options:
            return lambda: m.update(x["loss"])
        weight = options["weight"]
        return lambda: m.update(x["loss"], weight=weight if weight != "tensor" else torch.ones_like(x["loss"]))
    return build


def _no_nan_check(x: Inputs, device: torch.device, c: int) -> Update:
    from torchmetrics import MeanMetric

    from mentor.sync_free import suppress_nan_check

    m = suppress_nan_check(MeanMetric)().to(device)
    ones = torch.ones_like(x["loss"])
    return lambda: m.update(x["loss"], weight=ones)


def _classifier(name: str, target: str = "target", **options: Any) -> Callable[[Inputs, torch.device, int], Update]:
    def build(x: Inputs, device: torch.device, c: int) -> Update:
        import torchmetrics

        m = getattr(torchmetrics, name)(task="multiclass", num_classes=c, **options).to(device)
        return lambda: m.update(x["logits"], x[target])
    return build


def _scatter(x: Inputs, device: torch.device, c: int) -> Update:
    from torchmetrics.classification import MulticlassPrecision

    from mentor.sync_free import scatter_stat_scores

    m = scatter_stat_scores(MulticlassPrecision)(c).to(device)
    return lambda: m.update(x["logits"], x["target"])


def _set(variant: str) -> Callable[[Inputs, torch.device, int], Update]:
    def build(x: Inputs, device: torch.device, c: int) -> Update:
        from mentor.lab.metric_sets import metric_set

        s = metric_set(variant, c, device)
        return lambda: s.update(x["loss"], x["logits"], x["target"])
    return build


def _suite(x: Inputs, device: torch.device, c: int) -> Update:
    from mentor.suite import FusedMetrics

    s = FusedMetrics(c).to(device)
    return lambda: s.update(x["loss"], x["logits"], x["target"])


def _grouped(x: Inputs, device: torch.device, c: int) -> Update:
    from torchmetrics import MetricCollection

    from mentor.lab.metric_sets import SCORES, score_metrics

    m = MetricCollection(score_metrics(c, "macro"), compute_groups=[list(SCORES)]).to(device)
    return lambda: m.update(x["logits"], x["target"])


def _suite_ignoring(x: Inputs, device: torch.device, c: int) -> Update:
    from mentor.suite import FusedMetrics

    s = FusedMetrics(c, ignore_index=-100).to(device)
    return lambda: s.update(x["loss"], x["logits"], x["padded"])


UPDATES: dict[str, Callable[[Inputs, torch.device, int], Update]] = {
    "MeanMetric(loss)": _mean(),
    "MeanMetric, w=1.0": _mean(weight=1.0),
    "MeanMetric, w=tensor": _mean(weight="tensor"),
    "MeanMetric, disable": _mean(nan_strategy="disable", weight="tensor"),
    "NoNanCheckMeanMetric": _no_nan_check,
    "Accuracy (micro)": _classifier("Accuracy"),
    "Precision (micro)": _classifier("Precision"),
    "Precision, ignore_idx": _classifier("Precision", target="padded", ignore_index=-100),
    "Precision (macro)": _classifier("Precision", average="macro"),
    "ScatterPrecision": _scatter,
    "naive set": _set("naive"),
    "optimized set": _set("optimized"),
    "macro set": _set("macro"),
    "macro sync-free set": _set("macro sync-free"),
    "macro, one group": _grouped,
    "FusedMetrics": _suite,
    "FusedMetrics, ignore": _suite_ignoring,
}
"""Every metric update the book measures, by the name its tables use: name -> builder of the update.

``Precision`` is multiclass precision (micro unless marked macro); ``ScatterPrecision`` is
``scatter_stat_scores(MulticlassPrecision)``, macro; ``w=`` is the weight passed to ``MeanMetric``;
``disable`` is ``nan_strategy="disable"`` (added after 1.6.1); ``ignore_idx`` and ``ignore`` use the
labels with every eighth one -100; the sets are :func:`mentor.lab.metric_sets.metric_set`'s; ``macro, one
group`` is a ``MetricCollection`` of the four macro classifiers with explicit compute groups."""


def update_inputs(device: torch.device, batch_size: int, num_classes: int, seed: int) -> Inputs:
    """One fixed batch for :data:`UPDATES`, drawn on the CPU from ``seed`` and moved to ``device``.

    Labels are drawn from ``0 .. num_classes - 1``; ``padded`` marks every eighth one -100.

    Example:
        >>> x = update_inputs("cpu", 16, 10, 0)
        >>> sorted(x), x["padded"][::8].tolist()
        (['logits', 'loss', 'padded', 'target'], [-100, -100])
    """
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch_size, num_classes, generator=gen)
    target = torch.randint(0, num_classes, (batch_size,), generator=gen)
    padded = target.clone()
    padded[::8] = -100
    loss = torch.rand((), generator=gen)
    return {k: v.to(device) for k, v in dict(logits=logits, target=target, padded=padded, loss=loss).items()}


def book_updates(device: torch.device | str, batch_size: int = 32, num_classes: int = 1000,
                 seed: int = 0) -> dict[str, Update]:
    """Every update of :data:`UPDATES`, built on ``device`` and closed over one fixed batch (:func:`update_inputs`).

    Example:
        >>> updates = book_updates("cpu", 4, 10)
        >>> list(updates)[:2], updates["FusedMetrics"]()
        (['MeanMetric(loss)', 'MeanMetric, w=1.0'], None)
    """
    device = torch.device(device)
    x = update_inputs(device, batch_size, num_classes, seed)
    return {name: build(x, device, num_classes) for name, build in UPDATES.items()}
