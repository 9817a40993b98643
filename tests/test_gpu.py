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


def test_scatter_stat_scores_with_ignore_index_is_sync_free_and_matches_torchmetrics():
    torch.manual_seed(0)
    logits = torch.randn(64, 10, device="cuda")
    target = torch.randint(0, 10, (64,), device="cuda")
    target[::4] = -100  # a quarter of the labels ignored, as a loss with ignore_index=-100 would
    fast = warm(scatter_stat_scores(MulticlassPrecision)(num_classes=10, ignore_index=-100).cuda(), logits, target)
    report = count_syncs(fast.update, logits, target)
    assert report.count == 0, report.table()
    reference = MulticlassPrecision(num_classes=10, ignore_index=-100).cuda()
    reference.update(logits, target)
    reference.update(logits, target)
    assert torch.equal(fast.compute(), reference.compute())


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


# ----------------------------------------------------------------------------------------------------------
# sync_guard beyond torch's sync debug mode: the wrapped calls (mentor.profiling._intercept)

import re  # noqa: E402 - imports of the tests added below
import sys  # noqa: E402
import warnings  # noqa: E402

import torch.distributed as dist  # noqa: E402

from mentor.ddp import single_rank_group  # noqa: E402
from mentor.profiling import DEBUG_MODE, PAGEABLE_COPY, audit  # noqa: E402


def _here():
    """The line number of the caller's current line."""
    return sys._getframe(1).f_lineno


def _recorded_event():
    event = torch.cuda.Event()
    event.record()
    return event


# each is a one-line lambda: the site's line is the lambda's first line
NEW_CALLS = {
    "torch.cuda.synchronize": lambda: torch.cuda.synchronize(),
    "Event.synchronize": lambda: _recorded_event().synchronize(),
    "Stream.synchronize": lambda: torch.cuda.current_stream().synchronize(),
    "empty_cache": lambda: torch.cuda.empty_cache(),
    PAGEABLE_COPY: lambda: torch.empty(1024).copy_(torch.ones(1024, device="cuda"), non_blocking=True),
}
if hasattr(torch, "accelerator") and hasattr(torch.accelerator, "synchronize"):
    NEW_CALLS["torch.accelerator.synchronize"] = lambda: torch.accelerator.synchronize()


def _warm(call):
    call()  # first-call allocations and lazy initialisation happen outside the guard
    torch.cuda.synchronize()


@pytest.mark.parametrize("kind", list(NEW_CALLS))
def test_sync_guard_sees_a_call_the_debug_mode_misses(kind):
    call = NEW_CALLS[kind]
    _warm(call)
    with sync_guard() as report:
        call()
    torch.cuda.synchronize()
    # exactly one site: for Stream.synchronize the debug mode's own warning is folded into the wrapped call
    assert [s.kind for s in report.sites] == [kind], report.table()
    site = report.sites[0]
    assert site.file == __file__
    assert site.line == call.__code__.co_firstlineno
    assert site.where == f"tests/test_gpu.py:{site.line}"


@pytest.mark.parametrize("kind", list(NEW_CALLS))
def test_sync_guard_strict_raises_for_a_call_the_debug_mode_misses(kind):
    call = NEW_CALLS[kind]
    _warm(call)
    before = torch.cuda.get_sync_debug_mode()
    line = call.__code__.co_firstlineno
    with pytest.raises(SyncError, match=rf"^{re.escape(kind)} at tests/test_gpu.py:{line} "):
        with sync_guard(strict=True):
            call()
    torch.cuda.synchronize()
    assert torch.cuda.get_sync_debug_mode() == before


def test_sync_guard_sees_collectives_in_a_one_rank_nccl_group():
    with single_rank_group("nccl"):
        t = torch.ones(4, device="cuda")
        dist.all_reduce(t)  # warm: the communicator
        dist.barrier()
        torch.cuda.synchronize()
        calls = {
            "all_reduce": lambda: dist.all_reduce(t),
            "barrier": lambda: dist.barrier(),
            "all_gather_object": lambda: dist.all_gather_object([None], {"a": 1}),
        }
        for name, call in calls.items():
            call()
            torch.cuda.synchronize()
            with sync_guard() as report:
                call()
            torch.cuda.synchronize()
            # one site per call, whatever the call syncs inside (all_gather_object reads sizes back)
            assert [s.kind for s in report.sites] == [f"collective: {name}"], report.table()
            assert (report.sites[0].file, report.sites[0].line) == (__file__, call.__code__.co_firstlineno)
            with pytest.raises(SyncError, match=rf"^collective: {name} at tests/test_gpu.py:\d+ "):
                with sync_guard(strict=True):
                    call()
        out = [torch.zeros(4, device="cuda")]
        with pytest.raises(SyncError, match=r"^collective: all_gather at tests/test_gpu.py:\d+ "):
            with sync_guard(strict=True):
                dist.all_gather(out, t)
        torch.cuda.synchronize()
        assert torch.equal(out[0], torch.zeros(4, device="cuda"))  # the original collective was not called


def test_sync_guard_ignores_pinned_and_to_cpu_non_blocking_copies():
    src = torch.ones(1024, device="cuda")
    pinned = torch.empty(1024, pin_memory=True)
    pinned.copy_(src, non_blocking=True)
    src.to("cpu", non_blocking=True)
    torch.cuda.synchronize()
    with sync_guard() as report:
        pinned.copy_(src, non_blocking=True)
        out = src.to("cpu", non_blocking=True)
    torch.cuda.synchronize()
    assert PAGEABLE_COPY not in report.by_kind(), report.table()
    assert out.is_pinned()  # _to_copy allocates a pinned output for a non_blocking CUDA-to-CPU copy


def test_torch_debug_mode_alone_misses_device_and_event_synchronize():
    # the gap that the wrappers fill: c10::cuda::device_synchronize and CUDAEvent::synchronize have no
    # warn_or_error_on_sync check, stream_synchronize (behind .item() and Stream.synchronize) has
    x = torch.ones((), device="cuda")
    event = _recorded_event()
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.synchronize()
            event.synchronize()
            missed = [str(w.message) for w in caught]
            x.item()
            torch.cuda.current_stream().synchronize()
            flagged = [str(w.message) for w in caught][len(missed):]
        torch.cuda.set_sync_debug_mode("error")
        torch.cuda.synchronize()  # no error in error mode either
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    assert not [m for m in missed if "synchroniz" in m.lower()], missed
    assert len([m for m in flagged if "synchroniz" in m.lower()]) == 2, flagged


def test_sync_guard_still_sees_item_once_as_debug_mode():
    t = torch.ones((), device="cuda")
    with sync_guard() as report:
        _read_back(t)
        torch.cuda.synchronize(); line = _here()  # noqa: E702
    assert [s.kind for s in report.sites] == [DEBUG_MODE, "torch.cuda.synchronize"], report.table()
    assert report.sites[0].function == "_read_back"
    assert report.sites[1].line == line
    assert report.table().splitlines()[1].endswith("  [torch.cuda.synchronize]")


def test_nested_sync_guards_restore_the_outer_guard():
    original = torch.cuda.synchronize
    with sync_guard() as outer:
        torch.cuda.synchronize()
        with sync_guard(strict=True) as inner:
            with pytest.raises(SyncError, match="torch.cuda.synchronize at tests/test_gpu.py"):
                torch.cuda.synchronize()
        assert torch.cuda.get_sync_debug_mode() == 1  # "warn", the outer guard's mode
        torch.cuda.synchronize()
    assert torch.cuda.synchronize is original
    assert (outer.count, inner.count) == (2, 1)


def test_sync_guard_restores_the_wrapped_calls_when_the_body_raises():
    originals = (torch.cuda.synchronize, torch.cuda.Event.synchronize, torch.cuda.empty_cache, torch.Tensor.copy_)
    with pytest.raises(KeyError):
        with sync_guard():
            raise KeyError("body")
    assert (torch.cuda.synchronize, torch.cuda.Event.synchronize, torch.cuda.empty_cache,
            torch.Tensor.copy_) == originals


def test_audit_shows_the_kind_of_a_wrapped_call():
    table = audit({"device sync": lambda: torch.cuda.synchronize()}); line = _here()  # noqa: E702
    assert table.splitlines()[:2] == [f"{'device sync':<73} 1 sync",
                                      f"  1x tests/test_gpu.py:{line}  [torch.cuda.synchronize]"], table


def test_blocking_copy_under_the_copy_wrapper_points_at_the_caller():
    # copy_ is wrapped while the guard is on; the debug mode's warning for a blocking D2H copy still names
    # the line that called copy_, not the wrapper
    src = torch.ones(4, device="cuda")
    dst = torch.empty(4)
    dst.copy_(src)
    with sync_guard() as report:
        dst.copy_(src); line = _here()  # noqa: E702
    assert [(s.kind, s.file, s.line) for s in report.sites] == [(DEBUG_MODE, __file__, line)], report.table()
    with pytest.raises(SyncError, match=r"synchronizing CUDA call at tests/test_gpu.py:\d+"):
        with sync_guard(strict=True):
            dst.copy_(src)
