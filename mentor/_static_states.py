"""The state handling that mentor's fused metrics share: states that keep their memory, cut update and compute wrappers.

:class:`StaticStates` is a torchmetrics ``Metric`` whose states are static addresses for ``torch.compile`` (so an
update inside a ``reduce-overhead`` step runs in its CUDA graph), that keeps those tensors across DDP's sync and
unsync, a ``.to()`` and a state-dict load, drops its kernel launchers when the device may have changed, and counts
updates without a Python counter that would recompile a compiled step. A subclass whose ``compute`` returns new
tensors only may use :meth:`StaticStates._compute_without_copies` as its compute wrapper, and
:meth:`StaticStates._reset_in_place` as its ``reset`` outside ``forward``. :func:`_forward_or_restore` runs a metric's ``forward`` and
puts the metric back as it was when that raises (the fused metrics' and :mod:`mentor.sync_free`'s). :class:`mentor.suite.FusedMetrics`,
:class:`mentor.binary.FusedBinary` and :class:`mentor.multilabel.FusedMultilabel` derive from it; a subclass keeps
its launchers in ``self._launchers`` and its states in torchmetrics' ``add_state``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torchmetrics import Metric
from torchmetrics.utilities.prints import rank_zero_warn


class StaticStates(Metric):
    """A torchmetrics ``Metric`` whose states keep their memory (module docstring); mentor's fused metrics' base.

    Example:
        >>> class Count(StaticStates):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.add_state("n", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        ...         self._launchers = {}
        ...     def update(self, x):
        ...         self.n += x.numel()
        ...     def compute(self):
        ...         return self.n
        >>> c = Count()
        >>> c.update(torch.ones(3)); c.update(torch.ones(2))
        >>> int(c.compute()), c.update_called
        (5, True)
    """

    _compiled_updates = False
    """Whether an update ran under ``torch.compile`` since the last reset (such updates leave ``_update_count`` alone)."""

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
                self._compiled_updates = True  # a constant written, never read in the graph: no guard, no recompile
            else:
                attributes = self.__dict__
                attributes["_computed"] = None
                attributes["_update_count"] += 1
            update(*args, **kwargs)

        return wrapped

    @property
    def update_called(self) -> bool:
        """Whether ``update`` ran since the last reset, eager or compiled; nothing is read back."""
        return self._update_count > 0 or self._compiled_updates

    def _reset_in_place(self) -> None:
        """torchmetrics' reset of its flags, with every state zeroed in place by one ``torch._foreach_zero_``.

        torchmetrics' ``reset`` (metric.py:758-773) sets its flags and replaces each state by a clone of its default;
        here the same flags are set, the local states held by a sync that no unsync will restore are dropped, and the
        states keep their memory (one kernel on CUDA for all of them), so a CUDA graph that updates them keeps
        counting into them. Not for ``forward``, whose batch values need fresh states beside the saved ones: there
        torchmetrics' ``reset`` replaces them.
        """
        self._update_count = 0
        self._forward_cache = None
        self._computed = None
        self._cache = None
        self._is_synced = False
        self._compiled_updates = False
        self.__dict__.pop("_held", None)  # local states kept by a sync that no unsync will restore
        torch._foreach_zero_([getattr(self, name) for name in self._defaults])

    def _compute_without_copies(self, compute: Callable[..., Any]) -> Callable[..., Any]:
        """torchmetrics' compute wrapper without its copies, which puts the local states back when ``compute``
        raises after syncing (:func:`_unsync_on_error`); for a ``compute`` whose values share no memory with a state.

        torchmetrics' wrapper (metric.py:676-705) warns when no update ran, returns the cached values when
        there are some, computes inside ``sync_context`` (the DDP sync, then the unsync), squeezes one-element
        values and clones every value, "to avoid in-place operations after compute, altering already computed
        results", then caches them. This one does the same except the squeeze and the clones: the values are
        views of tensors ``compute`` has just made (a count copied from its state), so a later update or
        ``reset()`` cannot alter them. On CUDA the clones would be one kernel per value.
        """

        @functools.wraps(compute)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if not self.update_called:
                rank_zero_warn(f"The ``compute`` method of metric {self.__class__.__name__} was called before the "
                               f"``update`` method which may lead to errors, as metric states have not yet been "
                               f"updated.", UserWarning)
            if self._computed is not None:
                return self._computed
            with self.sync_context(dist_sync_fn=self.dist_sync_fn, should_sync=self._to_sync,
                                   should_unsync=self._should_unsync):
                value = compute(*args, **kwargs)
            if self.compute_with_cache:
                self._computed = value
            return value

        return _unsync_on_error(self, wrapped)


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


# What torchmetrics' forward changes on its way and puts back only at its end (torchmetrics 1.9.0 metric.py:364-402,
# _forward_reduce_state_update: reset() at :374, the batch's flags set at :377-381 and restored at :388-398; the
# same in _forward_full_state_update, :319-362).
_FORWARD_FLAGS = ("_update_count", "_computed", "_forward_cache", "_to_sync", "_should_unsync", "_enable_grad",
                  "compute_on_cpu", "_is_synced", "_cache")


def _forward_or_restore(metric: Metric, forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``forward(*args, **kwargs)``; if it raises, the metric's states and forward's flags are put back first.

    torchmetrics' forward resets the metric, updates it with the batch alone and computes the batch's
    values before it adds the saved states back and restores its flags. An exception on the way (a
    bad input refused by ``update``) skips both: the metric would
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
