"""TorchMetrics helpers: sync-free metric variants, the book's metric sets, one-copy read-back, TensorBoard logging."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchmetrics import Accuracy, F1Score, MeanMetric, Metric, MetricCollection, Precision, Recall
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score, MulticlassPrecision, MulticlassRecall
from torchmetrics.aggregation import BaseAggregator
from torchmetrics.classification.stat_scores import MulticlassStatScores


_DERIVED: dict[tuple[str, type], type] = {}


def _derived(prefix: str, base: type, attrs: dict[str, Any], doc: str) -> type:
    """The subclass ``prefix + base.__name__`` of ``base``, made once and importable from this module.

    The same base always gives the same class, so ``isinstance`` works across calls, and the
    class is a name in ``mentor.metrics``, so instances pickle and ``torch.save`` by reference.
    """
    key = (prefix, base)
    if key not in _DERIVED:
        name = prefix + base.__name__
        taken = globals().get(name)
        if taken is not None:
            raise TypeError(f"mentor.metrics.{name} already exists for another class named {base.__name__} "
                            f"({taken.__mro__[1].__module__}); give {base.__module__}.{base.__qualname__} "
                            "another name so that both can be pickled.")
        cls = type(name, (base,), {**attrs, "__module__": __name__, "__qualname__": name, "__doc__": doc})
        globals()[name] = cls
        _DERIVED[key] = cls
    return _DERIVED[key]


def __getattr__(name: str) -> type:
    """Make ``mentor.metrics.NoNanCheckMeanMetric`` and ``ScatterMulticlassPrecision`` importable on demand.

    Unpickling a metric in a fresh process looks its class up by name before any factory ran.
    """
    import torchmetrics.aggregation
    import torchmetrics.classification

    for prefix, factory, module in (("NoNanCheck", "suppress_nan_check", torchmetrics.aggregation),
                                    ("Scatter", "scatter_stat_scores", torchmetrics.classification)):
        base = getattr(module, name[len(prefix):], None) if name.startswith(prefix) else None
        if isinstance(base, type):
            return globals()[factory](base)
    raise AttributeError(f"module 'mentor.metrics' has no attribute {name!r}")


def suppress_nan_check(metric_cls: type[BaseAggregator]) -> type[BaseAggregator]:
    """A subclass of an aggregation metric whose updates skip the NaN check (and its syncs).

    The check calls ``bool(tensor.any())``, which waits for the GPU. The subclass still
    converts inputs to tensors and keeps the caller's weights; NaNs then flow into the
    result as ordinary arithmetic makes them. Since there is no check, there is no NaN policy:
    the subclass refuses a ``nan_strategy`` argument (and positional arguments, the first of
    which is ``nan_strategy`` for torchmetrics' aggregators). Calling this twice with one base
    returns the same class, ``mentor.metrics.NoNanCheck<Base>``, which pickles.

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
    ``ValueError`` with their number. ``top_k > 1`` and ``multidim_average="samplewise"`` fall
    back to the torchmetrics update. The same base gives the same class,
    ``mentor.metrics.Scatter<Base>``, which pickles.

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

    return _derived("Scatter", metric_cls, {"__init__": __init__, "update": update, "compute": compute},
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


@dataclass
class LossAndScores:
    """A training job's metrics: the loss mean in one metric, the classification scores in a ``MetricCollection``.

    ``update(loss, output, target)`` feeds the loss to ``loss`` (with the weight that ``loss_weight``
    names) and the logits and labels to ``scores``: with ``forward=True`` by calling the collection,
    which also computes each metric on the batch, otherwise through ``MetricCollection.update``.
    ``compute()`` returns tensors and reads nothing back; ``read()`` reads every value back in one
    copy (one sync); ``report(step)`` reads, keeps the values in ``history`` and resets.

    ``loss_weight`` is ``None`` (no weight argument), ``"tensor"`` (``weight=torch.ones_like(loss)``,
    the article's first fix) or ``"float"`` (``weight=1.0``, what torchmetrics 1.6.1 did by default).

    Example:
        >>> from torchmetrics import MeanMetric, MetricCollection
        >>> from torchmetrics.classification import MulticlassAccuracy
        >>> m = LossAndScores(MeanMetric(), MetricCollection({"accuracy": MulticlassAccuracy(3, average="micro")}))
        >>> m.update(torch.tensor(2.0), torch.eye(3), torch.tensor([0, 1, 0]))
        >>> m.read()
        {'loss': 2.0, 'accuracy': 0.6666666865348816}
    """

    loss: Metric
    scores: MetricCollection
    loss_weight: str | None = None
    forward: bool = False
    description: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.loss, Metric):
            raise TypeError(f"loss must be a torchmetrics Metric such as MeanMetric(), not {type(self.loss).__name__}.")
        if not isinstance(self.scores, MetricCollection):
            raise TypeError("scores must be a torchmetrics MetricCollection (wrap your metrics: "
                            f"MetricCollection({{'accuracy': ...}})), not {type(self.scores).__name__}.")
        if "loss" in self.scores:
            raise ValueError("scores has a metric named 'loss', which would hide the loss mean: rename it.")
        if self.loss_weight not in (None, "tensor", "float"):
            raise ValueError(f"loss_weight must be None, 'tensor' or 'float', got {self.loss_weight!r}.")

    def update(self, loss: torch.Tensor, output: torch.Tensor, target: torch.Tensor) -> None:
        """Feed one step: the loss to ``loss``, logits and labels to ``scores``."""
        if self.loss_weight == "tensor":
            self.loss.update(loss, weight=torch.ones_like(loss))
        elif self.loss_weight == "float":
            self.loss.update(loss, weight=1.0)
        else:
            self.loss.update(loss)
        if self.forward:
            self.scores(output, target)
        else:
            self.scores.update(output, target)

    def compute(self) -> dict[str, torch.Tensor]:
        """Every value as a tensor, ``loss`` first; what each metric's ``compute()`` syncs, this syncs too."""
        return {"loss": self.loss.compute(), **self.scores.compute()}

    def read(self) -> dict[str, Any]:
        """Every value as a Python float (a list of floats for a per-class value), read back in one copy."""
        return read_values(self.compute())

    def reset(self) -> None:
        """Reset every metric."""
        self.loss.reset()
        self.scores.reset()

    def report(self, step: int) -> dict[str, Any]:
        """Read, remember (in ``history``) and reset; returns the values with their step."""
        values = {"step": step, **self.read()}
        self.history.append(values)
        self.reset()
        return values


def read_values(values: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """Tensors on one device as Python numbers, read back in one copy instead of one per value.

    A 0-dim tensor becomes a float, any other a flat list of floats.

    Example:
        >>> read_values({"a": torch.tensor(0.5), "b": torch.tensor([1, 2])})
        {'a': 0.5, 'b': [1.0, 2.0]}
    """
    tensors = dict(values)
    bad = {k: type(v).__name__ for k, v in tensors.items() if not isinstance(v, torch.Tensor)}
    if bad:
        raise TypeError(f"read_values takes tensors, got {bad}; pass the dict that compute() returns.")
    if not tensors:
        return {}
    devices = {v.device for v in tensors.values()}
    if len(devices) > 1:
        raise ValueError(f"the values live on {sorted(map(str, devices))}: move the metrics to one device "
                         "(metric.to(device)) so that one copy reads them all.")
    flat = torch.cat([v.detach().reshape(-1).to(torch.float64) for v in tensors.values()]).tolist()
    out: dict[str, Any] = {}
    at = 0
    for name, v in tensors.items():
        n = v.numel()
        out[name] = flat[at] if v.ndim == 0 else flat[at:at + n]
        at += n
    return out


METRIC_SETS: dict[str, str] = {
    "naive": "the article's five metrics as first written: MeanMetric(loss) and multiclass Accuracy, "
             "Precision, Recall, F1 with their defaults",
    "float weight": "naive, but loss.update(loss, weight=1.0): what torchmetrics 1.6.1 did by default",
    "tensor weight": "naive, but loss.update(loss, weight=torch.ones_like(loss)): the article's first fix",
    "optimized": "the article's two fixes on the loss mean: an explicit tensor weight and no NaN check",
    "built-in": "torchmetrics' own switch instead of the subclass: MeanMetric(nan_strategy='disable')",
    "macro": "optimized loss; MulticlassAccuracy, Precision, Recall, F1 as they ship: average='macro'",
    "macro sync-free": "macro, each classifier counting with scatter_stat_scores: the same values, no sync",
}

ARTICLE_SETS = ("naive", "float weight", "tensor weight", "optimized", "built-in")
"""The metric sets of part I: the article's classifiers, differing in how the loss is averaged."""

SCORES = ("accuracy", "precision", "recall", "f1_score")
"""The names of the four classification scores in every metric set."""

_MACRO_CLASSES = (MulticlassAccuracy, MulticlassPrecision, MulticlassRecall, MulticlassF1Score)


def score_metrics(num_classes: int, average: str = "micro", sync_free: bool = False) -> dict[str, Metric]:
    """Multiclass accuracy, precision, recall and F1 by name (see ``SCORES``), with one ``average``.

    ``sync_free=True`` makes each of them with :func:`scatter_stat_scores`, which counts without a sync.

    Example:
        >>> sorted(score_metrics(10, "macro"))
        ['accuracy', 'f1_score', 'precision', 'recall']
        >>> type(score_metrics(10, "macro", sync_free=True)["recall"]).__name__
        'ScatterMulticlassRecall'
    """
    if average not in ("micro", "macro", "weighted"):
        raise ValueError(f"average must be 'micro', 'macro' or 'weighted', got {average!r}.")
    classes = [scatter_stat_scores(c) if sync_free else c for c in _MACRO_CLASSES]
    return {name: cls(num_classes=num_classes, average=average) for name, cls in zip(SCORES, classes)}


COLLECTION_WAYS = ("separate metrics", "no groups", "automatic groups", "explicit groups", "forward()")
"""The ways of holding the four classifiers that :func:`collection_way` builds."""


def collection_way(way: str, num_classes: int, device: torch.device | str = "cpu",
                   sync_free: bool = False) -> Callable[[torch.Tensor, torch.Tensor], Any]:
    """The four macro classifiers held one of the ways of ``COLLECTION_WAYS``, as a function of one step's
    ``(logits, labels)``:

    - ``"separate metrics"``: four metrics, each updated on its own, no collection;
    - ``"no groups"``: ``MetricCollection(..., compute_groups=False)``, ``update()``;
    - ``"automatic groups"``: ``MetricCollection(...)`` (groups found at the first update), ``update()``;
    - ``"explicit groups"``: ``compute_groups=[[all four]]``, ``update()``;
    - ``"forward()"``: ``MetricCollection(...)`` called each step, which also computes the batch's values.

    The function's ``metrics`` attribute holds the collection (or the dict of separate metrics).

    Example:
        >>> step = collection_way("explicit groups", 3)
        >>> step(torch.eye(3), torch.tensor([0, 1, 1]))
        >>> step.metrics.compute_groups
        {0: ['accuracy', 'precision', 'recall', 'f1_score']}
    """
    if way not in COLLECTION_WAYS:
        raise ValueError(f"way must be one of {list(COLLECTION_WAYS)}, got {way!r}.")
    metrics = {k: m.to(device) for k, m in score_metrics(num_classes, "macro", sync_free).items()}
    held: Any
    if way == "separate metrics":
        held = metrics

        def step(preds: torch.Tensor, target: torch.Tensor) -> None:
            for m in metrics.values():
                m.update(preds, target)
    else:
        groups: bool | list[list[str]] = {"no groups": False, "explicit groups": [list(SCORES)]}.get(way, True)
        held = MetricCollection(metrics, compute_groups=groups).to(device)
        if way == "forward()":
            def step(preds: torch.Tensor, target: torch.Tensor) -> None:
                held(preds, target)
        else:
            def step(preds: torch.Tensor, target: torch.Tensor) -> None:
                held.update(preds, target)
    step.metrics = held  # type: ignore[attr-defined]
    return step


def metric_set(variant: str, num_classes: int = 1000, device: torch.device | str = "cpu",
               compute_groups: bool | list[list[str]] = False, forward: bool = False) -> LossAndScores:
    """One of the metric sets compared in the book, on ``device``. Variants: see ``METRIC_SETS``.

    The classifiers of the first five variants are the article's (``task="multiclass"`` with its
    defaults, which averages ``"micro"``); those variants differ in how the loss is averaged. The
    ``macro`` variants keep the optimized loss and average the classifiers over classes.
    ``compute_groups`` goes to ``MetricCollection``: ``False`` (the default here, unlike torchmetrics')
    updates every classifier, as the article's separate metrics did; ``True`` finds metrics with
    equal states at the first update; a list of lists of names gives the groups. ``forward=True``
    calls the collection each step instead of ``update``.

    Example:
        >>> ms = metric_set("optimized", num_classes=10)
        >>> list(ms.scores)
        ['accuracy', 'f1_score', 'precision', 'recall']
    """
    if variant not in METRIC_SETS:
        raise ValueError(f"Unknown metric set {variant!r}: pass one of {list(METRIC_SETS)}.")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes must be an int >= 2, got {num_classes!r}.")
    if not isinstance(forward, bool):
        raise ValueError(f"forward must be True or False, got {forward!r}.")
    loss: Metric
    if variant in ("naive", "float weight", "tensor weight"):
        loss = MeanMetric()
    elif variant == "built-in":
        loss = MeanMetric(nan_strategy="disable")
    else:
        loss = suppress_nan_check(MeanMetric)()
    if variant.startswith("macro"):
        scores = score_metrics(num_classes, "macro", sync_free=variant == "macro sync-free")
    else:
        kw: dict[str, Any] = dict(task="multiclass", num_classes=num_classes)
        scores = {"accuracy": Accuracy(**kw), "precision": Precision(**kw), "recall": Recall(**kw),
                  "f1_score": F1Score(**kw)}
    collection = MetricCollection(scores, compute_groups=compute_groups).to(device)
    weight = {"float weight": "float", "tensor weight": "tensor", "optimized": "tensor", "macro": "tensor",
              "macro sync-free": "tensor"}.get(variant)
    return LossAndScores(loss.to(device), collection, loss_weight=weight, forward=forward,
                         description=METRIC_SETS[variant])


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
        try:
            acc.Reload()
        except Exception as err:  # tensorboard raises its own DataLossError and others on corrupt files
            raise ValueError(f"the event files under '{directory}' cannot be read ({type(err).__name__}: {err}); "
                             "pass a logdir written by torch.utils.tensorboard.SummaryWriter.") from None
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    if not out:
        raise ValueError(f"the event files under '{logdir}' hold no scalars ({len(files)} file(s) read): "
                         "log some with log_to_tensorboard (SummaryWriter.add_scalar) first.")
    return {tag: sorted(points) for tag, points in out.items()}


def plot_scalars(scalars: Mapping[str, list[tuple[int, float]]], axes: Any = None, ncols: int = 3) -> Any:
    """One line plot per tag of :func:`read_tensorboard`'s result, ``ncols`` to a row; returns the axes.

    Each panel's y axis spans its own values (so a curve that saturates at 1.0 shows
    where it got there), with the tag as the title.

    Example:
        >>> axes = plot_scalars({"train/loss": [(1, 2.0), (2, 1.5)]})
    """
    import matplotlib.pyplot as plt

    if not scalars:
        raise ValueError("no scalars to plot: log some with log_to_tensorboard first.")
    if isinstance(ncols, bool) or not isinstance(ncols, int) or ncols < 1:
        raise ValueError(f"ncols must be an int >= 1, got {ncols!r}.")
    if axes is None:
        cols = min(ncols, len(scalars))
        rows = -(-len(scalars) // cols)
        fig, grid = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.7 * rows), squeeze=False, layout="constrained")
        axes = list(grid.flat)
        for extra in axes[len(scalars):]:
            fig.delaxes(extra)
        axes = axes[:len(scalars)]
    else:
        axes = list(axes.flat) if hasattr(axes, "flat") else list(axes)
        if len(axes) < len(scalars):
            raise ValueError(f"plot_scalars got {len(axes)} axes for {len(scalars)} tags {sorted(scalars)}; "
                             "pass one Axes per tag, or axes=None to make them.")
    for ax, (tag, points) in zip(axes, sorted(scalars.items())):
        steps, values = zip(*points)
        ax.plot(steps, values, marker="o", ms=5)
        ax.set_title(tag, fontsize=12)
        ax.set_xlabel("step", fontsize=11)
        ax.tick_params(labelsize=10)
        ax.margins(y=0.15)
    return axes
