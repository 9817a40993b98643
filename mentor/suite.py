"""The fused metric suite: a training step's mean loss and multiclass scores in one torchmetrics Metric, no sync."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torchmetrics import Metric

from mentor import _direct_launch
from mentor import _fused_kernel as _kernel

AVERAGES = ("micro", "macro", "weighted")
_MAX_LAUNCHERS = 64
"""Input layouts whose launcher an instance keeps; one more clears them all."""
SCORES = ("accuracy", "precision", "recall", "f1")


class FusedMetrics(Metric):
    """Mean loss, and accuracy, precision, recall and F1 of a multiclass classifier, from one update per step.

    One :meth:`update` per training step adds the step's loss to a sum and counts the step's
    true positives, false positives and false negatives per class: on CUDA with one Triton kernel
    launch, on the CPU with plain torch operations (one ``scatter_add_`` for the counts). Either way
    no host-device sync, no Python branch on tensor values, no shape that depends on the data.
    Out-of-range labels are counted on the device and reported by :meth:`compute`.

    :meth:`compute` returns a dict of 0-dim tensors: ``"loss"`` (the mean of the updates'
    losses) and ``"{score}_{average}"`` for every score in ``accuracy, precision, recall, f1``
    and every average in ``micro, macro, weighted``, with ``per_class=True`` also
    ``"{score}_per_class"`` (one value per class). The values equal torchmetrics'
    ``MeanMetric`` and ``Multiclass{Accuracy, Precision, Recall, F1Score}`` with the same
    ``average``, ``ignore_index`` and ``zero_division`` on the same data: macro leaves out the
    classes that appear in neither predictions nor targets, weighted weighs by support, and a
    score whose denominator is 0 is ``zero_division``. A NaN loss makes the mean loss NaN (it
    is not dropped, which would need a sync).

    The states (``tp``, ``fp``, ``fn`` per class; ``loss_sum``, ``loss_count``;
    ``invalid_labels``) all reduce with ``"sum"``, so torchmetrics' own ``sync_on_compute``
    makes them agree across DDP ranks. Under DDP :meth:`compute` reads the invalid labels of all
    ranks, so it raises on every rank together, each left with its own states (torchmetrics would
    leave them synced). A ``forward`` call that raises (an invalid label, a bad input) leaves the
    states and torchmetrics' flags as they were before it: the batch is not added, and the next
    ``compute()`` syncs as usual.

    Args:
        num_classes: number of classes, at least 2.
        ignore_index: a target value whose positions are left out of the counts (padding), or None.
        zero_division: 0 or 1, the score when its denominator is 0 (torchmetrics' argument).
        per_class: also return the per-class scores.
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

    def __init__(self, num_classes: int, ignore_index: int | None = None, zero_division: float = 0,
                 per_class: bool = False, **kwargs: Any) -> None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes must be an int of at least 2, got {num_classes!r}.")
        if ignore_index is not None and (isinstance(ignore_index, bool) or not isinstance(ignore_index, int)):
            raise ValueError(f"ignore_index must be an int (the padding label, e.g. -100) or None, "
                             f"got {ignore_index!r}.")
        if zero_division not in (0, 1) or isinstance(zero_division, bool):
            raise ValueError(f"zero_division must be 0 or 1 (as in torchmetrics), got {zero_division!r}.")
        if not isinstance(per_class, bool):
            raise ValueError(f"per_class must be True or False, got {per_class!r}.")
        super().__init__(**kwargs)
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.zero_division = float(zero_division)
        self.per_class = per_class
        for name in ("tp", "fp", "fn"):
            self.add_state(name, torch.zeros(num_classes, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("loss_sum", torch.zeros((), dtype=torch.get_default_dtype()), dist_reduce_fx="sum")
        self.add_state("loss_count", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("invalid_labels", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self._launchers: dict[tuple[Any, ...], _kernel.Launcher] = {}
        self._replacing_reset = False
        self._mark_static()

    def _mark_static(self) -> None:
        """Mark the states as static addresses for ``torch.compile`` (``torch._dynamo.mark_static_address``).

        With ``mode="reduce-overhead"``, inductor records a graph that mutates an input as a CUDA graph only when
        that input is static (a parameter, a buffer, or marked so) or was made by an earlier CUDA graph; for any
        other mutated input it skips CUDA graphs for the whole graph ("skipping cudagraphs due to mutated
        inputs", ``check_for_mutation`` in ``torch/_inductor/cudagraph_utils.py``). The update mutates every
        state, so marking them is what lets it run inside the step's CUDA graph, which then updates them where
        they are. Unguarded (``guard=False``): a state replaced later (by ``.to()``, a state-dict load or
        ``forward``) makes the CUDA graph re-record, as that function's docstring says, with no recompile; the
        new tensor is marked here.
        """
        for name in self._defaults:
            torch._dynamo.mark_static_address(getattr(self, name), guard=False)

    def reset(self) -> None:
        """torchmetrics' reset (the flags, the update count), with each state zeroed in place.

        The states keep their memory across updates, ``compute()`` and ``reset()``, so a step compiled with
        ``mode="reduce-overhead"`` keeps replaying its CUDA graph. Inside ``forward``, whose batch values need
        fresh states beside the saved ones, the states are replaced, as torchmetrics does.
        """
        if self._replacing_reset:
            super().reset()
            self._mark_static()
            return
        kept = {name: getattr(self, name) for name in self._defaults}
        super().reset()
        for name, tensor in kept.items():
            fresh = getattr(self, name)
            if tensor.shape == fresh.shape and tensor.dtype == fresh.dtype and tensor.device == fresh.device:
                tensor.zero_()
                setattr(self, name, tensor)
            else:
                torch._dynamo.mark_static_address(fresh, guard=False)

    def _apply(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """torchmetrics' ``_apply`` (``.to()``, ``.cuda()``, ...), then the moved states are marked static and the
        kernel launchers, made for the old device, dropped."""
        this = super()._apply(fn, *args, **kwargs)
        this._launchers = {}
        this._mark_static()
        return this

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        """torchmetrics' state-dict load, which replaces the states; the new ones are marked static and the
        launchers dropped (the states may now be on another device)."""
        super()._load_from_state_dict(*args, **kwargs)
        self._launchers = {}
        self._mark_static()

    def sync(self, *args: Any, **kwargs: Any) -> None:
        """torchmetrics' sync (the states replaced by their sums over ranks), remembering the local state tensors."""
        held = {name: getattr(self, name) for name in self._defaults}
        super().sync(*args, **kwargs)
        if self._is_synced:
            self._held = held

    def unsync(self, should_unsync: bool = True) -> None:
        """torchmetrics' unsync, which restores the local values from copies it made at sync (metric.py:617-634),
        copied back into the tensors the states were before the sync, so that they keep their memory."""
        held = self.__dict__.pop("_held", None)
        super().unsync(should_unsync)
        if held is not None and not self._is_synced:
            for name, tensor in held.items():
                restored = getattr(self, name)
                if restored is not tensor:
                    tensor.copy_(restored)
                    setattr(self, name, tensor)

    def __getstate__(self) -> dict[str, Any]:
        """torchmetrics' pickled state, without the kernel launchers (closures; they are rebuilt on use)."""
        return {**super().__getstate__(), "_launchers": {}}

    def _wrap_update(self, update: Callable[..., None]) -> Callable[..., None]:
        """torchmetrics' update wrapper, cut to what this metric needs.

        ``Metric._wrap_update`` (torchmetrics 1.9.0 metric.py:542-564) clears the computed cache, adds 1 to
        ``self._update_count``, runs the update under ``torch.set_grad_enabled(self._enable_grad)``, rewraps a
        ``RuntimeError`` about tensors on different devices with a hint to move the metric (:549-558), and moves
        list states to the CPU when ``compute_on_cpu`` is set. This metric has no list states, its update
        builds no autograd graph (its inputs are read, never differentiated), and its own input check refuses
        inputs on another device than the states, with the same hint, before anything runs
        (:meth:`_checked_update`). So only the first two remain. In eager mode they are written straight into
        the instance's ``__dict__``, skipping ``Metric.__setattr__`` and ``nn.Module.__setattr__``, which
        look the name up among constants, parameters, buffers and submodules first.
        Under ``torch.compile`` the counter is left alone: it is a Python int on a module, which dynamo
        treats as a constant, guarding on its value and recompiling at every step (``loss_count``, a
        state, counts the steps instead).
        """

        @functools.wraps(update)
        def wrapped(*args: Any, **kwargs: Any) -> None:
            if torch.compiler.is_compiling():
                self._computed = None
            else:
                attributes = self.__dict__
                attributes["_computed"] = None
                attributes["_update_count"] += 1
            update(*args, **kwargs)

        return wrapped

    def _wrap_compute(self, compute: Callable[..., Any]) -> Callable[..., Any]:
        """torchmetrics' wrapper, which puts the local states back when ``compute`` raises after syncing."""
        return _unsync_on_error(self, super()._wrap_compute(compute))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """torchmetrics' ``forward`` (add the batch, return the batch's own values); if it raises, the metric is left
        as it was before the call."""
        self._replacing_reset = True
        try:
            return _forward_or_restore(self, super().forward, *args, **kwargs)
        finally:
            self._replacing_reset = False
            self._mark_static()

    @property
    def update_called(self) -> bool:
        """Whether ``update`` ran since the last reset; after compiled updates only, this reads ``loss_count``
        back (one sync, at ``compute()``)."""
        return self._update_count > 0 or bool(self.loss_count > 0)

    def update(self, loss: torch.Tensor, preds: torch.Tensor, target: torch.Tensor) -> None:
        """Add one step: its loss (a 0-dim tensor), its predictions (logits ``(N, C)`` or class indices ``(N,)``)
        and its targets (class indices ``(N,)``).

        On CUDA this is one Triton kernel launch (``mentor._fused_kernel``) by a launcher found in a cache keyed
        by the inputs' shapes, strides, dtypes and devices: only a new layout runs the input checks. After its
        first launch the launcher calls the compiled kernel directly (``mentor._direct_launch``). Under
        ``torch.compile`` it is the custom operator ``torch.ops.mentor.fused_update``, traced without a graph
        break. On the CPU, or without Triton, it is :meth:`_plain_update`."""
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
        run(loss, preds, target, (self.tp, self.fp, self.fn, self.loss_sum, self.loss_count, self.invalid_labels))

    def _checked_update(self, loss: torch.Tensor, preds: torch.Tensor,
                        target: torch.Tensor) -> _kernel.Launcher | None:
        """Check the inputs, then update by the path their device takes; the launcher used on CUDA, else None."""
        _check_inputs(loss, preds, target, self.num_classes)
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
            torch.ops.mentor.fused_update(loss.detach(), preds.detach(), target, *states, self.num_classes,
                                          self.ignore_index if ignore else 0, ignore)
            return None
        run = _direct_launch.launcher(preds, target, self.num_classes, self.ignore_index)
        run(loss, preds, target, states)
        return run

    def _plain_update(self, loss: torch.Tensor, preds: torch.Tensor, target: torch.Tensor) -> None:
        """The update in plain torch operations (the CPU path, and the reference the kernel equals)."""
        c = self.num_classes
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
        self.loss_sum += loss.detach().to(self.loss_sum.dtype)
        self.loss_count += 1

    def compute(self) -> dict[str, torch.Tensor]:
        """The mean loss and every score (see the class docstring). Reads back one number, the count of invalid
        labels, and raises ``ValueError`` when it is not 0."""
        invalid = int(self.invalid_labels)  # one read-back per compute, none per update
        if invalid:
            raise ValueError(
                f"{invalid} prediction(s) or target(s) outside 0..{self.num_classes - 1} reached FusedMetrics "
                f"since its last reset and were left out of the counts; fix the labels, or pass "
                f"ignore_index=<the padding label> (now {self.ignore_index}) to skip them.")
        return {"loss": self.loss_sum / self.loss_count, **scores(self.tp, self.fp, self.fn, self.zero_division,
                                                                  self.per_class)}


# What torchmetrics' forward changes on its way and puts back only at its end (torchmetrics 1.9.0 metric.py:364-402,
# _forward_reduce_state_update: reset() at :374, the batch's flags set at :377-381 and restored at :388-398; the
# same in _forward_full_state_update, :319-362).
_FORWARD_FLAGS = ("_update_count", "_computed", "_forward_cache", "_to_sync", "_should_unsync", "_enable_grad",
                  "compute_on_cpu", "_is_synced", "_cache")


def _forward_or_restore(metric: Metric, forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``forward(*args, **kwargs)``; if it raises, the metric's states and forward's flags are put back first.

    torchmetrics' forward resets the metric, updates it with the batch alone and computes the batch's
    values before it adds the saved states back and restores its flags. An exception on the way (an
    invalid label found by ``compute``, a bad input refused by ``update``) skips both: the metric would
    keep only the failed batch, and ``_to_sync`` (``dist_sync_on_step``, False by default) would make the
    next ``compute()`` skip the gather that the other DDP ranks wait in.
    """
    names = list(metric._defaults)
    current = [getattr(metric, name) for name in names]
    # the reduce path replaces every tensor state (reset, metric.py:767) before the batch's update, so the
    # tensors held now stay as they are; the full path (chosen at metric.py:312) updates them in place first
    # (metric.py:328), and reset() clears list states in place (metric.py:769): those are copied
    full = metric.full_state_update or metric.full_state_update is None or metric.dist_sync_on_step
    states = (metric._copy_state_dict() if full or not all(isinstance(s, torch.Tensor) for s in current)
              else dict(zip(names, current)))
    flags = {name: getattr(metric, name) for name in _FORWARD_FLAGS}
    try:
        return forward(*args, **kwargs)
    except BaseException:
        for name, value in {**states, **flags}.items():
            setattr(metric, name, value)
        raise


def _unsync_on_error(metric: Metric, compute: Callable[..., Any]) -> Callable[..., Any]:
    """``compute`` (torchmetrics' wrapped compute) that puts the local states back when it raises after syncing.

    torchmetrics' compute syncs in ``sync_context`` and unsyncs after its ``yield`` (metric.py:672-674, entered
    at :694), which an exception raised by the metric's compute skips: the metric would stay synced, holding
    the global states, and the next ``compute()`` would fail with "The Metric has already been synced."
    (``sync``, metric.py:596-597). Here the unsync that a return would have made is made before raising.
    """

    @functools.wraps(compute)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        synced_before = metric._is_synced
        try:
            return compute(*args, **kwargs)
        except BaseException:
            if metric._is_synced and not synced_before and metric._should_unsync:
                metric.unsync()
            raise

    return wrapped


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


def scores(tp: torch.Tensor, fp: torch.Tensor, fn: torch.Tensor, zero_division: float = 0.0,
           per_class: bool = False) -> dict[str, torch.Tensor]:
    """Accuracy, precision, recall and F1 with micro, macro and weighted averages from per-class counts.

    The arithmetic is torchmetrics' (``_safe_divide`` and ``_adjust_weights_safe_divide`` in
    ``torchmetrics.utilities.compute``), in float32 as there, on the device and without a sync;
    accuracy ignores ``zero_division``, as torchmetrics' does.

    Example:
        >>> s = scores(torch.tensor([1, 1, 0]), torch.tensor([0, 1, 0]), torch.tensor([1, 0, 0]))
        >>> round(float(s["precision_macro"]), 4), round(float(s["recall_weighted"]), 4)
        (0.75, 0.6667)
    """
    per = {
        "accuracy": _divide(tp, tp + fn, 0.0),
        "precision": _divide(tp, tp + fp, zero_division),
        "recall": _divide(tp, tp + fn, zero_division),
        "f1": _divide(2 * tp, 2 * tp + fn + fp, zero_division),
    }
    tps, fps, fns = tp.sum(), fp.sum(), fn.sum()
    micro = {
        "accuracy": _divide(tps, tps + fns, 0.0),
        "precision": _divide(tps, tps + fps, zero_division),
        "recall": _divide(tps, tps + fns, zero_division),
        "f1": _divide(2 * tps, 2 * tps + fns + fps, zero_division),
    }
    present = (tp + fp + fn > 0).float()  # macro leaves out classes seen in neither preds nor targets
    support = tp + fn
    out = {}
    for name in SCORES:
        out[f"{name}_micro"] = micro[name]
        out[f"{name}_macro"] = _divide(present * per[name], present.sum(), 0.0).sum()
        out[f"{name}_weighted"] = _divide(support * per[name], support.sum(), 0.0).sum()
        if per_class:
            out[f"{name}_per_class"] = per[name]
    return out


def _divide(num: torch.Tensor, denom: torch.Tensor, zero_division: float) -> torch.Tensor:
    """torchmetrics' ``_safe_divide``: float32 (or the input's float dtype), ``zero_division`` where denom is 0."""
    num = num if num.is_floating_point() else num.float()
    denom = denom if denom.is_floating_point() else denom.float()
    return torch.where(denom != 0, num / denom, torch.full((), zero_division, dtype=num.dtype, device=num.device))
