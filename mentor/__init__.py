"""mentor: collect training metrics in PyTorch without slowing training down.

The library, what a training loop imports (each module imports nothing from ``mentor.lab``):

- ``mentor.suite``: :class:`~mentor.suite.FusedMetrics`, the loss mean and every multiclass score (top-k
  accuracy too) in one torchmetrics ``Metric`` whose update never syncs and whose ``compute()`` reads nothing back
- ``mentor.binary``, ``mentor.multilabel``: :class:`~mentor.binary.FusedBinary` and
  :class:`~mentor.multilabel.FusedMultilabel`, the same for binary and multilabel classifiers
- ``mentor.invalid``: a report's count of invalid labels, and the error its reader raises
- ``mentor.readback``: :class:`~mentor.readback.DeferredReadback`, values read back a few steps late
  without making the host wait
- ``mentor.sync_free``: sync-free variants of torchmetrics classes (``suppress_nan_check``,
  ``scatter_stat_scores``) and ``host_scalar`` for host-side numbers
- ``mentor.flat_sync``: metrics whose states all sum, synced across ranks in one all-reduce
- ``mentor.syncs``: ``sync_guard`` and ``count_syncs``, every host-device sync with its file:line
- ``mentor.measure``: measuring your own loop: ``profiling_session``, ``gpu_idle_share`` of its trace (which
  regime it is in), ``update_cost`` (syncs, kernels and host µs of one update)
- ``mentor.pytest_plugin``: the ``no_syncs`` marker and fixture for your test suite

The lab, ``mentor.lab``, is what the book measures and draws with (its docstring lists its modules).
"""

__version__ = "0.1.0"
