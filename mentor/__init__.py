"""mentor: training, profiling and benchmarking helpers for collecting metrics without slowing training.

One module per job:

- ``mentor.env``: device choice, run profiles and the environment report
- ``mentor.data``: synthetic data (the article's dataset, loader, GPU-resident batches)
- ``mentor.train``: the toy ResNet-18 setup and a training loop that times steps without syncing
- ``mentor.metrics``: sync-free TorchMetrics variants, the article's metric sets, TensorBoard logging
- ``mentor.suite``: the fused metric suite: mean loss and multiclass scores in one Metric, no sync per update
- ``mentor.profiling``: profiler sessions, per-step sync counts, ``sync_guard`` and ``count_syncs``
- ``mentor.trace``: reading Chrome traces: steps, syncs, GPU idle time, a timeline figure
- ``mentor.bench``: interleaved comparisons of configurations (``python -m mentor.bench``)
- ``mentor.ddp``: a one-rank process group and worker processes that clean up
"""

import warnings as _warnings

with _warnings.catch_warnings():
    # Libraries on some images import tqdm.auto, which warns inside Jupyter when ipywidgets is
    # missing; importing it once here, quietly, keeps that warning out of the notebooks' outputs.
    _warnings.filterwarnings("ignore", message="IProgress not found")
    import tqdm.auto  # noqa: F401

__version__ = "0.1.0"
