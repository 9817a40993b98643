"""Record the small profiler traces under tests/data that the CPU tests of mentor.lab.trace read.

Run on a CUDA machine: python scripts/record_test_traces.py [OUTDIR]
Each trace covers 3 profiled steps of a small ResNet-18 run (batch 16, 64 px, 100 classes).
"""

import sys
from pathlib import Path

import torch

from mentor.lab.data import device_batches
from mentor.lab.metric_sets import metric_set
from mentor.lab.profiling import ranged_mean_metric, record_steps, step_syncs
from mentor.lab.train import build_setup

if not torch.cuda.is_available():
    sys.exit("record the test traces on a CUDA machine")
out = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data")
setup = build_setup(num_classes=100, device="cuda")
batches = device_batches(16, image_size=64, num_classes=100, device="cuda")
naive = metric_set("naive", num_classes=100, device="cuda")
optimized = metric_set("optimized", num_classes=100, device="cuda")
ranged = ranged_mean_metric()().cuda()
hooks = {
    "no_metrics": None,
    "naive": lambda s: naive.update(s.loss, s.output, s.labels),
    "optimized": lambda s: optimized.update(s.loss, s.output, s.labels),
    "ranged_mean": lambda s: ranged.update(s.loss),
}
for name, hook in hooks.items():
    path = record_steps(setup, batches, out / f"{name}.json.gz", on_step=hook, warmup=1, active=3)
    print(name, [s.count for s in step_syncs(path)], f"{path.stat().st_size // 1024} KiB")
