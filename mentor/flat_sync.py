"""One all-reduce per sync for torchmetrics metrics whose states all reduce with ``"sum"``.

torchmetrics syncs a metric state by state (``Metric._sync_dist`` applies ``gather_all_tensors``
to each): per state a barrier, then one ``all_gather`` for a 0-dim state or two for a 1-dim one
(the shapes, then the data), and the gathered copies are stacked and summed on every rank
(``torch.sum(..., dim=0)``). When every state is a tensor summed across ranks, the same result
comes from concatenating the states into one float64 buffer, one ``all_reduce(SUM)``, and
splitting it back: :func:`flat_sync` makes that subclass.

Each state comes back with the dtype and the value that torchmetrics' sync gives it:

- a bool or integer state is summed exactly and comes back as int64, as ``torch.sum`` widens it
  (an int32 count of 2**30 on two ranks is 2**31, a uint8 200 + 200 is 400, True + True is 2).
  It travels as two float64 numbers, its high and low 32 bits, whose sums stay exact (below 2**53)
  for up to 2**21 ranks, so int64 counts above 2**53 are exact too;
- a floating state keeps its dtype: it is summed in float64 and rounded once, which for two ranks
  is torchmetrics' value to the last bit (for more ranks it can be closer to the exact sum).

A state that is a list, or of another dtype (complex), or reduced otherwise than by sum, or a
custom ``dist_sync_fn`` passed to the metric, makes the subclass fall back to torchmetrics' own
sync for that call.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_sum
from torchmetrics.utilities.distributed import gather_all_tensors

from mentor._named import named_subclass

PREFIX = "FlatSync"


# the states summed exactly: torch.sum, torchmetrics' dim_zero_sum (torchmetrics 1.9.0 utilities/data.py:39-41,
# applied to the stacked gathered states at metric.py:533-539), returns them as int64
_INTEGER = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
_LOW_BITS = 2**32


def _flat_sync_dist(base: type[Metric]) -> Any:
    """The ``_sync_dist`` of ``FlatSync<base>``: one all-reduce, or ``base``'s own sync when it does not apply."""

    def _sync_dist(self: Any, dist_sync_fn: Any = gather_all_tensors, process_group: Any = None) -> None:
        names = list(self._reductions)
        states = [getattr(self, name) for name in names]
        if (dist_sync_fn is not gather_all_tensors or not names
                or any(self._reductions[n] is not dim_zero_sum for n in names)
                or not all(isinstance(s, torch.Tensor) and (s.dtype in _INTEGER or s.is_floating_point())
                           for s in states)):
            return base._sync_dist(self, dist_sync_fn, process_group=process_group)
        floats = [s for s in states if s.is_floating_point()]
        ints = [s for s in states if not s.is_floating_point()]
        parts = [s.detach().reshape(-1).to(torch.float64) for s in floats]
        if ints:
            whole = torch.cat([s.detach().reshape(-1).to(torch.int64) for s in ints])
            # x = high * 2**32 + low, with low in [0, 2**32): each half is exact in float64, and so are their sums
            parts += [(whole >> 32).to(torch.float64), (whole & (_LOW_BITS - 1)).to(torch.float64)]
        flat = torch.cat(parts)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=process_group or self.process_group)
        n_float, n_int = sum(s.numel() for s in floats), sum(s.numel() for s in ints)
        float_sums = iter(flat[:n_float].split([s.numel() for s in floats]) if floats else ())
        high, low = flat[n_float:n_float + n_int].to(torch.int64), flat[n_float + n_int:].to(torch.int64)
        int_sums = iter((high * _LOW_BITS + low).split([s.numel() for s in ints]) if ints else ())  # wraps as int64
        for name, state in zip(names, states):
            if state.is_floating_point():
                summed = next(float_sums).to(state.dtype)
            else:
                summed = next(int_sums)
            setattr(self, name, summed.view(state.shape))
        return None

    return _sync_dist


def flat_sync(metric_cls: type[Metric]) -> type[Metric]:
    """The subclass ``FlatSync<Name>`` of a torchmetrics metric class that syncs its states in one all-reduce.

    The same class always gives the same subclass, a name in this module (made by ``mentor._named.named_subclass``),
    so that ``isinstance`` works and instances pickle.

    Example:
        >>> from torchmetrics import MeanMetric
        >>> m = flat_sync(MeanMetric)()
        >>> m.update(torch.tensor([1.0, 3.0]))
        >>> type(m).__name__, float(m.compute())
        ('FlatSyncMeanMetric', 2.0)
    """
    if not (isinstance(metric_cls, type) and issubclass(metric_cls, Metric)):
        raise TypeError(f"flat_sync takes a torchmetrics Metric class such as MeanMetric or "
                        f"mentor.suite.FusedMetrics, not {metric_cls!r}.")
    if metric_cls.__module__ == __name__:  # already made here: flat_sync(flat_sync(C)) is flat_sync(C)
        return metric_cls
    doc = (f"{metric_cls.__name__} whose states are synced across ranks in one all-reduce of one flat buffer "
           "(mentor.flat_sync).")
    return named_subclass(globals(), PREFIX, metric_cls, {"_sync_dist": _flat_sync_dist(metric_cls)}, doc)


def __getattr__(name: str) -> type:
    """Make ``mentor.flat_sync.FlatSync<Name>`` importable before it was made (unpickling in a fresh process)."""
    import torchmetrics

    from mentor import suite

    base_name = name[len(PREFIX):] if name.startswith(PREFIX) else ""
    for module in (suite, torchmetrics, torchmetrics.aggregation, torchmetrics.classification):
        base = getattr(module, base_name, None) if base_name else None
        if isinstance(base, type) and issubclass(base, Metric):
            return flat_sync(base)
    raise AttributeError(f"module 'mentor.flat_sync' has no attribute {name!r}")
