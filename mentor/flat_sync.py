"""One all-reduce per sync for torchmetrics metrics whose states all reduce with ``"sum"``.

torchmetrics syncs a metric state by state (``Metric._sync_dist`` applies ``gather_all_tensors``
to each): per state a barrier, then one ``all_gather`` for a 0-dim state or two for a 1-dim one
(the shapes, then the data), and the gathered copies are summed on every rank. When every state
is a tensor summed across ranks, the same result comes from concatenating the states into one
float64 buffer, one ``all_reduce(SUM)``, and splitting it back: :func:`flat_sync` makes that
subclass. Counts stay exact below 2**53; a float32 state is summed in float64 and rounded once.

A state that is a list, or reduced otherwise than by sum, or a custom ``dist_sync_fn`` passed to
the metric, makes the subclass fall back to torchmetrics' own sync for that call.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_sum
from torchmetrics.utilities.distributed import gather_all_tensors

_MADE: dict[type, type] = {}
PREFIX = "FlatSync"


def _flat_sync_dist(base: type[Metric]) -> Any:
    """The ``_sync_dist`` of ``FlatSync<base>``: one all-reduce, or ``base``'s own sync when it does not apply."""

    def _sync_dist(self: Any, dist_sync_fn: Any = gather_all_tensors, process_group: Any = None) -> None:
        names = list(self._reductions)
        states = [getattr(self, name) for name in names]
        if (dist_sync_fn is not gather_all_tensors or not names
                or any(self._reductions[n] is not dim_zero_sum for n in names)
                or not all(isinstance(s, torch.Tensor) for s in states)):
            return base._sync_dist(self, dist_sync_fn, process_group=process_group)
        flat = torch.cat([s.detach().reshape(-1).to(torch.float64) for s in states])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=process_group or self.process_group)
        offset = 0
        for name, state in zip(names, states):
            setattr(self, name, flat[offset: offset + state.numel()].view(state.shape).to(state.dtype))
            offset += state.numel()
        return None

    return _sync_dist


def flat_sync(metric_cls: type[Metric]) -> type[Metric]:
    """The subclass ``FlatSync<Name>`` of a torchmetrics metric class that syncs its states in one all-reduce.

    The same class always gives the same subclass, a name in this module, so that ``isinstance``
    works and instances pickle.

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
    if metric_cls in _MADE.values():
        return metric_cls
    if metric_cls not in _MADE:
        name = PREFIX + metric_cls.__name__
        taken = globals().get(name)
        if taken is not None:
            raise TypeError(f"mentor.flat_sync.{name} already exists for another class named {metric_cls.__name__}; "
                            f"give {metric_cls.__module__}.{metric_cls.__qualname__} another name so that both "
                            "can be pickled.")
        doc = (f"{metric_cls.__name__} whose states are synced across ranks in one all-reduce of one flat buffer "
               "(mentor.flat_sync).")
        cls = type(name, (metric_cls,), {"_sync_dist": _flat_sync_dist(metric_cls), "__module__": __name__, "__qualname__": name,
                                         "__doc__": doc})
        globals()[name] = cls
        _MADE[metric_cls] = cls
    return _MADE[metric_cls]


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
