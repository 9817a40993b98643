"""mentor: collect training metrics in PyTorch without slowing training down.

The library, what a training loop imports (each module imports nothing from ``mentor.lab``):

- ``mentor.suite``: :class:`~mentor.suite.FusedMetrics`, the loss mean and every multiclass score in one
  torchmetrics ``Metric`` whose update never syncs
- ``mentor.readback``: :class:`~mentor.readback.DeferredReadback`, values read back a few steps late
  without making the host wait
- ``mentor.sync_free``: sync-free variants of torchmetrics classes (``suppress_nan_check``,
  ``scatter_stat_scores``) and ``host_scalar`` for host-side numbers
- ``mentor.flat_sync``: metrics whose states all sum, synced across ranks in one all-reduce
- ``mentor.syncs``: ``sync_guard`` and ``count_syncs``, every host-device sync with its file:line
- ``mentor.pytest_plugin``: the ``no_syncs`` marker and fixture for your test suite

The lab, ``mentor.lab``, is what the book measures and draws with (its docstring lists its modules).
"""

import warnings as _warnings

with _warnings.catch_warnings():
    # Libraries on some images import tqdm.auto, which warns inside Jupyter when ipywidgets is
    # missing; importing it once here, quietly, keeps that warning out of the notebooks' outputs.
    _warnings.filterwarnings("ignore", message="IProgress not found")
    import tqdm.auto  # noqa: F401

__version__ = "0.1.0"
