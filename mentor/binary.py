"""A binary classifier's mean loss, accuracy, precision, recall and F1 in one torchmetrics Metric, no sync."""

from __future__ import annotations

from typing import Any

import torch

from mentor._thresholded import SCORES, ThresholdedMetric, ratio_tables


class FusedBinary(ThresholdedMetric):
    """Mean loss, and accuracy, precision, recall and F1 of a binary classifier, from one update per step.

    One ``update`` per training step adds the step's loss (a 0-dim tensor) to a sum and counts the step's
    true and false positives and negatives: on CUDA with one Triton kernel launch (``mentor._threshold_kernel``),
    on the CPU with plain torch operations. Neither syncs, branches on tensor values or makes a shape that depends
    on the data. ``compute()`` returns a dict of 0-dim tensors:
    ``"loss"`` (the mean of the updates' losses), ``"accuracy"``, ``"precision"``, ``"recall"``, ``"f1"`` and
    ``"invalid_labels"``.

    The scores equal torchmetrics 1.9.0's ``BinaryAccuracy``, ``BinaryPrecision``, ``BinaryRecall`` and
    ``BinaryF1Score`` with the same ``threshold``, ``ignore_index`` and ``zero_division`` on the same data
    (accuracy takes no ``zero_division``, as there), and the loss ``MeanMetric``'s, with two differences that
    spare a sync each (``mentor._thresholded``'s docstring gives the details, with torchmetrics' lines):

    - the caller says whether float predictions are logits (``inputs="logits"``: a prediction is positive when
      ``sigmoid(x) > threshold``) or probabilities (``inputs="probs"``: ``x > threshold``); torchmetrics guesses
      from the values at every update. They agree when its guess is right. A NaN prediction is a negative.
    - a NaN loss makes the mean loss NaN; ``MeanMetric`` drops it with a warning, after a read-back.

    Predictions may also be 0/1 labels (an integer or bool tensor), as torchmetrics takes them. Targets are 0/1
    (an integer or bool tensor) of the predictions' shape, ``(N,)`` or ``(N, ...)`` (every element counts, as
    torchmetrics' ``multidim_average="global"``). Positions whose target is ``ignore_index`` are left out. A target
    (or label prediction) that is neither 0 nor 1 nor ``ignore_index`` is left out and counted in the
    ``invalid_labels`` state; while it is not 0, ``compute()`` makes the loss and every score NaN, on the device,
    and its ``"invalid_labels"`` says how many (torchmetrics raises instead, after reading the values back).

    The states (``tp``, ``fp``, ``tn``, ``fn``, ``loss_sum``, ``loss_count``, ``invalid_labels``) all reduce with
    ``"sum"``: torchmetrics' ``sync_on_compute`` makes them agree across DDP ranks, and
    ``mentor.flat_sync.flat_sync(FusedBinary)`` does it in one all-reduce.

    Args:
        threshold: a float strictly between 0 and 1; a prediction is positive when its probability is above it.
        ignore_index: a target value whose positions are left out (padding), or None.
        zero_division: 0 or 1, a score's value when its denominator is 0 (torchmetrics' argument).
        inputs: ``"logits"`` or ``"probs"``, what float predictions are.
        ``**metric_kwargs``: torchmetrics ``Metric`` options (``sync_on_compute``, ``process_group``, ...).

    Example:
        >>> m = FusedBinary(threshold=0.5, inputs="logits")
        >>> m.update(torch.tensor(0.5), torch.tensor([2.0, -1.0, 0.3, -3.0]), torch.tensor([1, 0, 0, 1]))
        >>> m.update(torch.tensor(0.25), torch.tensor([1.5, -0.5]), torch.tensor([1, 1]))
        >>> {name: round(float(value), 4) for name, value in m.compute().items()}
        {'loss': 0.375, 'accuracy': 0.5, 'precision': 0.6667, 'recall': 0.5, 'f1': 0.5714, 'invalid_labels': 0.0}
    """

    def __init__(self, threshold: float = 0.5, ignore_index: int | None = None, zero_division: float = 0,
                 inputs: str = "logits", **metric_kwargs: Any) -> None:
        super().__init__((), threshold, ignore_index, zero_division, inputs, **metric_kwargs)

    def _check_shapes(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        if preds.ndim == 0 or preds.shape != target.shape:
            raise ValueError(f"preds and target must have one shape (N,) or (N, ...), got preds of shape "
                             f"{tuple(preds.shape)} and target of shape {tuple(target.shape)}.")

    def _scores(self) -> dict[str, torch.Tensor]:
        tables = ratio_tables(self.tp, self.fp, self.tn, self.fn, self.zero_division)
        return {name: tables[i][0][i] for i, name in enumerate(SCORES)}
