"""The metric sets the book compares: the article's five metrics and their variants, as one object per set.

A :class:`LossAndScores` holds a loss mean and a ``MetricCollection`` of classification scores;
:func:`metric_set` builds each variant of ``METRIC_SETS``, :func:`collection_way` the ways of
holding the four macro classifiers that chapter 10 compares, and :func:`read_values` reads every
computed value back in one copy.

Example:
    >>> ms = metric_set("optimized", num_classes=10)
    >>> ms.update(torch.tensor(2.0), torch.eye(10)[:4], torch.tensor([0, 1, 2, 0]))
    >>> ms.read()["loss"], ms.read()["accuracy"]
    (2.0, 0.75)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torchmetrics import Accuracy, F1Score, MeanMetric, Metric, MetricCollection, Precision, Recall
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score, MulticlassPrecision, MulticlassRecall

from mentor.sync_free import scatter_stat_scores, suppress_nan_check


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

    ``sync_free=True`` makes each of them with :func:`mentor.sync_free.scatter_stat_scores`, which counts without a sync.

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
