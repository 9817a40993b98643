"""The fused metric suite: a training step's mean loss and multiclass scores in one torchmetrics Metric, no sync."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torchmetrics import Metric

from mentor import _direct_launch
from mentor import _fused_kernel as _kernel
from mentor._static_states import StaticStates, _forward_or_restore
from mentor import _scores
from mentor._scores import AVERAGES, SCORES, _divide, scores  # noqa: F401 (re-exported: the suite's score arithmetic)
from mentor.invalid import COUNT_KEY, nan_if_invalid

_MAX_LAUNCHERS = 64
"""Input layouts whose launcher an instance keeps; one more clears them all."""


class FusedMetrics(StaticStates):
    """Mean loss, and accuracy, precision, recall and F1 of a multiclass classifier, from one update per step.

    One :meth:`update` per training step adds the step's loss to a sum and counts the step's
    true positives, false positives and false negatives per class: on CUDA with one Triton kernel
    launch, on the CPU with plain torch operations (one ``scatter_add_`` for the counts). Either way
    no host-device sync, no Python branch on tensor values, no shape that depends on the data.
    Out-of-range labels are counted on the device and reported by :meth:`compute`, which reads nothing back.

    :meth:`compute` returns a dict of 0-dim tensors: ``"loss"`` (the mean of the updates'
    losses) and ``"{score}_{average}"`` for every score in ``accuracy, precision, recall, f1``
    and every average in ``micro, macro, weighted``, with ``per_class=True`` also
    ``"{score}_per_class"`` (one value per class). The values equal torchmetrics'
    ``MeanMetric`` and ``Multiclass{Accuracy, Precision, Recall, F1Score}`` with the same
    ``average``, ``ignore_index`` and ``zero_division`` on the same data: macro leaves out the
    classes that appear in neither predictions nor targets, weighted weighs by support, and a
    score whose denominator is 0 is ``zero_division``. A NaN loss makes the mean loss NaN (it
    is not dropped, which would need a sync). They are equal bit for bit: each macro or weighted average
    is summed on its own, in the order of torchmetrics' sum (tested on the CPU with two threads and, under
    the ``gpu`` marker, on CUDA).

    The dict also holds ``"invalid_labels"``, a 0-dim long tensor: the number of predictions and targets
    outside ``0..num_classes - 1`` (and not ``ignore_index``) since the last reset, 0 when every label was
    valid. Those labels are left out of the counts, and while the number is not 0 every other value (the
    loss and every score, per class too) is NaN, chosen on the device with ``torch.where``
    (:func:`mentor.invalid.nan_if_invalid`). The error comes where the values reach the host:
    :class:`~mentor.readback.DeferredReadback` (``latest()``, ``wait()``) and :class:`~mentor.lightning.LogEvery`
    raise :class:`~mentor.invalid.InvalidLabelsError` when such a report arrives, and
    :func:`mentor.invalid.check_report` does for values read another way.

    The states (``tp``, ``fp``, ``fn`` per class; ``loss_sum``, ``loss_count``;
    ``invalid_labels``) all reduce with ``"sum"``, so torchmetrics' own ``sync_on_compute``
    makes them agree across DDP ranks. Under DDP the count of :meth:`compute` is summed over the
    ranks with the other states, so an invalid label on any rank makes every rank's values NaN
    together, and every rank's report carries the same count. A ``forward`` call that raises (a bad
    input) leaves the states and torchmetrics' flags as they were before it: the batch is not added,
    and the next ``compute()`` syncs as usual. A ``forward`` with an invalid label does not raise: it
    adds the batch and returns the batch's values, NaN, with the batch's count.

    With ``top_k`` (an int, or a tuple such as ``(1, 5)``) the dict also holds ``"accuracy_top{k}"`` for each
    k above 1: the share of counted samples (not ignored, labels in range) whose target is among the k
    largest logits, equal to torchmetrics' ``MulticlassAccuracy(num_classes, top_k=k, average="micro",
    ignore_index=...)``. The hits are the state ``top_k_hits`` (one long per k, ascending, ``"sum"`` across
    ranks); their denominator, the counted samples, is ``tp.sum() + fn.sum()``. Only logits rank classes:
    class indices with ``top_k`` are refused (torchmetrics fails inside ``torch.topk`` on them).

    How ties rank. torchmetrics 1.9.0 asks ``torch.topk`` for the k indices
    (``functional/classification/stat_scores.py:366-368``), which promises no order of tied values ("the
    indices of tied elements are not guaranteed to be stable", torch 2.14 ``torch/_torch_docs.py:11896-11898``).
    On the CPU it picks them with ``std::partial_sort`` when ``k * 64 <= C``, else ``std::nth_element``
    (``ATen/native/TopKImpl.h:45-80``), so which tied logits make the cut is up to the C++ library; a NaN
    ranks above every number there (:52). The CPU path makes the same ``torch.topk`` call as torchmetrics
    (``mentor._scores.top_k_hits``), so it equals torchmetrics, ties and NaN included. The CUDA kernel
    decides in its one launch by a rule of its own: the target is among the k largest when fewer than k
    logits rank above its logit, a logit ranking above it when it is larger, or equal (``-0.0`` equals
    ``0.0``) at a lower class index; a NaN is larger than every number and ties with another NaN
    (``mentor._fused_kernel.ranks_above_target``). ``torch.topk`` on CUDA promises no order of ties
    either, so when tied logits straddle the k-th place the kernel and torchmetrics on CUDA may differ; on
    untied logits (a single NaN in a row included) they agree.

    Args:
        num_classes: number of classes, at least 2.
        ignore_index: a target value whose positions are left out of the counts (padding), or None.
        zero_division: 0 or 1, the score when its denominator is 0 (torchmetrics' argument).
        per_class: also return the per-class scores.
        top_k: 1 (no top-k values), a k from 1 to ``num_classes`` or a tuple of distinct ks; each k > 1 adds a key.
        ``**kwargs``: torchmetrics ``Metric`` options (``sync_on_compute``, ``process_group``, ...).

    Example:
        >>> m = FusedMetrics(num_classes=3)
        >>> m.update(torch.tensor(0.5), torch.tensor([[2.0, 0.1, 0.3], [0.2, 1.5, 0.0]]), torch.tensor([0, 1]))
        >>> m.update(torch.tensor(0.25), torch.tensor([2, 2]), torch.tensor([2, 1]))
        >>> {name: round(float(value), 4) for name, value in m.compute().items() if "micro" in name or name == "loss"}
        {'loss': 0.375, 'accuracy_micro': 0.75, 'precision_micro': 0.75, 'recall_micro': 0.75, 'f1_micro': 0.75}
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    tp: torch.Tensor
    fp: torch.Tensor
    fn: torch.Tensor
    loss_sum: torch.Tensor
    loss_count: torch.Tensor
    invalid_labels: torch.Tensor
    top_k_hits: torch.Tensor

    def __init__(self, num_classes: int, ignore_index: int | None = None, zero_division: float = 0,
                 per_class: bool = False, top_k: int | tuple[int, ...] = 1, **kwargs: Any) -> None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes must be an int of at least 2, got {num_classes!r}.")
        if ignore_index is not None and (isinstance(ignore_index, bool) or not isinstance(ignore_index, int)):
            raise ValueError(f"ignore_index must be an int (the padding label, e.g. -100) or None, "
                             f"got {ignore_index!r}.")
        if zero_division not in (0, 1) or isinstance(zero_division, bool):
            raise ValueError(f"zero_division must be 0 or 1 (as in torchmetrics), got {zero_division!r}.")
        if not isinstance(per_class, bool):
            raise ValueError(f"per_class must be True or False, got {per_class!r}.")
        ks = _scores.top_k_values(top_k, num_classes)  # the ks above 1, ascending; () for top_k=1
        super().__init__(**kwargs)
        self.top_k = ks
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.zero_division = float(zero_division)
        self.per_class = per_class
        for name in ("tp", "fp", "fn"):
            self.add_state(name, torch.zeros(num_classes, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("loss_sum", torch.zeros((), dtype=torch.get_default_dtype()), dist_reduce_fx="sum")
        self.add_state("loss_count", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("invalid_labels", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        if self.top_k:  # top_k=1 adds no state
            self.add_state("top_k_hits", torch.zeros(len(self.top_k), dtype=torch.long), dist_reduce_fx="sum")
        self._launchers: dict[tuple[Any, ...], _kernel.Launcher] = {}
        self._replacing_reset = False
        self._mark_static()

    def reset(self) -> None:
        """torchmetrics' reset (the flags, the update count), with the states zeroed in place in one operation.

        The states keep their memory across updates, ``compute()`` and ``reset()``, so a step compiled with
        ``mode="reduce-overhead"`` keeps replaying its CUDA graph. torchmetrics' ``reset`` (metric.py:758-773)
        sets its flags and replaces each state by a clone of its default; here the same flags are set and the
        states are zeroed by one ``torch._foreach_zero_`` (one kernel on CUDA for all of them). Inside
        ``forward``, whose batch values need fresh states beside the saved ones, the states are replaced, as
        torchmetrics does.
        """
        if self._replacing_reset:
            super().reset()
            self._mark_static()
            return
        self._reset_in_place()

    def _wrap_compute(self, compute: Callable[..., Any]) -> Callable[..., Any]:
        """torchmetrics' compute wrapper without its squeeze and its copies
        (:meth:`~mentor._static_states.StaticStates._compute_without_copies`): the warning when no update ran, the
        cache, the DDP sync and unsync, and the unsync when ``compute`` raises after syncing. :meth:`compute` returns
        views of tensors it has just made, which no state shares (the count is a copy), so a later update or
        ``reset()`` cannot alter them, and its values are 0-dim or per class already."""
        return self._compute_without_copies(compute)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """torchmetrics' ``forward`` (add the batch, return the batch's own values); if it raises, the metric is left
        as it was before the call."""
        self._replacing_reset = True
        try:
            return _forward_or_restore(self, super().forward, *args, **kwargs)
        finally:
            self._replacing_reset = False
            self._mark_static()

    def update(self, loss: torch.Tensor, preds: torch.Tensor, target: torch.Tensor) -> None:
        """Add one step: its loss (a 0-dim tensor), its predictions (logits ``(N, C)`` or class indices ``(N,)``)
        and its targets (class indices ``(N,)``).

        On CUDA this is one Triton kernel launch (``mentor._fused_kernel``) by a launcher found in a cache keyed
        by the inputs' shapes, strides, dtypes and devices: only a new layout runs the input checks. After its
        first launch the launcher calls the compiled kernel directly (``mentor._direct_launch``). Under
        ``torch.compile`` it is the custom operator ``torch.ops.mentor.fused_update`` (``fused_update_top_k``
        with top-k), traced without a graph break. On the CPU, or without Triton, it is :meth:`_plain_update`."""
        if torch.compiler.is_compiling():
            self._checked_update(loss, preds, target)
            return
        try:
            key = (preds.shape, preds.stride(), preds.dtype, preds.device, target.shape, target.stride(),
                   target.dtype, target.device, loss.shape, loss.dtype, loss.device, self.tp.device)
        except (AttributeError, TypeError):  # not tensors: the checks below say what to pass
            key = None
        run = self._launchers.get(key)
        if run is None:
            run = self._checked_update(loss, preds, target)
            if run is not None and key is not None:
                if len(self._launchers) >= _MAX_LAUNCHERS:
                    self._launchers.clear()
                self._launchers[key] = run
            return
        states = (self.tp, self.fp, self.fn, self.loss_sum, self.loss_count, self.invalid_labels)
        run(loss, preds, target, (*states, self.top_k_hits) if self.top_k else states)

    def _checked_update(self, loss: torch.Tensor, preds: torch.Tensor,
                        target: torch.Tensor) -> _kernel.Launcher | None:
        """Check the inputs, then update by the path their device takes; the launcher used on CUDA, else None."""
        _check_inputs(loss, preds, target, self.num_classes)
        if self.top_k and preds.ndim == 1:
            raise ValueError(f"top_k={self.top_k} needs logits of shape ({target.shape[0]}, {self.num_classes}): "
                             f"class indices of shape {tuple(preds.shape)} do not rank the classes. Pass the "
                             f"logits, or leave top_k at 1.")
        if target.device != self.tp.device:
            raise ValueError(f"FusedMetrics is on {self.tp.device} and the inputs on {target.device}; "
                             f"move it with .to({str(target.device)!r}) once, after creating it.")
        states = (self.tp, self.fp, self.fn, self.loss_sum, self.loss_count, self.invalid_labels)
        if not _uses_kernel(target):
            self._plain_update(loss, preds, target)
            return None
        if torch.compiler.is_compiling():
            if not _kernel.OPERATOR:
                self._plain_update(loss, preds, target)
                return None
            ignore = self.ignore_index is not None
            if self.top_k:
                torch.ops.mentor.fused_update_top_k(loss.detach(), preds.detach(), target, *states, self.top_k_hits,
                                                    self.num_classes, self.ignore_index if ignore else 0, ignore,
                                                    list(self.top_k))
            else:
                torch.ops.mentor.fused_update(loss.detach(), preds.detach(), target, *states, self.num_classes,
                                              self.ignore_index if ignore else 0, ignore)
            return None
        if self.top_k:
            run = _direct_launch.launcher(preds, target, self.num_classes, self.ignore_index, top_k=self.top_k)
            states = (*states, self.top_k_hits)
        else:
            run = _direct_launch.launcher(preds, target, self.num_classes, self.ignore_index)
        run(loss, preds, target, states)
        return run

    def _plain_update(self, loss: torch.Tensor, preds: torch.Tensor, target: torch.Tensor) -> None:
        """The update in plain torch operations (the CPU path, and the reference the kernel equals; with top-k,
        on untied logits)."""
        c = self.num_classes
        logits = preds
        if preds.ndim == target.ndim + 1:
            preds = preds.argmax(dim=1)
        p, t = preds.reshape(-1).long(), target.reshape(-1).long()
        pc, tc = p.clamp(0, c - 1), t.clamp(0, c - 1)
        valid = (pc == p) & (tc == t)
        if self.ignore_index is None:
            keep, invalid = valid, ~valid
        else:
            counted = t != self.ignore_index
            keep, invalid = counted & valid, counted & ~valid
        hit = (pc == tc) & keep
        # one scatter: row 0 true positives by target, row 1 predictions by class, row 2 support by class
        index = torch.cat([tc, pc + c, tc + 2 * c])
        counts = torch.zeros(3 * c, dtype=torch.long, device=p.device)
        counts.scatter_add_(0, index, torch.cat([hit, keep, keep]).long())
        rows = counts.view(3, c)
        rows[1:] -= rows[0]  # predictions - tp = fp, support - tp = fn
        torch._foreach_add_([self.tp, self.fp, self.fn], list(rows.unbind()))  # one kernel on CUDA
        self.invalid_labels += invalid.sum()
        if self.top_k:  # torchmetrics' torch.topk test, per k (_scores.top_k_hits)
            self.top_k_hits += _scores.top_k_hits(logits.detach(), tc, keep, self.top_k)
        self.loss_sum += loss.detach().to(self.loss_sum.dtype)
        self.loss_count += 1

    def compute(self) -> dict[str, torch.Tensor]:
        """The mean loss, every score and the count of invalid labels (see the class docstring); reads nothing back,
        also after updates made only under ``torch.compile`` (torchmetrics' compute wrapper asks
        ``update_called``, which a compiled update sets without a counter that would recompile).

        When the count is not 0, every value (the loss and every score, per class too) is NaN, chosen on the
        device (:func:`mentor.invalid.nan_if_invalid`); the count is the dict's ``"invalid_labels"``, and the
        readers (:class:`~mentor.readback.DeferredReadback`, :func:`~mentor.invalid.check_report`) raise
        :class:`~mentor.invalid.InvalidLabelsError` when such a report arrives.

        It makes a fixed number of tensor operations whatever ``num_classes`` (46 to 55 that are not views,
        counted on the CPU by ``tests/test_suite.py``; 186 when each score had operations of its own): the
        scores of ``mentor._scores.score_tables``, joined with the loss, then one NaN pick for all. On CUDA
        each is at most one kernel; the kernels per report are counted there by a ``gpu`` test. The values are
        views of new tensors, so a later ``reset()`` leaves them be (``_wrap_compute``)."""
        table, per = _scores.score_tables(self.tp, self.fp, self.fn, self.zero_division)
        loss = self.loss_sum / self.loss_count
        pieces = [loss.reshape(1), table.reshape(-1)]
        if self.top_k:
            pieces.append(_scores.top_k_ratios(self.top_k_hits, self.tp, self.fn))
        if self.per_class:
            pieces.append(per.reshape(-1))
        if loss.dtype != table.dtype:  # a float64 default dtype: the loss alone keeps it, in a value of its own
            top = _scores.top_k_scores(self.top_k_hits, self.tp, self.fn, self.top_k) if self.top_k else {}
            return nan_if_invalid({"loss": loss, **_scores.score_views(table, per if self.per_class else None), **top},
                                  self.invalid_labels.clone())
        # no read: the device picks NaN or the value for all of them at once (nan_if_invalid, joined here)
        flat = torch.where(self.invalid_labels > 0, math.nan, torch.cat(pieces))
        first_per_class = 1 + len(SCORES) * len(AVERAGES) + len(self.top_k)  # the loss, the table, the top-k ratios
        scalars = flat[:first_per_class].unbind()
        values = {"loss": scalars[0]}
        per_class = flat[first_per_class:].view(len(SCORES), -1).unbind() if self.per_class else ()
        for i, name in enumerate(SCORES):
            for j, average in enumerate(AVERAGES):
                values[f"{name}_{average}"] = scalars[1 + 3 * i + j]
            if per_class:
                values[f"{name}_per_class"] = per_class[i]
        for n, k in enumerate(self.top_k):
            values[f"accuracy_top{k}"] = scalars[1 + len(SCORES) * len(AVERAGES) + n]
        values[COUNT_KEY] = self.invalid_labels.clone()  # a copy: reset() zeroes the state in place
        return values


def _uses_kernel(target: torch.Tensor) -> bool:
    """Whether an update with this target runs the Triton kernel: on CUDA, with Triton importable."""
    return target.is_cuda and _kernel.AVAILABLE


def _check_inputs(loss: torch.Tensor, preds: torch.Tensor, target: torch.Tensor, num_classes: int) -> None:
    """Shape and dtype checks only: they read no tensor values, so they never sync."""
    if not isinstance(loss, torch.Tensor) or loss.ndim != 0 or not loss.is_floating_point():
        raise ValueError(f"loss must be a 0-dim floating-point tensor (the step's mean loss), got "
                         f"{_describe(loss)}; pass loss, not loss.item(), which would sync.")
    if not isinstance(target, torch.Tensor) or target.ndim != 1 or target.is_floating_point():
        raise ValueError(f"target must be a 1-dim integer tensor of class indices, got {_describe(target)}.")
    if not isinstance(preds, torch.Tensor):
        raise ValueError(f"preds must be a tensor of logits (N, C) or class indices (N,), got {_describe(preds)}.")
    if preds.ndim == 2 and preds.is_floating_point():
        if preds.shape != (target.shape[0], num_classes):
            raise ValueError(f"logits must have shape (N, num_classes) = ({target.shape[0]}, {num_classes}), "
                             f"got {tuple(preds.shape)}.")
    elif preds.ndim != 1 or preds.is_floating_point() or preds.shape != target.shape:
        raise ValueError(f"preds must be logits of shape ({target.shape[0]}, {num_classes}) or integer class "
                         f"indices of shape ({target.shape[0]},), got {_describe(preds)}.")
    if preds.device != target.device or loss.device != target.device:
        raise ValueError(f"loss, preds and target must be on one device, got {loss.device}, {preds.device} and "
                         f"{target.device}.")


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"{type(value).__name__} {value!r}"
