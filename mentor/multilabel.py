"""A multilabel classifier's mean loss and scores (micro, macro, weighted) in one torchmetrics Metric, no sync."""

from __future__ import annotations

from typing import Any

import torch

from mentor._thresholded import SCORES, ThresholdedMetric, ratio_tables

AVERAGES = ("micro", "macro", "weighted")


class FusedMultilabel(ThresholdedMetric):
    """Mean loss, and accuracy, precision, recall and F1 (micro, macro, weighted) of a multilabel classifier.

    One ``update`` per training step adds the step's loss (a 0-dim tensor) to a sum and counts, per label,
    the step's true and false positives and negatives: on CUDA with one Triton kernel launch
    (``mentor._threshold_kernel``), on the CPU with plain torch operations; neither syncs.
    ``compute()`` returns a dict of 0-dim tensors: ``"loss"``,
    ``"{score}_{average}"`` for every score in ``accuracy, precision, recall, f1`` and average in
    ``micro, macro, weighted``, with ``per_label=True`` also ``"{score}_per_label"`` (one value per label), and
    ``"invalid_labels"``.

    The scores equal torchmetrics 1.9.0's ``Multilabel{Accuracy, Precision, Recall, F1Score}(num_labels,
    threshold, average=..., ignore_index=..., zero_division=...)`` on the same data, which for multilabel means
    (functional/classification/accuracy.py:76-87, stat_scores.py:707-716, utilities/compute.py:82-93):

    - every label's element is one decision, counted in ``tp``, ``fp``, ``tn`` or ``fn`` of its label;
      accuracy is ``(tp + tn) / (tp + tn + fp + fn)``: the share of correct decisions, true negatives included,
      not the share of samples whose every label is right (torchmetrics' exact match is another metric);
    - micro sums the counts over labels first (accuracy.py:78-84, true negatives too);
    - macro is the plain mean over all ``num_labels`` labels, a label never seen in targets or predictions
      included (its precision, recall and F1 are then ``zero_division``; for multiclass torchmetrics leaves
      such classes out, for multilabel it does not: compute.py:90-92);
    - weighted weighs each label by its support ``tp + fn`` (0 when no label has any positive target).

    Float predictions are logits (``inputs="logits"``: positive when ``sigmoid(x) > threshold``) or probabilities
    (``inputs="probs"``), as the caller says, where torchmetrics guesses from the values; integer or bool
    predictions are 0/1 labels. Targets are 0/1 of shape ``(N, num_labels)``; ``ignore_index`` positions are left
    out; any other target value is counted in ``invalid_labels``, which makes every returned value NaN
    (:class:`~mentor.binary.FusedBinary` and ``mentor._thresholded`` say more, with torchmetrics' lines). The
    states all reduce with ``"sum"``, so DDP's sync and :func:`mentor.flat_sync.flat_sync` work.

    Args:
        num_labels: number of labels, at least 1 (torchmetrics asks for 2 or more).
        threshold: a float strictly between 0 and 1; a prediction is positive when its probability is above it.
        ignore_index: a target value whose positions are left out, or None.
        zero_division: 0 or 1, a score's value when its denominator is 0 (torchmetrics' argument).
        inputs: ``"logits"`` or ``"probs"``, what float predictions are.
        per_label: also return the per-label scores.
        ``**metric_kwargs``: torchmetrics ``Metric`` options (``sync_on_compute``, ``process_group``, ...).

    Example:
        >>> m = FusedMultilabel(num_labels=3, inputs="probs")
        >>> probs, target = torch.tensor([[0.9, 0.2, 0.6], [0.1, 0.8, 0.4]]), torch.tensor([[1, 0, 0], [0, 1, 0]])
        >>> m.update(torch.tensor(0.5), probs, target)
        >>> out = m.compute()
        >>> keys = ("loss", "accuracy_micro", "accuracy_macro", "precision_macro", "f1_weighted")
        >>> [round(float(out[key]), 4) for key in keys]
        [0.5, 0.8333, 0.8333, 0.6667, 1.0]
    """

    _per_label = True

    def __init__(self, num_labels: int, threshold: float = 0.5, ignore_index: int | None = None,
                 zero_division: float = 0, inputs: str = "logits", per_label: bool = False,
                 **metric_kwargs: Any) -> None:
        if isinstance(num_labels, bool) or not isinstance(num_labels, int) or num_labels < 1:
            raise ValueError(f"num_labels must be an int of at least 1 (the number of labels, the width of preds), "
                             f"got {num_labels!r}.")
        if not isinstance(per_label, bool):
            raise ValueError(f"per_label must be True or False, got {per_label!r}.")
        super().__init__((num_labels,), threshold, ignore_index, zero_division, inputs, **metric_kwargs)
        self.num_labels = num_labels
        self.per_label = per_label

    def _check_shapes(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        if preds.ndim != 2 or preds.shape[1] != self.num_labels or preds.shape != target.shape:
            raise ValueError(f"preds and target must both have shape (N, num_labels) = (N, {self.num_labels}), got "
                             f"preds of shape {tuple(preds.shape)} and target of shape {tuple(target.shape)}.")

    def _scores(self) -> dict[str, torch.Tensor]:
        out = multilabel_scores(self.tp, self.fp, self.tn, self.fn, self.zero_division, self.per_label)
        if self.per_label and self.num_labels == 1:  # 0-dim, as torchmetrics' compute squeezes a one-element value
            out = {key: value.squeeze(0) if key.endswith("_per_label") else value for key, value in out.items()}
        return out


def multilabel_scores(tp: torch.Tensor, fp: torch.Tensor, tn: torch.Tensor, fn: torch.Tensor,
                      zero_division: float = 0.0, per_label: bool = False) -> dict[str, torch.Tensor]:
    """Every score with every average (and per label) from per-label counts, as torchmetrics' multilabel metrics:
    views of the tables of ``mentor._thresholded.ratio_tables``, made in a fixed number of tensor operations.

    Example:
        >>> tp, fp, tn, fn = torch.tensor([2, 0]), torch.tensor([1, 0]), torch.tensor([1, 4]), torch.tensor([0, 0])
        >>> s = multilabel_scores(tp, fp, tn, fn)
        >>> [round(float(s[key]), 4) for key in ("accuracy_micro", "precision_macro", "recall_weighted")]
        [0.875, 0.3333, 1.0]
    """
    labels = tp.shape[-1]
    out = {}
    for i, (name, (per, averages)) in enumerate(zip(SCORES, ratio_tables(tp, fp, tn, fn, zero_division))):
        out[f"{name}_micro"] = per[i, labels]
        out[f"{name}_macro"] = averages[0, i]
        out[f"{name}_weighted"] = averages[1, i]
        if per_label:
            out[f"{name}_per_label"] = per[i, :labels]
    return out
