"""CUDA paths of mentor.data and mentor.ddp. Skipped without CUDA; run on the GPU machine with `pytest -m gpu`."""

import itertools

import pytest
import torch

from mentor.data import DevicePrefetcher, copy_ms, host_batches
from mentor.ddp import placements_cost
from mentor.profiling import sync_guard

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_host_batches_are_pinned():
    images, labels = next(host_batches(2, image_size=8, num_classes=10))
    assert images.is_pinned() and labels.is_pinned()


def test_prefetcher_delivers_the_same_batches_on_the_gpu_without_a_sync():
    expected = list(itertools.islice(host_batches(4, 8, 10, distinct=3), 6))
    prefetched = iter(DevicePrefetcher(host_batches(4, 8, 10, distinct=3), "cuda"))
    next(prefetched)  # the first batch creates the side stream
    with sync_guard() as report:
        got = [next(prefetched) for _ in range(5)]
        sums = [x.sum() * 1 for x, _ in got]  # use them on the compute stream
    assert report.count == 0, report.table()
    for (x, y), (ex, ey), s in zip(got, expected[1:], sums):
        assert x.device.type == "cuda" and torch.equal(x.cpu(), ex) and torch.equal(y.cpu(), ey)
        assert float(s) == pytest.approx(float(ex.sum()), rel=1e-5)


def test_copy_ms_is_in_the_range_of_a_pcie_or_c2c_link():
    # 128 x 3 x 224 x 224 float32 = 77 MB; any host link of 10 to 1000 GB/s lands in this range
    assert 0.077 < copy_ms(128, 224, repeats=5) < 7.7


def test_one_rank_nccl_placements():
    rows = {r["placement"]: r for r in placements_cost("nccl", ["default group", "gloo subgroup", "gpu"], repeats=3)}
    assert rows["default group"]["error"] == "No backend type associated with device type cpu"
    assert rows["gloo subgroup"]["values"] == [1.0] and rows["gpu"]["values"] == [1.0]
    (mixed,) = placements_cost("cpu:gloo,cuda:nccl", ["default group"], repeats=3)
    assert mixed["values"] == [1.0]


def test_debug_mode_count_sees_item_and_not_device_synchronize():
    from mentor.profiling import debug_mode_count

    x = torch.rand(10, device="cuda")
    assert debug_mode_count(lambda: x.sum().item()) == 1
    assert debug_mode_count(lambda: torch.cuda.synchronize()) == 0
    assert torch.cuda.get_sync_debug_mode() == 0


# --- mentor.bench, mentor.profiling.audit and host_scalar on CUDA ---


def test_compare_counts_syncs_per_step_and_per_report_exactly():
    from mentor.bench import Config, compare, metrics_config
    from mentor.train import build_setup
    from mentor.data import device_batches

    setup = build_setup(num_classes=10, device="cuda")
    batches = device_batches(4, image_size=32, num_classes=10, device="cuda")
    cmp = compare([Config("none"), metrics_config("naive", 10, "cuda"), metrics_config("optimized", 10, "cuda")],
                  setup, batches, steps=3, warmup=1, rounds=2, report_every=2, sync_steps=4, progress=False)
    # naive: the NaN check reads two booleans back per step; a report reads all five values back in one copy
    assert (cmp["naive"].syncs_per_step, cmp["naive"].report_syncs) == (2.0, 1)
    assert (cmp["optimized"].syncs_per_step, cmp["optimized"].report_syncs) == (0.0, 1)
    assert cmp["none"].syncs_per_step == 0.0 and cmp["none"].report_syncs is None
    assert cmp["naive"].syncs_note in (None, "")


def test_audit_warms_each_case_up_before_counting():
    from torchmetrics import MeanMetric
    from mentor.profiling import audit

    m = MeanMetric().cuda()  # the first update allocates and moves state; audit must not count it
    calls = []

    def update():
        calls.append(1)
        m.update(torch.ones((), device="cuda"))

    table = audit({"MeanMetric.update": update})
    assert len(calls) == 2  # one untimed warm-up, one counted
    first = table.splitlines()[0]
    assert first == f"{'MeanMetric.update':<72} 2 syncs", table


def test_host_scalar_stays_on_the_host():
    from mentor.metrics import host_scalar

    t = host_scalar(0.25)
    assert t.device.type == "cpu" and t.dtype == torch.float32
    with pytest.raises(ValueError, match="this tensor is on cuda:0"):
        host_scalar(torch.ones((), device="cuda"))
