"""mentor.lab: what the book measures and draws with. A training loop does not need it.

The tools a reader measures their own loop with (a profiling session, the GPU's idle share of a traced loop,
what one update costs) are the library's, ``mentor.measure``; the modules below import them under their old
names.

One module per job:

- ``mentor.lab.env``: device choice, run profiles, the environment report and the notebooks' stored runs
- ``mentor.lab.data``: synthetic data (the article's dataset, loader, GPU-resident batches)
- ``mentor.lab.train``: the toy ResNet-18 setup and a training loop that times steps without syncing
- ``mentor.lab.metric_sets``: the article's metric sets and their variants, the ways of grouping them
- ``mentor.lab.tensorboard``: logging computed values to TensorBoard and reading them back
- ``mentor.lab.trace``: reading Chrome traces for the book: syncs, waits, host time, each step's GPU idle time
- ``mentor.lab.host_calls``: which CUDA API calls took a range's host time, call name by call name
- ``mentor.lab.profiling``: the book's traced steps, per-step sync counts in a trace, sync audits
- ``mentor.lab.stats``: step-time results and the paired bootstrap interval of an overhead
- ``mentor.lab.comparison``: the result of a comparison (overheads, verdicts, table, JSON) and sweeps of them
- ``mentor.lab.configs``: the configurations and operating points the chapters compare
- ``mentor.lab.compare``: the measuring loop: interleaved rounds, sweeps over operating points
- ``mentor.lab.blocks``: the same in short alternating blocks, for host-bound steps that drift
- ``mentor.lab.baselines``: cheaper ways to use torchmetrics as it is: grouped, every n steps, buffered
- ``mentor.lab.across_runs``: the same sweep run several times: what moved between runs and what held
- ``mentor.lab.wording``: what a run resolved, in words computed from its intervals, for the chapters' glue
- ``mentor.lab.stored``: what another chapter stored: the values its notebook glued, for pages that gather results
- ``mentor.lab.targets``: the suite's overhead targets applied to a loop's A/A and suite intervals
- ``mentor.lab.decomposition``: where the suite's time goes in a loop, read back from a stored decomposition
- ``mentor.lab.regimes``: which regime each of the book's operating points is in, measured, as a table
- ``mentor.lab.bench``: the command line, ``python -m mentor.lab.bench``
- ``mentor.lab.figures``: figures at phone width, glued as SVG with text kept as text
- ``mentor.lab.plots``: every figure the book draws from these results
- ``mentor.lab.updates``: the metric updates the book measures, by name
- ``mentor.lab.update_cost``: the book's tables of what updates cost (syncs, kernels, host time)
- ``mentor.lab.releases``: syncs per update under two torchmetrics releases
- ``mentor.lab.read_patterns``: the usual ways of reading the loss back, as configurations
- ``mentor.lab.compiled``: metric updates under ``torch.compile``: graph breaks and recompiles
- ``mentor.lab.compiled_step``: a metric update inside the reader's compiled step: breaks, graphs, kernels
- ``mentor.lab.compiled_loop``: what an update costs in the loop when the model is compiled, at each point
- ``mentor.lab.frameworks``: the same step under PyTorch Lightning and Accelerate, metrics logged their way or the suite's
- ``mentor.lab.ddp``: a one-rank process group and worker processes that clean up
- ``mentor.lab.worker``: one rank of a two-GPU measurement, started with torchrun
"""

import warnings as _warnings

with _warnings.catch_warnings():
    # Libraries on some images import tqdm.auto (huggingface_hub/utils/tqdm.py:93, accelerate/utils/tqdm.py:20),
    # which warns inside Jupyter when ipywidgets is missing ("IProgress not found", tqdm/autonotebook.py:28, tqdm
    # 4.70.1); importing it once here, quietly, keeps that warning out of the notebooks' outputs. Every notebook
    # imports mentor.lab before anything else of mentor. Here, not in mentor/__init__.py: the library needs no tqdm.
    _warnings.filterwarnings("ignore", message="IProgress not found")
    import tqdm.auto  # noqa: F401
