"""Sync-free variants of torchmetrics classes, and a host number a GPU metric can take without a sync.

- :func:`suppress_nan_check`: an aggregation metric (``MeanMetric``, ``SumMetric``, ...) whose
  update skips the NaN check, which reads a value back (a sync) on every update;
- :func:`scatter_stat_scores`: a multiclass stat-score metric (``MulticlassPrecision``, ...) that
  counts with ``scatter_add_`` instead of ``bincount``, which syncs twice per update on CUDA;
- :func:`multiclass_counts`: the per-class counts those metrics keep, computed with no sync;
- :func:`host_scalar`: a 0-dim CPU tensor for a host-side number (a step time, a learning rate),
  which a GPU metric takes as a kernel argument instead of through a blocking copy.

Example:
    >>> from torchmetrics import MeanMetric
    >>> loss_mean = suppress_nan_check(MeanMetric)()
    >>> loss_mean.update(torch.tensor(2.0), weight=torch.ones(()))
    >>> float(loss_mean.compute())
    2.0
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torchmetrics.aggregation import BaseAggregator
from torchmetrics.classification.stat_scores import MulticlassStatScores

from mentor._named import named_subclass
from mentor._static_states import _forward_or_restore, _unsync_on_error


def _derived(prefix: str, base: type, attrs: dict[str, Any], doc: str) -> type:
    """The subclass ``prefix + base.__name__`` of ``base``, a name of this module (see :func:`named_subclass`)."""
    return named_subclass(globals(), prefix, base, attrs, doc)


def __getattr__(name: str) -> type:
    """Make ``mentor.sync_free.NoNanCheckMeanMetric`` and ``ScatterMulticlassPrecision`` importable on demand.

    Unpickling a metric in a fresh process looks its class up by name before any factory ran.
    """
    import torchmetrics.aggregation
    import torchmetrics.classification

    for prefix, factory, module in (("NoNanCheck", "suppress_nan_check", torchmetrics.aggregation),
                                    ("Scatter", "scatter_stat_scores", torchmetrics.classification)):
        base = getattr(module, name[len(prefix):], None) if name.startswith(prefix) else None
        if isinstance(base, type):
            return globals()[factory](base)
    raise AttributeError(f"module 'mentor.sync_free' has no attribute {name!r}")


def suppress_nan_check(metric_cls: type[BaseAggregator]) -> type[BaseAggregator]:
    """A subclass of an aggregation metric whose updates skip the NaN check (and its syncs).

    The check calls ``bool(tensor.any())``, which waits for the GPU. The subclass still
    converts inputs to tensors and keeps the caller's weights; NaNs then flow into the
    result as ordinary arithmetic makes them. Since there is no check, there is no NaN policy:
    the subclass refuses a ``nan_strategy`` argument (and positional arguments, the first of
    which is ``nan_strategy`` for torchmetrics' aggregators). Calling this twice with one base
    returns the same class, ``mentor.sync_free.NoNanCheck<Base>``, which pickles.

    Example:
        >>> from torchmetrics import MeanMetric
        >>> m = suppress_nan_check(MeanMetric)()
        >>> m.update(torch.tensor([1.0, 3.0]), weight=torch.tensor([1.0, 3.0]))
        >>> float(m.compute())
        2.5
        >>> suppress_nan_check(MeanMetric) is type(m)
        True
    """
    if not (isinstance(metric_cls, type) and issubclass(metric_cls, BaseAggregator)):
        raise TypeError(
            "suppress_nan_check takes an aggregation metric class, a subclass of "
            "torchmetrics.aggregation.BaseAggregator such as MeanMetric or SumMetric, "
            f"not {metric_cls!r}."
        )

    def __init__(self: BaseAggregator, *args: Any, **kwargs: Any) -> None:
        if args or "nan_strategy" in kwargs:
            raise TypeError(
                f"{type(self).__name__} skips the NaN check, so a nan_strategy has no effect: pass keyword "
                f"arguments other than nan_strategy, or use {metric_cls.__name__} to keep a NaN policy."
            )
        metric_cls.__init__(self, **kwargs)

    def _cast_and_nan_check_input(
        self: BaseAggregator, x: float | torch.Tensor, weight: float | torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not isinstance(x, torch.Tensor):
            x = torch.as_tensor(x, dtype=self.dtype, device=self.device)
        if weight is None:
            weight = torch.ones_like(x)
        elif not isinstance(weight, torch.Tensor):
            weight = torch.as_tensor(weight, dtype=self.dtype, device=self.device)
        return x.to(self.dtype), weight.to(self.dtype)

    return _derived("NoNanCheck", metric_cls, {"__init__": __init__,
                                               "_cast_and_nan_check_input": _cast_and_nan_check_input},
                    f"{metric_cls.__name__} without the NaN check.")


def scatter_stat_scores(metric_cls: type[MulticlassStatScores]) -> type[MulticlassStatScores]:
    """A subclass of a multiclass stat-score metric that counts with ``scatter_add_`` instead of ``bincount``.

    ``torch.bincount`` on CUDA reads the input's minimum and maximum back to the host: two
    syncs per update for every macro-averaged Precision, Recall or F1. Counting per class with
    ``scatter_add_`` into a tensor of known size gives the same true/false positive and negative
    counts with no sync, for every ``average`` and with an ``ignore_index`` (which torchmetrics
    drops with boolean-mask indexing, a sync even on the micro path).

    Labels outside ``0 .. num_classes - 1`` (other than ``ignore_index``) would make
    ``scatter_add_`` fail with a device-side assert that breaks every later CUDA call. They are
    left out of the counts and counted on the device instead, and ``compute()`` raises a
    ``ValueError`` with their number (under DDP, their number over all ranks, on every rank, each
    left with its own states as after a successful compute). A ``forward`` that raises leaves the
    metric as it was before the call, as :class:`mentor.suite.FusedMetrics` does. ``top_k > 1``
    and ``multidim_average="samplewise"`` fall back to the torchmetrics update. The same base
    gives the same class, ``mentor.sync_free.Scatter<Base>``, which pickles.

    Example:
        >>> from torchmetrics.classification import MulticlassPrecision
        >>> m = scatter_stat_scores(MulticlassPrecision)(num_classes=3, validate_args=False)
        >>> m.update(torch.tensor([0, 1, 2, 2]), torch.tensor([0, 1, 1, 2]))
        >>> round(float(m.compute()), 4)
        0.8333
    """
    if not (isinstance(metric_cls, type) and issubclass(metric_cls, MulticlassStatScores)):
        raise TypeError(
            "scatter_stat_scores takes a multiclass stat-score metric class such as "
            "torchmetrics.classification.MulticlassPrecision (a MulticlassStatScores subclass), "
            f"not {metric_cls!r}. Accuracy(task='multiclass') is a factory: use MulticlassAccuracy."
        )

    def __init__(self: MulticlassStatScores, *args: Any, **kwargs: Any) -> None:
        metric_cls.__init__(self, *args, **kwargs)
        self.add_state("invalid_labels", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self: MulticlassStatScores, preds: torch.Tensor, target: torch.Tensor) -> None:
        if self.top_k != 1 or self.multidim_average != "global":
            return metric_cls.update(self, preds, target)
        if self.validate_args:
            from torchmetrics.functional.classification.stat_scores import (
                _multiclass_stat_scores_tensor_validation,
            )
            _multiclass_stat_scores_tensor_validation(preds, target, self.num_classes, self.multidim_average,
                                                      self.ignore_index)
        if preds.ndim == target.ndim + 1:
            preds = preds.argmax(dim=1)
        preds, target = preds.reshape(-1).long(), target.reshape(-1).long()
        tp, fp, tn, fn, invalid = multiclass_counts(preds, target, self.num_classes, self.ignore_index,
                                                    with_invalid=True)
        self.invalid_labels += invalid
        if self.average == "micro":
            tp, fp, tn, fn = tp.sum(), fp.sum(), tn.sum(), fn.sum()
        self._update_state(tp, fp, tn, fn)

    def compute(self: MulticlassStatScores) -> torch.Tensor:
        invalid = int(self.invalid_labels)  # one read-back per compute, none per update
        if invalid:
            raise ValueError(
                f"{invalid} prediction(s) or target(s) outside 0..{self.num_classes - 1} reached "
                f"{type(self).__name__} since its last reset and were left out of the counts; fix the labels, "
                f"or pass ignore_index=<the padding label> (now {self.ignore_index}) to skip them."
            )
        return metric_cls.compute(self)

    def _wrap_compute(self: MulticlassStatScores, compute: Callable[..., Any]) -> Callable[..., Any]:
        return _unsync_on_error(self, metric_cls._wrap_compute(self, compute))

    def forward(self: MulticlassStatScores, *args: Any, **kwargs: Any) -> Any:
        return _forward_or_restore(self, functools.partial(metric_cls.forward, self), *args, **kwargs)

    return _derived("Scatter", metric_cls, {"__init__": __init__, "update": update, "compute": compute,
                                            "_wrap_compute": _wrap_compute, "forward": forward},
                    f"{metric_cls.__name__} counting with scatter_add_, without a sync.")


def multiclass_counts(
    preds: torch.Tensor,
    target: torch.Tensor,
    num_classes: int,
    ignore_index: int | None = None,
    with_invalid: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Per-class true positives, false positives, true negatives and false negatives, with no sync.

    Positions whose target is ``ignore_index`` are left out. So are positions whose prediction
    or target lies outside ``0 .. num_classes - 1``; with ``with_invalid=True`` their number is
    returned as a fifth, 0-dim tensor (on the device: reading it is up to the caller).

    Example:
        >>> tp, fp, tn, fn = multiclass_counts(torch.tensor([0, 1, 1]), torch.tensor([0, 1, 0]), 2)
        >>> tp.tolist(), fp.tolist(), tn.tolist(), fn.tolist()
        ([1, 1], [0, 1], [1, 1], [1, 0])
        >>> multiclass_counts(torch.tensor([0, 1, 1]), torch.tensor([0, -100, 7]), 2, -100, with_invalid=True)[4]
        tensor(1)
    """
    if preds.shape != target.shape:
        raise ValueError(f"preds and target must have the same shape (class indices), got {tuple(preds.shape)} "
                         f"and {tuple(target.shape)}; argmax logits over the class dimension first.")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be an int >= 1, got {num_classes!r}.")
    keep = torch.ones_like(target, dtype=torch.bool) if ignore_index is None else target != ignore_index
    valid = (preds >= 0) & (preds < num_classes) & (target >= 0) & (target < num_classes)
    invalid = (keep & ~valid).sum()
    keep = keep & valid
    preds, target = preds.clamp(0, num_classes - 1), target.clamp(0, num_classes - 1)  # counted with weight 0
    hit = ((preds == target) & keep).long()
    miss = keep.long() - hit
    tp = torch.zeros(num_classes, dtype=torch.long, device=preds.device).scatter_add_(0, target, hit)
    fp = torch.zeros_like(tp).scatter_add_(0, preds, miss)
    fn = torch.zeros_like(tp).scatter_add_(0, target, miss)
    tn = keep.sum() - (tp + fp + fn)
    return (tp, fp, tn, fn, invalid) if with_invalid else (tp, fp, tn, fn)


def host_scalar(value: float | torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A 0-dim CPU tensor for updating a GPU metric with a host-side number, without a sync.

    A Python float becomes a tensor on the metric's device through a blocking copy; a 0-dim
    CPU tensor enters the GPU arithmetic as a kernel argument instead. The result is float32,
    or float64 when ``dtype`` is ``torch.float64`` or the input is float64 (a float64 tensor or
    a ``numpy.float64``). Python and numpy numbers of every width are accepted; a CUDA tensor is
    refused, because reading it on the host is itself a sync.

    Example:
        >>> host_scalar(0.25)
        tensor(0.2500)
        >>> host_scalar(0.25, dtype=torch.float64).dtype
        torch.float64
    """
    if dtype is not None and dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32, torch.float64 or None, got {dtype!r}.")
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            raise ValueError(
                f"host_scalar takes a number that lives on the host, and this tensor is on {value.device}: "
                "copying it to the host would wait for the GPU (a sync). Pass the tensor to the metric as it is."
            )
        if value.numel() != 1:
            raise ValueError(f"host_scalar takes one number, got a tensor of shape {tuple(value.shape)}.")
        wide = value.dtype == torch.float64
        return value.detach().to(dtype or (torch.float64 if wide else torch.float32)).reshape(())
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"host_scalar takes a Python or numpy number, not {type(value).__name__}.")
    wide = isinstance(value, np.floating) and np.dtype(type(value)).itemsize >= 8  # numpy's float64 and wider
    return torch.tensor(float(value), dtype=dtype or (torch.float64 if wide else torch.float32))
