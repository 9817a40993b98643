"""What :class:`~mentor.binary.FusedBinary` and :class:`~mentor.multilabel.FusedMultilabel` share (private).

:class:`ThresholdedMetric` is their torchmetrics ``Metric``: the arguments and their checks, the states, one
update per step (one Triton launch on CUDA, :func:`plain_counts` elsewhere), and ``compute()``'s invalid-label
contract: nothing is read back; while ``invalid_labels`` is not 0 every value is NaN, picked on the device.
A subclass says how its inputs are shaped (``_check_shapes``), whether it counts per label (``_per_label``)
and what its scores are (``_scores``).

How torchmetrics 1.9.0 turns float predictions into 0/1 (``_binary_stat_scores_format``,
functional/classification/stat_scores.py:108-110, and ``_multilabel_stat_scores_format``, :693-695):
``normalize_logits_if_needed(preds, "sigmoid")`` then ``preds > threshold``. That function
(utilities/compute.py:201-243) decides from the values whether they are logits: on the CPU with a Python branch
on ``torch.all((tensor >= 0) * (tensor <= 1))`` (:233), which reads the answer on the host; on other devices
with ``torch.where`` over ``((tensor < 0) | (tensor > 1)).any()`` (:238-243), no sync but a reduction and a
sigmoid of the whole batch at every update. Here the caller says which (``inputs="logits"`` or ``"probs"``) and
nothing is decided from values. The two agree whenever torchmetrics' guess is right: a batch of logits with a
value outside [0, 1], a batch of probabilities inside it. They differ where the guess is wrong (logits that all
happen to lie in [0, 1] are thresholded as probabilities there, passed through the sigmoid here), and for NaN:
a NaN logit or probability is a negative prediction here (NaN is not above the threshold); torchmetrics on the
CPU takes a batch with a NaN for logits (``NaN >= 0`` is False) and so applies the sigmoid to every value of it,
on CUDA it does not (``NaN < 0`` and ``NaN > 1`` are False). Integer and bool predictions are 0/1 labels, as
torchmetrics takes them (stat_scores.py:108 thresholds floating preds only; :83-89 refuses values other than 0
and 1, which are counted as invalid here, except at ``ignore_index`` positions: those are left out whatever the
prediction, where torchmetrics checks every prediction).

Targets: 0 or 1 (any integer dtype, or bool); ``ignore_index`` positions are left out (compared as integers: a
uint8 255 is not -1); any other value is left out of the counts and counted in ``invalid_labels`` (torchmetrics
raises, stat_scores.py:71-80, after reading ``torch.unique`` back to the host).

The scores (:func:`ratio_table`) are torchmetrics' arithmetic, element for element, so that they equal its values
to the bit on the CPU: ``_safe_divide`` (utilities/compute.py:49-79, float32, the ``zero_division`` value where a
denominator is 0), accuracy ``(tp + tn) / (tp + tn + fp + fn)`` (functional/classification/accuracy.py:76-77 for
binary, :81-84 micro and :87 per label for multilabel: true negatives count, and accuracy takes no
``zero_division``), precision and recall (precision_recall.py:49-58), F1 as F-beta with ``beta=1.0``
(f_beta.py:48-57: ``(1 + beta2) * tp / ((1 + beta2) * tp + beta2 * fn + fp)``, in the default dtype), and the
macro and weighted averages of ``_adjust_weights_safe_divide`` (utilities/compute.py:82-93; for multilabel, macro
leaves no label out). On CUDA too: each of the 8 averages is a float32 sum over the labels of a row of its own,
aligned as a new tensor, which CUDA (and a CPU of several threads, past 32768 labels) reduces in the order it
reduces torchmetrics' one vector; one sum of a table of them would be split among other threads.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import torch

from mentor import _threshold_kernel as _kernel
from mentor._scores import weighted_sums
from mentor._static_states import StaticStates
from mentor.invalid import nan_if_invalid
from mentor._static_states import _forward_or_restore
from mentor.suite import _describe

INPUTS = ("logits", "probs")
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
"""The floating dtypes taken as predictions (logits or probabilities)."""
_LABELS = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
"""The dtypes taken as 0/1 labels (predictions) and as targets."""
_MAX_LAUNCHERS = 64
"""Input layouts whose launcher an instance keeps; one more clears them all."""
COUNTS = ("tp", "fp", "tn", "fn")


def plain_counts(preds: torch.Tensor, target: torch.Tensor, *, threshold: float, ignore_index: int | None,
                 inputs: str, per_label: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(counts, invalid)``: true and false positives and negatives, and the count of invalid labels, in plain torch.

    ``counts`` stacks ``tp, fp, tn, fn``: shape ``(4, L)`` with ``per_label`` (``preds`` of shape ``(N, L)``),
    else ``(4,)`` over every element. Floating ``preds`` are ``preds.sigmoid() > threshold`` (``inputs="logits"``)
    or ``preds > threshold``, as torchmetrics computes them (see the module docstring); integer or bool ``preds``
    are labels. A position whose target is ``ignore_index`` is left out; one whose target (or label prediction)
    is neither 0 nor 1 is left out of ``counts`` and counted in ``invalid``. This is the CPU path and the
    reference the kernel (:mod:`mentor._threshold_kernel`) equals.

    Example:
        >>> counts, invalid = plain_counts(torch.tensor([0.2, 0.7, 0.9, 0.5]), torch.tensor([0, 1, 0, 2]),
        ...                                threshold=0.5, ignore_index=None, inputs="probs", per_label=False)
        >>> counts.tolist(), int(invalid)
        ([1, 1, 1, 0], 1)
    """
    if preds.is_floating_point():
        positive = (preds.sigmoid() if inputs == "logits" else preds) > threshold
        valid = (target == 0) | (target == 1)
    else:
        positive = preds == 1
        valid = ((target == 0) | (target == 1)) & (positive | (preds == 0))
    truth = target == 1
    # compared as integers, as the kernel does (torch would compare a uint8 255 equal to -1)
    counted = torch.ones_like(valid) if ignore_index is None else target.long() != ignore_index
    keep = counted & valid
    masks = torch.stack([keep & positive & truth, keep & positive & ~truth, keep & ~positive & ~truth,
                         keep & ~positive & truth])
    dims = (1,) if per_label else tuple(range(1, masks.ndim))
    return masks.sum(dim=dims), (counted & ~valid).sum()


SCORES = ("accuracy", "precision", "recall", "f1")
def ratio_table(tp: torch.Tensor, fp: torch.Tensor, tn: torch.Tensor, fn: torch.Tensor, zero_division: float = 0.0,
                dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(per, averages)``: ``per[i]`` is score ``SCORES[i]`` of 0-dim counts (``per`` of shape ``(4,)``), or of each
    label and, in the last column, micro (``(4, L + 1)`` for counts of shape ``(L,)``); ``averages[j, i]`` its macro
    (``j = 0``) and weighted (``j = 1``) average over the labels, None for 0-dim counts. All in ``dtype``.

    A fixed number of tensor operations, whatever ``L``, each torchmetrics' own element for element (see the module
    docstring): the ratios are ``_safe_divide`` of integer sums cast to ``dtype`` (micro: of the labels' sums, as
    torchmetrics sums its ``long`` states), F1's denominator ``2 tp + fn + fp`` is summed in ``dtype`` in that
    order, and an average is ``_safe_divide(weights * score, weights.sum())`` summed over the labels, the weights
    1 (macro: every label, none left out) or the support ``tp + fn`` (weighted), their sum cast to float32; each of
    the 8 averages by a sum of its own (so 8 sums, whatever ``L``).

    Example:
        >>> per, averages = ratio_table(torch.tensor(3), torch.tensor(1), torch.tensor(4), torch.tensor(0))
        >>> [round(float(value), 4) for value in per], averages
        ([0.875, 0.75, 1.0, 0.8571], None)
        >>> per, averages = ratio_table(*(torch.tensor(c) for c in ([2, 0], [1, 0], [1, 4], [0, 0])))
        >>> per.shape, [round(float(value), 4) for value in averages[:, 1]]  # precision: macro, weighted
        (torch.Size([4, 3]), [0.3333, 0.6667])
    """
    counts = torch.stack((tp, fp, tn, fn))
    labels = counts.shape[1:]
    if labels:  # the micro sums as one more label
        counts = torch.cat((counts, counts.sum(1, keepdim=True)), 1)
    pairs = counts[:1] + counts[1:]  # tp + fp, tp + tn, tp + fn
    # numerators: tp + tn, tp, tp, tp (to be 2 tp); denominators: the total, tp + fp, tp + fn, fn (to be 2 tp + fn
    # + fp); then fp: one cast to dtype for all
    rows = torch.cat((pairs[1:2], counts[:1].expand(3, *counts.shape[1:]), counts.sum(0, keepdim=True), pairs[:1],
                      pairs[2:], counts[3:], counts[1:2])).to(dtype)
    rows[3].mul_(2)  # torchmetrics' (1 + beta2) * tp, beta2 = 1.0
    rows[7].add_(rows[3]).add_(rows[8])  # beta2 * fn + (1 + beta2) * tp, then + fp
    num, den = rows[:4], rows[4:8]
    fill = torch.full((), zero_division, dtype=dtype, device=rows.device)
    per = torch.where(den != 0, num / den, fill)
    if zero_division != 0:  # accuracy has no zero_division in torchmetrics: 0 there
        per[0].masked_fill_(den[0] == 0, 0.0)
    if not labels:
        return per, None
    n = labels[0]
    support = pairs[2, :n]
    weights = torch.stack((torch.ones_like(support), support))  # (2, L): macro, weighted
    total = weights.sum(1).float()[:, None, None]  # _safe_divide casts the long sum to float32
    return per, weighted_sums(weights, per[:, :n], total)


def ratio_tables(tp: torch.Tensor, fp: torch.Tensor, tn: torch.Tensor, fn: torch.Tensor,
                 zero_division: float = 0.0) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """For each score of ``SCORES``, the :func:`ratio_table` of the dtype torchmetrics computes it in: float32 for
    accuracy, precision and recall (``_safe_divide`` casts integers to float32), the default dtype for F1 (its
    ``(1 + beta2) * tp`` is a Python float times a long tensor). One table when the default dtype is float32.

    Example:
        >>> tables = ratio_tables(torch.tensor(3), torch.tensor(1), torch.tensor(4), torch.tensor(0))
        >>> len(tables), tables[0] is tables[3]
        (4, True)
    """
    main = ratio_table(tp, fp, tn, fn, zero_division, torch.float32)
    f1_dtype = torch.get_default_dtype()
    f1 = main if f1_dtype == torch.float32 else ratio_table(tp, fp, tn, fn, zero_division, f1_dtype)
    return [main, main, main, f1]


def _check_arguments(threshold: object, ignore_index: object, zero_division: object, inputs: object) -> None:
    """The constructor's checks of the arguments both classes share."""
    if (isinstance(threshold, bool) or not isinstance(threshold, numbers.Real)
            or not 0 < float(threshold) < 1):
        raise ValueError(f"threshold must be a float strictly between 0 and 1 (a prediction counts as positive when "
                         f"its probability is above it), got {threshold!r}.")
    if ignore_index is not None and (isinstance(ignore_index, bool) or not isinstance(ignore_index, int)):
        raise ValueError(f"ignore_index must be an int (the target value of positions to leave out, e.g. -1) or "
                         f"None, got {ignore_index!r}.")
    if isinstance(zero_division, bool) or zero_division not in (0, 1):
        raise ValueError(f"zero_division must be 0 or 1 (as in torchmetrics), got {zero_division!r}.")
    if not isinstance(inputs, str) or inputs not in INPUTS:
        raise ValueError(f"inputs must be 'logits' (a sigmoid is applied before the threshold) or 'probs' "
                         f"(compared with the threshold as they are), got {inputs!r}.")


def _check_tensors(loss: object, preds: object, target: object) -> None:
    """Types and dtypes only: nothing read from the tensors' values, so no sync."""
    if not isinstance(loss, torch.Tensor) or loss.ndim != 0 or not loss.is_floating_point():
        raise ValueError(f"loss must be a 0-dim floating-point tensor (the step's mean loss), got {_describe(loss)}; "
                         f"pass loss (or loss.detach()), not loss.item(), which would sync.")
    if not isinstance(preds, torch.Tensor) or preds.dtype not in FLOATS + _LABELS:
        raise TypeError(f"preds must be a tensor of logits or probabilities (float16, bfloat16, float32 or float64) "
                        f"or of 0/1 labels (an integer or bool dtype), got {_describe(preds)}.")
    if not isinstance(target, torch.Tensor) or target.dtype not in _LABELS:
        raise TypeError(f"target must be a tensor of 0/1 labels with an integer or bool dtype (e.g. target.long()), "
                        f"got {_describe(target)}.")
    if preds.device != target.device or loss.device != target.device:
        raise ValueError(f"loss, preds and target must be on one device, got {loss.device}, {preds.device} and "
                         f"{target.device}; move them to one device (e.g. target.to(preds.device)).")


def _contiguous_first(run: Callable[..., None]) -> Callable[..., None]:
    """A launcher for inputs whose layout the kernel cannot read: it launches ``run`` on contiguous copies."""

    def launch(loss: torch.Tensor, preds: torch.Tensor, target: torch.Tensor, states: Any) -> None:
        run(loss, preds.contiguous(), target.contiguous(), states)

    return launch


class ThresholdedMetric(StaticStates):
    """The loss mean and the counts of a thresholded classifier, from one update per step (private base class).

    See :class:`mentor.binary.FusedBinary` and :class:`mentor.multilabel.FusedMultilabel`, its two subclasses,
    for what they take and return; this class holds what they share. The states (``tp``, ``fp``, ``tn``, ``fn``:
    0-dim, or one per label; ``loss_sum``, ``loss_count``, ``invalid_labels``) all reduce with ``"sum"``, so
    torchmetrics' sync and :func:`mentor.flat_sync.flat_sync` work. They keep their memory through ``reset()``,
    ``compute()`` (under DDP too) and ``unsync()``, and are marked static for ``torch.compile``, as
    :class:`~mentor.suite.FusedMetrics`' are, so that a step captured in a CUDA graph keeps counting into them.

    Example:
        >>> from mentor.binary import FusedBinary
        >>> m = FusedBinary(inputs="probs")
        >>> isinstance(m, ThresholdedMetric), [name for name in m._defaults]
        (True, ['tp', 'fp', 'tn', 'fn', 'loss_sum', 'loss_count', 'invalid_labels'])
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False
    _per_label = False

    tp: torch.Tensor
    fp: torch.Tensor
    tn: torch.Tensor
    fn: torch.Tensor
    loss_sum: torch.Tensor
    loss_count: torch.Tensor
    invalid_labels: torch.Tensor

    def __init__(self, counts_shape: tuple[int, ...], threshold: float, ignore_index: int | None,
                 zero_division: float, inputs: str, **metric_kwargs: Any) -> None:
        _check_arguments(threshold, ignore_index, zero_division, inputs)
        super().__init__(**metric_kwargs)
        self.threshold = float(threshold)
        self.ignore_index = ignore_index
        self.zero_division = float(zero_division)
        self.inputs = inputs
        # what `preds > threshold` compares with, per dtype (torch casts the threshold to preds' dtype), worked out
        # here on the CPU once: the update, compiled or not, only looks it up
        self._compared = {dtype: _kernel.compared_threshold(self.threshold, dtype) for dtype in FLOATS}
        for name in COUNTS:
            self.add_state(name, torch.zeros(counts_shape, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("loss_sum", torch.zeros((), dtype=torch.get_default_dtype()), dist_reduce_fx="sum")
        self.add_state("loss_count", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("invalid_labels", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self._launchers: dict[tuple[Any, ...], Callable[..., None]] = {}
        self._in_forward = False
        self._mark_static()

    # The update: a launcher per input layout on CUDA, plain torch elsewhere.

    def _check_shapes(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        raise NotImplementedError

    def _scores(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _states(self) -> tuple[torch.Tensor, ...]:
        return (self.tp, self.fp, self.tn, self.fn, self.loss_sum, self.loss_count, self.invalid_labels)

    def update(self, loss: torch.Tensor, preds: torch.Tensor, target: torch.Tensor) -> None:
        """Add one step: its loss (a 0-dim tensor), its predictions and its 0/1 targets (see the class docstring).

        On CUDA one Triton launch, by a launcher kept per input layout (shapes, strides, dtypes, devices): only a
        new layout runs the checks. Under ``torch.compile``, the custom operator ``torch.ops.mentor.threshold_update``
        (no graph break). On the CPU, or without Triton, :func:`plain_counts` and three in-place additions."""
        if torch.compiler.is_compiling():
            self._checked_update(loss, preds, target)
            return
        try:
            layout = (preds.shape, preds.stride(), preds.dtype, preds.device, target.shape, target.stride(),
                      target.dtype, target.device, loss.shape, loss.dtype, loss.device)
        except (AttributeError, TypeError):  # not tensors: the checks say what to pass
            layout = None
        launch = self._launchers.get(layout) if layout is not None else None
        if launch is not None:
            launch(loss, preds, target, self._states())
            return
        launch = self._checked_update(loss, preds, target)
        if launch is not None and layout is not None:
            if len(self._launchers) >= _MAX_LAUNCHERS:
                self._launchers.clear()
            self._launchers[layout] = launch

    def _checked_update(self, loss: torch.Tensor, preds: torch.Tensor,
                        target: torch.Tensor) -> Callable[..., None] | None:
        """Check the inputs and update by their device's path; returns the launcher used on CUDA, else None."""
        _check_tensors(loss, preds, target)
        self._check_shapes(preds, target)
        if target.device != self.tp.device:
            raise ValueError(f"{type(self).__name__} is on {self.tp.device} and the inputs on {target.device}; move "
                             f"it with .to({str(target.device)!r}) once, after creating it.")
        if not (target.is_cuda and _kernel.AVAILABLE):
            self._plain_update(loss, preds, target)
            return None
        readable = _kernel.matrix(preds, target) is not None
        threshold = self._compared.get(preds.dtype, 0.5)
        if torch.compiler.is_compiling():
            if not _kernel.OPERATOR:
                self._plain_update(loss, preds, target)
            else:
                if not readable:
                    preds, target = preds.contiguous(), target.contiguous()
                torch.ops.mentor.threshold_update(
                    loss.detach(), preds.detach(), target, *self._states(), threshold,
                    0 if self.ignore_index is None else self.ignore_index, self.ignore_index is not None,
                    self.inputs == "logits", self._per_label)
            return None
        shaped = (preds, target) if readable else (preds.contiguous(), target.contiguous())
        launch: Callable[..., None] = _kernel.ThresholdLauncher(
            *shaped, threshold=threshold, ignore_index=self.ignore_index, inputs=self.inputs,
            per_label=self._per_label)
        if not readable:
            launch = _contiguous_first(launch)
        launch(loss, preds, target, self._states())
        return launch

    def _plain_update(self, loss: torch.Tensor, preds: torch.Tensor, target: torch.Tensor) -> None:
        """The update in plain torch operations: the CPU path, and the reference the kernel equals."""
        counts, invalid = plain_counts(preds, target, threshold=self.threshold, ignore_index=self.ignore_index,
                                       inputs=self.inputs, per_label=self._per_label)
        torch._foreach_add_([self.tp, self.fp, self.tn, self.fn], list(counts.unbind()))
        self.invalid_labels += invalid
        self.loss_sum += loss.detach().to(self.loss_sum.dtype)
        self.loss_count += 1

    def compute(self) -> dict[str, torch.Tensor]:
        """The mean loss, the scores and ``"invalid_labels"``; nothing is read back (see the class docstring).

        While ``invalid_labels`` is not 0, the loss and every score are NaN, picked on the device by one
        ``torch.where`` per dtype (:func:`mentor.invalid.nan_if_invalid`); ``"invalid_labels"`` is a copy of the
        count (0 when every label was valid). A fixed number of tensor operations whatever the number of labels:
        the scores of :func:`ratio_tables`, joined with the loss into one tensor, the NaN pick, the count's copy
        (counted on the CPU as operations that are not views, by ``tests/test_thresholded_report.py``: 18 for
        ``FusedBinary``, 39 for ``FusedMultilabel``, 2 more with ``zero_division=1``; 44 and 154 when each score
        had operations of its own and torchmetrics cloned each value). The values are views of that new tensor, so
        a later update or ``reset()`` leaves them be (:meth:`_wrap_compute`)."""
        return nan_if_invalid({"loss": self.loss_sum / self.loss_count, **self._scores()},
                              self.invalid_labels.clone())

    def _wrap_compute(self, compute: Callable[..., Any]) -> Callable[..., Any]:
        """torchmetrics' compute wrapper without its squeeze and its copies
        (:meth:`~mentor._static_states.StaticStates._compute_without_copies`): the warning when no update ran, the
        cache, the DDP sync and unsync, and the unsync when ``compute`` raises after syncing."""
        return self._compute_without_copies(compute)

    def reset(self) -> None:
        """torchmetrics' reset of its flags, with every state zeroed in place by one ``torch._foreach_zero_``
        (:meth:`~mentor._static_states.StaticStates._reset_in_place`); inside ``forward``, whose batch needs fresh
        states beside the saved ones, the states are replaced, as torchmetrics does."""
        if not self._in_forward:
            self._reset_in_place()
            return
        self.__dict__.pop("_held", None)  # local states kept by a sync that no unsync will restore
        super().reset()
        self._mark_static()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """torchmetrics' ``forward`` (adds the batch, returns the batch's own values); one that raises (a bad input)
        leaves the metric as it was (``mentor._static_states._forward_or_restore``)."""
        self._in_forward = True
        try:
            return _forward_or_restore(self, super().forward, *args, **kwargs)
        finally:
            self._in_forward = False
            self._mark_static()
