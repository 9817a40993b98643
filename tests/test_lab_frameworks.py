"""mentor.lab.frameworks: the book's step under Lightning and Accelerate, timed in blocks. On the CPU: the shape of
each comparison, the report of every block falling at its timed position in both frameworks, the profiler's windows,
the refusals and the restored global state; on CUDA: the syncs each way makes, and where."""

from __future__ import annotations

import logging
import warnings

import pytest

pytest.importorskip("lightning", reason="the framework chapter needs lightning (requirements.txt)")
pytest.importorskip("accelerate", reason="the framework chapter needs accelerate (requirements.txt)")
import torch

from marks import gpu
from mentor.lab import frameworks as fw
from mentor.lab.configs import OperatingPoint
from mentor.lab.data import device_batches
from mentor.lab.env import get_profile
from mentor.suite import FusedMetrics

POINT = OperatingPoint("tiny", 2, 16)


def profile(device: str = "cpu"):
    return get_profile("smoke").with_(num_classes=5, device=torch.device(device))


@pytest.fixture(scope="module")
def compared():
    return fw.compare_frameworks(POINT, profile(), rounds=3, steps=4, settle=1, warmup_blocks=0, seed=3)


def test_each_framework_gets_its_own_comparison_against_its_own_loop_without_metrics(compared) -> None:
    assert list(compared) == ["Lightning", "Accelerate"]
    for framework, ways in fw.FRAMEWORKS.items():
        cmp = compared[framework]
        assert [r.name for r in cmp.results] == list(ways)
        assert cmp.baseline == "no metrics"
        assert cmp.settings["framework"] == framework
        assert cmp.settings["block"] == 1 + 4 + 1 and cmp.settings["report_every"] == 6
        assert cmp.settings["report_at"] == 2
        for r in cmp.results:
            assert [len(steps) for steps in r.round_step_ms] == [4, 4, 4]
            assert r.report_steps == [2]
            assert r.syncs_note == "n/a (CPU)"
        assert sorted(map(sorted, cmp.settings["orders"])) == [sorted(ways)] * 3
        assert len({tuple(o) for o in cmp.settings["orders"]}) > 1  # shuffled anew each round (seed 3)


def _compute_positions(run, suite: FusedMetrics, settle: int, steps: int) -> list[int]:
    """Batch indices, within one block, at which ``suite.compute`` ran (after the lead-in the comparison uses)."""
    report_at = steps // 2
    block = settle + steps + 1
    batches = device_batches(2, 16, 5)
    run(batches, steps - report_at + block, [])  # the lead-in and one warm-up block
    current, seen = [-1], []
    original = suite.compute

    def spy():
        seen.append(current[0])
        return original()

    suite.compute = spy
    run(batches, block, [fw._mark_callback(run.framework, 0, lambda i: current.__setitem__(0, i))])
    return seen


@pytest.mark.parametrize("settle,steps", [(1, 4), (2, 6), (0, 3)])
def test_the_suite_reports_at_the_middle_timed_batch_of_every_block_in_both_frameworks(settle, steps) -> None:
    setup_model = lambda: torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 5))  # noqa: E731
    block = settle + steps + 1
    with fw._quiet():
        lightning = fw._lightning_runner("suite, LogEvery", setup_model(), 5, POINT, torch.device("cpu"), block)
        lightning.framework = "Lightning"
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)
        try:
            accelerate = fw._accelerate_runner("suite, readback", setup_model(), 5, POINT, torch.device("cpu"), block)
            accelerate.framework = "Accelerate"
            accelerate_seen = _compute_positions(accelerate, accelerate.suite, settle, steps)
        finally:
            AcceleratorState._reset_state(reset_partial_state=True)
        lightning_seen = _compute_positions(lightning, lightning.module.suite, settle, steps)
    assert accelerate_seen == [settle + steps // 2]
    # LogEvery also reports the batches since its last report when fit ends, after the block's last batch
    assert lightning_seen == [settle + steps // 2, block - 1]


def test_the_profiler_gives_one_window_per_timed_batch() -> None:
    from accelerate.state import AcceleratorState

    with fw._quiet():
        AcceleratorState._reset_state(reset_partial_state=True)
        try:
            run = fw._accelerate_runner("gather_for_metrics", torch.nn.Sequential(
                torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 5)), 5, POINT, torch.device("cpu"), 6)
            counts = fw._trace_counts("Accelerate", run, device_batches(2, 16, 5), settle=2, steps=3)
        finally:
            AcceleratorState._reset_state(reset_partial_state=True)
    assert counts == [0, 0, 0]  # three windows; no CUDA, so no sync calls


def test_logging_and_warnings_are_restored_after_a_comparison() -> None:
    before = logging.root.manager.disable
    filters = list(warnings.filters)
    with fw._quiet():
        assert logging.root.manager.disable == logging.WARNING
    assert logging.root.manager.disable == before
    assert warnings.filters == filters


@pytest.mark.parametrize("kwargs,message", [
    (dict(rounds=0), "rounds must be an int >= 1"),
    (dict(rounds=1, steps=1), "steps must be an int >= 2"),
    (dict(rounds=1, settle=-1), "settle must be an int >= 0"),
    (dict(rounds=1, frameworks=("Keras",)), "frameworks must be a non-empty tuple drawn from"),
    (dict(rounds=1, frameworks="Lightning"), "frameworks must be a non-empty tuple drawn from"),
])
def test_bad_arguments_are_named(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        fw.compare_frameworks(POINT, profile(), **kwargs)


def test_a_point_that_is_not_an_operating_point_is_refused() -> None:
    with pytest.raises(TypeError, match="point must be an OperatingPoint"):
        fw.compare_frameworks("fp32 b128", profile(), rounds=1)


def test_the_documented_collection_is_torchmetrics_defaults_with_groups() -> None:
    collection = fw.torchmetrics_collection(5)
    assert list(collection) == ["accuracy", "f1_score", "precision", "recall"]
    assert collection._enable_compute_groups is True
    assert {m.average for m in collection.values()} == {"micro"}


@gpu
def test_on_cuda_the_suite_ways_sync_neither_per_step_nor_at_a_report_and_lightnings_log_reads_every_step() -> None:
    out = fw.compare_frameworks(OperatingPoint("small", 16, 64), profile("cuda"), rounds=1, steps=4, settle=1)
    lightning, accelerate = out["Lightning"], out["Accelerate"]
    assert lightning["suite, LogEvery"].syncs_per_step == 0
    assert accelerate["suite, readback"].syncs_per_step == 0
    assert lightning["suite, LogEvery"].report_syncs == 0  # FusedMetrics.compute reads nothing back
    assert accelerate["suite, readback"].report_syncs == 0
    # prog_bar=True: every logged value (the loss and four scores) is read with .item() in Lightning's apply_func
    sites = lightning.settings["sync_sites"]["self.log per step"]
    # the file as installed: site-packages/lightning/... in a venv, another folder where pip put it with --target
    at_item = [n for where, n in sites.items() if where.endswith("lightning/fabric/utilities/apply_func.py:134")]
    assert at_item == [5 * 4], sites
    assert lightning["self.log per step"].syncs_per_step >= 5
    traced = lightning.settings["trace_syncs"]
    assert len(traced["self.log per step"]) == 4 and min(traced["self.log per step"]) >= 5
    assert traced["suite, LogEvery"][:2] == [0, 0]
