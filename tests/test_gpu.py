"""Exact sync counts on a CUDA device. Skipped without CUDA; run on the GPU machine with `pytest -m gpu`."""

import inspect

import pytest
import torch
from torchmetrics import MeanMetric
from torchmetrics import Precision
from torchmetrics.classification import MulticlassPrecision

from mentor.data import device_batches
from mentor.metrics import host_scalar, metric_set, scatter_stat_scores, suppress_nan_check
from mentor.profiling import SyncError, count_syncs, profiling_session, ranged_mean_metric, step_syncs, sync_guard
from mentor.train import build_setup, train

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture
def loss():
    return torch.rand((), device="cuda") + 1.0


def warm(metric, *args, **kwargs):
    """First update allocates and moves state; count from the second."""
    metric.update(*args, **kwargs)
    torch.cuda.synchronize()
    return metric


def test_default_mean_update_syncs_twice(loss):
    # torchmetrics 1.9.0: `if nans.any() or nans_weight.any()` reads two booleans back.
    m = warm(MeanMetric().cuda(), loss)
    report = count_syncs(m.update, loss)
    assert report.count == 2
    assert all(s.where.startswith("torchmetrics/aggregation.py:") for s in report.sites)


def test_float_weight_adds_a_copy(loss):
    # a Python float weight is copied to the GPU (blocking): one more sync than the default
    m = warm(MeanMetric().cuda(), loss)
    assert count_syncs(m.update, loss, weight=1.0).count == 3


def test_optimized_mean_update_does_not_sync(loss):
    m = warm(suppress_nan_check(MeanMetric)().cuda(), loss, weight=torch.ones_like(loss))
    assert count_syncs(m.update, loss, weight=torch.ones_like(loss)).count == 0


def test_builtin_disable_does_not_sync(loss):
    m = warm(MeanMetric(nan_strategy="disable").cuda(), loss)
    assert count_syncs(m.update, loss).count == 0


def test_float_update_of_gpu_metric_syncs_and_host_tensor_does_not():
    m = warm(MeanMetric().cuda(), 0.5)
    assert count_syncs(m.update, 0.5).count >= 1
    assert count_syncs(m.update, host_scalar(0.5)).count == 0


def test_classifier_syncs_and_fast_paths():
    logits = torch.randn(64, 1000, device="cuda")
    target = torch.randint(0, 1000, (64,), device="cuda")
    # the task wrappers default to micro averaging: counts are plain sums, no sync
    micro = warm(Precision(task="multiclass", num_classes=1000).cuda(), logits, target)
    assert count_syncs(micro.update, logits, target).count == 0
    # macro averaging counts per class with torch.bincount, which reads min and max back
    macro = warm(MulticlassPrecision(num_classes=1000).cuda(), logits, target)
    report = count_syncs(macro.update, logits, target)
    assert report.count == 2
    assert all(s.function == "_bincount" for s in report.sites)
    fast = warm(scatter_stat_scores(MulticlassPrecision)(num_classes=1000).cuda(), logits, target)
    assert count_syncs(fast.update, logits, target).count == 0


def test_optimized_set_is_sync_free():
    ms = metric_set("optimized", num_classes=1000, device="cuda")
    logits = torch.randn(32, 1000, device="cuda")
    target = torch.randint(0, 1000, (32,), device="cuda")
    loss = torch.nn.functional.cross_entropy(logits, target)
    ms.update(loss, logits, target)
    torch.cuda.synchronize()
    assert count_syncs(ms.update, loss, logits, target).count == 0


def _read_back(t):
    return t.item()  # the sync under test


def test_sync_guard_reports_file_and_line():
    t = torch.ones((), device="cuda")
    line = inspect.getsourcelines(_read_back)[1] + 1
    with sync_guard() as report:
        _read_back(t)
    assert report.count == 1
    assert report.sites[0].line == line
    assert report.sites[0].file == __file__
    assert report.sites[0].function == "_read_back"


def test_sync_guard_strict_raises_and_restores():
    before = torch.cuda.get_sync_debug_mode()
    with pytest.raises(SyncError, match="test_gpu.py"):
        with sync_guard(strict=True):
            _read_back(torch.ones((), device="cuda"))
    assert torch.cuda.get_sync_debug_mode() == before


def test_step_timer_adds_no_sync():
    setup = build_setup(num_classes=10, device="cuda")
    batches = device_batches(4, image_size=32, num_classes=10, device="cuda")
    train(setup, batches, steps=2)
    with sync_guard() as report:
        stats = train(setup, batches, steps=3, warmup=1)
    assert report.count == 0, report.table()
    assert len(stats.step_ms) == 3 and all(t > 0 for t in stats.step_ms)


def test_profiler_and_guard_agree(tmp_path):
    setup = build_setup(num_classes=100, device="cuda")
    batches = device_batches(8, image_size=32, num_classes=100, device="cuda")
    metric = ranged_mean_metric()().cuda()
    train(setup, batches, steps=2, on_step=lambda s: metric.update(s.loss))
    trace = tmp_path / "t.json.gz"
    with profiling_session(trace, wait=0, warmup=1, active=3) as prof:
        train(setup, batches, steps=4, on_step=lambda s: metric.update(s.loss), profiler=prof)
    steps = step_syncs(trace)
    assert [s.count for s in steps] == [2, 2, 2]
    assert all(set(s.ranges) == {"nan check: any()"} for s in steps)
