"""Record the small profiler traces under tests/data that the CPU tests of mentor.trace read.

Run on a CUDA machine: python scripts/record_test_traces.py OUTDIR
Each trace covers 3 profiled steps of a small ResNet-18 run (batch 16, 64 px, 100 classes).
"""

import sys
from pathlib import Path

import torch

from mentor.data import device_batches
from mentor.metrics import metric_set
from mentor.profiling import profiling_session, ranged_mean_metric, step_syncs
from mentor.train import build_setup, train

out = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data")
out.mkdir(parents=True, exist_ok=True)
assert torch.cuda.is_available(), "record the test traces on a CUDA machine"
setup = build_setup(num_classes=100, device="cuda")
batches = device_batches(16, image_size=64, num_classes=100, device="cuda")


def record(name, on_step):
    train(setup, batches, steps=3, on_step=on_step)
    path = out / f"{name}.json.gz"
    with profiling_session(path, wait=0, warmup=1, active=3) as prof:
        train(setup, batches, steps=4, on_step=on_step, profiler=prof)
    print(name, [s.count for s in step_syncs(path)], f"{path.stat().st_size // 1024} KiB")


record("no_metrics", None)
naive = metric_set("naive", num_classes=100, device="cuda")
record("naive", lambda s: naive.update(s.loss, s.output, s.labels))
opt = metric_set("optimized", num_classes=100, device="cuda")
record("optimized", lambda s: opt.update(s.loss, s.output, s.labels))
ranged = ranged_mean_metric()().cuda()
record("ranged_mean", lambda s: ranged.update(s.loss))
