"""mentor.update_cost: the measuring logic with fake clocks and fake GPU hooks (the GPU run is in test_gpu_suite)."""

from __future__ import annotations

import types

import pytest
import torch

import mentor.profiling
import mentor.update_cost as uc
from mentor.update_cost import UpdateCost, cost_table, update_cost, update_costs


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(uc.time, "perf_counter", c)
    return c


def fake_gpu(monkeypatch, syncs: int, ops: tuple[int, int]) -> list:
    calls: list = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: calls.append("synchronize"))
    monkeypatch.setattr(mentor.profiling, "count_syncs", lambda fn: types.SimpleNamespace(count=syncs))
    monkeypatch.setattr(uc, "_gpu_ops", lambda fn, n: ops)
    monkeypatch.setattr(uc, "_sleep_cycles_per_ms", lambda: 1000.0)
    return calls


def test_cpu_times_each_call_alone(clock):
    steps = iter([10e-6, 12e-6, 11e-6, 50e-6, 52e-6])

    def fn():
        clock.now += next(steps)

    cost = update_cost("m", fn, repeats=3, warmup=2)  # the first two calls are the untimed warm-up
    assert cost.repeats_us == pytest.approx([11.0, 50.0, 52.0])
    assert (cost.syncs, cost.kernels, cost.copies, cost.queue) == (0, None, None, "n/a (CPU)")
    assert cost.host_us == pytest.approx(50.0)


def test_sync_free_update_is_timed_behind_a_sleep_that_outlasts_it(monkeypatch, clock):
    fake_gpu(monkeypatch, syncs=0, ops=(8, 2))
    seen = []
    answers = iter([None, 30.0, 31.0, 29.0])  # the first sleep ended too soon: measured again, twice as long

    def behind(fn, calls, cycles_per_ms, sleep_ms):
        seen.append((calls, cycles_per_ms, sleep_ms))
        return next(answers)

    monkeypatch.setattr(uc, "_time_behind_sleep", behind)
    cost = update_cost("suite", lambda: None, repeats=3)
    assert cost.repeats_us == [30.0, 31.0, 29.0] and cost.queue == "full"
    assert (cost.kernels, cost.copies) == (8, 2)
    # 200 launches per repeat at most: 10 operations per call allow 20 calls
    assert seen == [(20, 1000.0, 5.0), (20, 1000.0, 10.0), (20, 1000.0, 10.0), (20, 1000.0, 10.0)]


def test_calls_per_repeat_keep_the_launch_queue_short(monkeypatch):
    fake_gpu(monkeypatch, syncs=0, ops=(74, 1))
    seen = []
    monkeypatch.setattr(uc, "_time_behind_sleep", lambda fn, calls, c, ms: seen.append(calls) or 1.0)
    update_cost("big", lambda: None, repeats=2)
    assert seen == [2, 2]  # 200 // 75


def test_an_update_that_syncs_is_timed_with_an_idle_gpu(monkeypatch, clock):
    calls = fake_gpu(monkeypatch, syncs=2, ops=(4, 1))
    monkeypatch.setattr(uc, "_time_behind_sleep", lambda *a: pytest.fail("a syncing update must not wait behind a sleep"))

    def fn():
        clock.now += 40e-6

    cost = update_cost("mean", fn, repeats=4, warmup=0)
    assert cost.queue == "idle" and cost.syncs == 2
    assert cost.repeats_us == pytest.approx([40.0] * 4)
    assert calls.count("synchronize") == 4  # the queue is drained before every repeat


def test_a_sleep_that_never_outlasts_the_calls_raises(monkeypatch):
    fake_gpu(monkeypatch, syncs=0, ops=(1, 0))
    monkeypatch.setattr(uc, "_time_behind_sleep", lambda *a: None)
    with pytest.raises(RuntimeError, match=r"hang: the GPU finished a \d+ ms sleep before 20 calls were queued"):
        update_cost("hang", lambda: None, repeats=1)


def test_host_interval_is_a_bootstrap_of_the_median():
    c = UpdateCost("m", 0, 1, 0, [10.0, 10.0, 10.0, 10.0, 30.0], "full")
    assert c.host_us == 10.0 and c.host_interval == (10.0, 30.0)
    assert UpdateCost("one", 0, 1, 0, [7.0], "full").host_interval == (7.0, 7.0)


def test_cost_table_pins_every_column():
    costs = [UpdateCost("fused suite", 0, 22, 1, [100.0, 101.0, 99.0], "full"),
             UpdateCost("a very long name that does not fit in the first column at all", 2, 4, 3, [5.0], "idle"),
             UpdateCost("cpu", 0, None, None, [1.0], "n/a (CPU)")]
    lines = cost_table(costs).splitlines()
    assert lines[0] == "update                syncs kernels copies  host us [95 % interval]  queue"
    assert lines[1] == "fused suite               0      22      1    100.0 [99.0, 101.0]    full"
    assert lines[2] == "a very long name tha…     2       4      3      5.0 [5.0, 5.0]       idle"
    assert lines[3] == "cpu                       0       -      -      1.0 [1.0, 1.0]       n/a (CPU)"
    assert max(map(len, lines)) <= 80


def test_update_costs_keeps_order_and_rejects_bad_input():
    assert [c.name for c in update_costs({"b": lambda: None, "a": lambda: None}, repeats=1)] == ["b", "a"]
    with pytest.raises(TypeError, match="fn must be a function of no arguments"):
        update_cost("x", 3)
    for bad in (0, True, 2.5):
        with pytest.raises(ValueError, match=f"repeats must be an int >= 1, got {bad!r}"):
            update_cost("x", lambda: None, repeats=bad)


def test_book_updates_cover_the_books_metrics_and_each_one_updates():
    from mentor.update_cost import book_updates

    cases = book_updates("cpu", batch_size=16, num_classes=5)
    assert list(cases) == [
        "MeanMetric(loss)", "MeanMetric, w=1.0", "MeanMetric, w=tensor", "NoNanCheckMeanMetric",
        "MeanMetric, disable", "Accuracy (micro)", "Precision, ignore_idx", "Precision (macro)", "ScatterPrecision",
        "naive set", "optimized set", "macro set", "macro sync-free set", "macro, one group", "FusedMetrics",
        "FusedMetrics, ignore"]
    for name, fn in cases.items():
        fn()
        owner = fn.__closure__  # every case closes over the metric it updates
        metrics = [c.cell_contents for c in owner if hasattr(c.cell_contents, "update")]
        assert metrics, name
    suite_ignore = [c.cell_contents for c in cases["FusedMetrics, ignore"].__closure__
                    if type(c.cell_contents).__name__ == "FusedMetrics"][0]
    assert int(suite_ignore.loss_count) == 1 and int(suite_ignore.tp.sum() + suite_ignore.fn.sum()) == 14  # 2 of 16 ignored


def test_defaults_are_three_warmup_calls_and_21_repeats(clock):
    calls = []
    update_cost("m", lambda: calls.append(1))
    assert len(calls) == 3 + 21
    calls.clear()
    update_costs({"m": lambda: calls.append(1)})
    assert len(calls) == 3 + 21
