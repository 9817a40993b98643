"""TorchMetrics helpers: sync-free metric variants, the article's metric sets, and TensorBoard logging."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torchmetrics import Accuracy, F1Score, MeanMetric, Metric, Precision, Recall
from torchmetrics.aggregation import BaseAggregator
from torchmetrics.classification.stat_scores import MulticlassStatScores


def suppress_nan_check(metric_cls: type[BaseAggregator]) -> type[BaseAggregator]:
    """A subclass of an aggregation metric whose updates skip the NaN check (and its syncs).

    The check calls ``bool(tensor.any())``, which waits for the GPU. The subclass still
    converts inputs to tensors and keeps the caller's weights; NaNs then flow into the
    result as ordinary arithmetic makes them.

    Example:
        >>> from torchmetrics import MeanMetric
        >>> m = suppress_nan_check(MeanMetric)()
        >>> m.update(torch.tensor([1.0, 3.0]), weight=torch.tensor([1.0, 3.0]))
        >>> float(m.compute())
        2.5
    """
    if not (isinstance(metric_cls, type) and issubclass(metric_cls, BaseAggregator)):
        raise TypeError(
            "suppress_nan_check takes an aggregation metric class, a subclass of "
            "torchmetrics.aggregation.BaseAggregator such as MeanMetric or SumMetric, "
            f"not {metric_cls!r}."
        )

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

    name = f"NoNanCheck{metric_cls.__name__}"
    return type(name, (metric_cls,), {"_cast_and_nan_check_input": _cast_and_nan_check_input,
                                      "__module__": __name__, "__doc__": f"{metric_cls.__name__} without the NaN check."})


def scatter_stat_scores(metric_cls: type[MulticlassStatScores]) -> type[MulticlassStatScores]:
    """A subclass of a multiclass stat-score metric that counts with ``scatter_add_`` instead of ``bincount``.

    ``torch.bincount`` on CUDA reads the input's minimum and maximum back to the host to
    size its output: two syncs per update for every macro-averaged Precision, Recall or F1.
    Counting per class with ``scatter_add_`` into a tensor of known size gives the same
    true/false positive and negative counts with no sync. Other settings (``top_k > 1``,
    ``samplewise``, an ``ignore_index``) fall back to the torchmetrics update.

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

    def update(self: MulticlassStatScores, preds: torch.Tensor, target: torch.Tensor) -> None:
        plain = self.top_k == 1 and self.multidim_average == "global" and self.ignore_index is None
        if not plain or self.average == "micro":
            return metric_cls.update(self, preds, target)
        if self.validate_args:
            from torchmetrics.functional.classification.stat_scores import (
                _multiclass_stat_scores_tensor_validation,
            )
            _multiclass_stat_scores_tensor_validation(preds, target, self.num_classes, self.multidim_average, None)
        if preds.ndim == target.ndim + 1:
            preds = preds.argmax(dim=1)
        preds, target = preds.reshape(-1).long(), target.reshape(-1).long()
        tp, fp, tn, fn = multiclass_counts(preds, target, self.num_classes)
        self._update_state(tp, fp, tn, fn)

    name = f"Scatter{metric_cls.__name__}"
    return type(name, (metric_cls,), {"update": update, "__module__": __name__,
                                      "__doc__": f"{metric_cls.__name__} counting with scatter_add_."})


def multiclass_counts(
    preds: torch.Tensor, target: torch.Tensor, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-class true positives, false positives, true negatives and false negatives, with no sync.

    Example:
        >>> tp, fp, tn, fn = multiclass_counts(torch.tensor([0, 1, 1]), torch.tensor([0, 1, 0]), 2)
        >>> tp.tolist(), fp.tolist(), tn.tolist(), fn.tolist()
        ([1, 1], [0, 1], [1, 1], [1, 0])
    """
    if preds.shape != target.shape:
        raise ValueError(f"preds and target must have the same shape (class indices), got {tuple(preds.shape)} "
                         f"and {tuple(target.shape)}; argmax logits over the class dimension first.")
    hit = (preds == target).long()
    miss = 1 - hit
    tp = torch.zeros(num_classes, dtype=torch.long, device=preds.device).scatter_add_(0, target, hit)
    fp = torch.zeros_like(tp).scatter_add_(0, preds, miss)
    fn = torch.zeros_like(tp).scatter_add_(0, target, miss)
    tn = target.numel() - (tp + fp + fn)
    return tp, fp, tn, fn


@dataclass
class MetricSet:
    """A dict of named metrics plus how the loss is fed to ``avg_loss``.

    ``loss_weight`` is ``None`` (no weight argument), ``"tensor"`` (``weight=torch.ones_like(loss)``,
    the article's first fix) or ``"float"`` (``weight=1.0``, what torchmetrics 1.6.1 did by default).
    """

    metrics: dict[str, Metric]
    loss_weight: str | None = None
    description: str = ""
    history: list[dict[str, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.loss_weight not in (None, "tensor", "float"):
            raise ValueError(f"loss_weight must be None, 'tensor' or 'float', got {self.loss_weight!r}.")

    def update(self, loss: torch.Tensor, output: torch.Tensor, target: torch.Tensor) -> None:
        """Feed one step: the loss to ``avg_loss``, logits and labels to the others."""
        for name, metric in self.metrics.items():
            if name == "avg_loss":
                if self.loss_weight == "tensor":
                    metric.update(loss, weight=torch.ones_like(loss))
                elif self.loss_weight == "float":
                    metric.update(loss, weight=1.0)
                else:
                    metric.update(loss)
            else:
                metric.update(output, target)

    def compute(self) -> dict[str, float]:
        """Compute every metric as a Python float (this reads values back: one sync per report)."""
        return {name: float(metric.compute()) for name, metric in self.metrics.items()}

    def reset(self) -> None:
        """Reset every metric."""
        for metric in self.metrics.values():
            metric.reset()

    def report(self, step: int) -> dict[str, float]:
        """Compute, remember (in ``history``) and reset; returns the values with their step."""
        values = {"step": float(step), **self.compute()}
        self.history.append(values)
        self.reset()
        return values


METRIC_SETS: dict[str, str] = {
    "naive": "the article's five metrics as first written: MeanMetric(loss) and multiclass Accuracy, "
             "Precision, Recall, F1 with their defaults",
    "float weight": "naive, but avg_loss.update(loss, weight=1.0): what torchmetrics 1.6.1 did by default",
    "tensor weight": "naive, but avg_loss.update(loss, weight=torch.ones_like(loss)): the article's first fix",
    "optimized": "the article's two fixes on avg_loss: an explicit tensor weight and no NaN check",
    "built-in": "torchmetrics' own switch instead of the subclass: MeanMetric(nan_strategy='disable')",
}


def metric_set(variant: str, num_classes: int = 1000, device: torch.device | str = "cpu") -> MetricSet:
    """One of the metric sets compared in the book, on ``device``. Variants: see ``METRIC_SETS``.

    The four classifiers are the same in every variant (``task="multiclass"``, micro
    averaging, the torchmetrics defaults); the variants differ in how the loss is averaged.

    Example:
        >>> ms = metric_set("optimized", num_classes=10)
        >>> sorted(ms.metrics)
        ['accuracy', 'avg_loss', 'f1_score', 'precision', 'recall']
    """
    if variant not in METRIC_SETS:
        raise ValueError(f"Unknown metric set {variant!r}: pass one of {list(METRIC_SETS)}.")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes must be an int >= 2, got {num_classes!r}.")
    kw: dict[str, Any] = dict(task="multiclass", num_classes=num_classes)
    avg_loss: Metric
    if variant in ("naive", "float weight", "tensor weight"):
        avg_loss = MeanMetric()
    elif variant == "built-in":
        avg_loss = MeanMetric(nan_strategy="disable")
    else:
        avg_loss = suppress_nan_check(MeanMetric)()
    metrics: dict[str, Metric] = {
        "avg_loss": avg_loss, "accuracy": Accuracy(**kw), "precision": Precision(**kw),
        "recall": Recall(**kw), "f1_score": F1Score(**kw),
    }
    metrics = {name: m.to(device) for name, m in metrics.items()}
    weight = {"float weight": "float", "tensor weight": "tensor", "optimized": "tensor"}.get(variant)
    return MetricSet(metrics, loss_weight=weight, description=METRIC_SETS[variant])


def host_scalar(value: float) -> torch.Tensor:
    """A 0-dim CPU tensor for updating a GPU metric with a host-side number, without a sync.

    A Python float becomes a tensor on the metric's device through a blocking copy; a 0-dim
    CPU tensor enters the GPU arithmetic as a kernel argument instead.

    Example:
        >>> host_scalar(0.25)
        tensor(0.2500)
    """
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"host_scalar takes one number, got a tensor of shape {tuple(value.shape)}.")
        return value.detach().to("cpu", torch.float32).reshape(())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"host_scalar takes a Python number, not {type(value).__name__}.")
    return torch.tensor(float(value), dtype=torch.float32)


def log_to_tensorboard(writer: Any, values: Mapping[str, float], step: int, prefix: str = "train/") -> None:
    """Write computed metric values as scalars to a ``torch.utils.tensorboard.SummaryWriter``.

    Example:
        >>> import tempfile
        >>> from torch.utils.tensorboard import SummaryWriter
        >>> with tempfile.TemporaryDirectory() as d:
        ...     w = SummaryWriter(d); log_to_tensorboard(w, {"accuracy": 0.5}, step=1); w.close()
    """
    if not hasattr(writer, "add_scalar"):
        raise TypeError(f"writer must be a SummaryWriter (with add_scalar), not {type(writer).__name__}.")
    for name, value in values.items():
        if name == "step":
            continue
        writer.add_scalar(prefix + name, float(value), global_step=int(step))


def read_tensorboard(logdir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Read the scalars back from the event files under ``logdir``: ``{tag: [(step, value), ...]}``.

    Example:
        >>> read_tensorboard("no-such-dir")
        Traceback (most recent call last):
        ...
        FileNotFoundError: no TensorBoard event files under 'no-such-dir'; pass the logdir given to SummaryWriter.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = Path(logdir)
    files = sorted(logdir.rglob("events.out.tfevents.*")) if logdir.is_dir() else []
    if not files:
        raise FileNotFoundError(
            f"no TensorBoard event files under '{logdir}'; pass the logdir given to SummaryWriter."
        )
    out: dict[str, list[tuple[int, float]]] = {}
    for directory in sorted({f.parent for f in files}):
        acc = EventAccumulator(str(directory), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return {tag: sorted(points) for tag, points in out.items()}


def plot_scalars(scalars: Mapping[str, list[tuple[int, float]]], axes: Any = None) -> Any:
    """One small line plot per tag of :func:`read_tensorboard`'s result; returns the axes.

    Example:
        >>> axes = plot_scalars({"train/avg_loss": [(1, 2.0), (2, 1.5)]})
    """
    import matplotlib.pyplot as plt

    if not scalars:
        raise ValueError("no scalars to plot: log some with log_to_tensorboard first.")
    if axes is None:
        _, axes = plt.subplots(1, len(scalars), figsize=(2.6 * len(scalars), 2.4), squeeze=False)
        axes = axes[0]
    for ax, (tag, points) in zip(axes, sorted(scalars.items())):
        steps, values = zip(*points)
        ax.plot(steps, values, marker="o", ms=3)
        ax.set_title(tag, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
    return axes
