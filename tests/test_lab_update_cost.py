"""mentor.lab.update_cost, whose update_cost is mentor.measure's (imported under its old name): the measuring logic
with fake clocks and fake GPU hooks, and the table; on CUDA (``@gpu``, run with `pytest -m gpu`): one kernel timed
behind the sleep, a read-back with an idle GPU, and the check that the sleep still runs. The updates the book
measures are tested in test_lab_updates.py."""

from __future__ import annotations

import types

import pytest
import torch

import mentor.measure as measure  # update_cost measures there; the lab imports it under its old name
import mentor.syncs
from marks import gpu
from mentor.lab.update_cost import (
    UpdateCost,
    _sleep_cycles_per_ms,
    _time_behind_sleep,
    cost_table,
    update_cost,
    update_costs,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(measure.time, "perf_counter", c)
    return c


def fake_gpu(monkeypatch, syncs: int, ops: tuple[int, int]) -> list:
    calls: list = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: calls.append("synchronize"))
    monkeypatch.setattr(mentor.syncs, "count_syncs",
                        lambda fn: calls.append(("count_syncs", fn)) or types.SimpleNamespace(count=syncs))
    monkeypatch.setattr(measure, "_gpu_ops", lambda fn, n: calls.append(("gpu_ops", fn, n)) or ops)
    monkeypatch.setattr(measure, "_sleep_cycles_per_ms", lambda: 1000.0)
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

    monkeypatch.setattr(measure, "_time_behind_sleep", behind)
    cost = update_cost("suite", lambda: None, repeats=3)
    assert cost.repeats_us == [30.0, 31.0, 29.0] and cost.queue == "full"
    assert (cost.kernels, cost.copies) == (8, 2)
    # 200 launches per repeat at most: 10 operations per call allow 20 calls
    assert seen == [(20, 1000.0, 5.0), (20, 1000.0, 10.0), (20, 1000.0, 10.0), (20, 1000.0, 10.0)]


def test_calls_per_repeat_keep_the_launch_queue_short(monkeypatch):
    fake_gpu(monkeypatch, syncs=0, ops=(74, 1))
    seen = []
    monkeypatch.setattr(measure, "_time_behind_sleep", lambda fn, calls, c, ms: seen.append(calls) or 1.0)
    update_cost("big", lambda: None, repeats=2)
    assert seen == [2, 2]  # 200 // 75


def test_an_update_that_syncs_is_timed_with_an_idle_gpu(monkeypatch, clock):
    calls = fake_gpu(monkeypatch, syncs=2, ops=(4, 1))
    monkeypatch.setattr(measure, "_time_behind_sleep",
                        lambda *a: pytest.fail("a syncing update must not wait behind a sleep"))

    def fn():
        clock.now += 40e-6

    cost = update_cost("mean", fn, repeats=4, warmup=0)
    assert cost.queue == "idle" and cost.syncs == 2
    assert (cost.name, cost.kernels, cost.copies) == ("mean", 4, 1)
    assert ("count_syncs", fn) in calls and ("gpu_ops", fn, 3) in calls  # fn's own syncs, ops over 3 calls
    assert cost.repeats_us == pytest.approx([40.0] * 4)
    assert calls.count("synchronize") == 4  # the queue is drained before every repeat


def test_a_sleep_that_never_outlasts_the_calls_raises(monkeypatch):
    fake_gpu(monkeypatch, syncs=0, ops=(1, 0))
    monkeypatch.setattr(measure, "_time_behind_sleep", lambda *a: None)
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


def test_defaults_are_three_warmup_calls_and_21_repeats(clock):
    calls = []
    update_cost("m", lambda: calls.append(1))
    assert len(calls) == 3 + 21
    calls.clear()
    update_costs({"m": lambda: calls.append(1)})
    assert len(calls) == 3 + 21


def test_a_sync_free_update_reports_what_was_measured_of_its_own_function(monkeypatch):
    calls = fake_gpu(monkeypatch, syncs=0, ops=(8, 2))
    timed = []
    monkeypatch.setattr(measure, "_time_behind_sleep", lambda fn, n, c, ms: timed.append(fn) or 1.0)

    def fn():
        return None

    cost = update_cost("suite", fn, repeats=2, warmup=0)
    assert (cost.name, cost.syncs, cost.kernels, cost.copies, cost.queue) == ("suite", 0, 8, 2, "full")
    assert calls == [("count_syncs", fn), ("gpu_ops", fn, 3)]  # the kernels are counted over 3 profiled calls
    assert timed == [fn, fn]


@pytest.mark.parametrize(("ops", "calls"), [
    ((0, 0), 20),      # nothing launched: 20 calls, the cap
    ((8, 2), 20),      # 200 // 10 = 20
    ((74, 1), 2),      # 200 // 75
    ((100, 100), 1),   # copies count as launches too: 200 // 200
    ((199, 1), 1),     # 200 // 200
    ((300, 0), 1),     # more than 200 launches: still one call per repeat
])
def test_calls_per_repeat_are_200_launches_over_kernels_and_copies(monkeypatch, ops, calls):
    fake_gpu(monkeypatch, syncs=0, ops=ops)
    seen = []
    monkeypatch.setattr(measure, "_time_behind_sleep", lambda fn, n, c, ms: seen.append(n) or 1.0)
    update_cost("u", lambda: None, repeats=1)
    assert seen == [calls]


def test_a_sleep_that_never_outlasts_the_calls_names_the_last_sleep_tried(monkeypatch):
    fake_gpu(monkeypatch, syncs=0, ops=(1, 0))
    sleeps = []
    monkeypatch.setattr(measure, "_time_behind_sleep", lambda fn, n, c, ms: sleeps.append(ms))
    with pytest.raises(RuntimeError) as exc:
        update_cost("hang", lambda: None, repeats=1)
    # 5 ms doubled up to 5 * 2**10 = 5120 ms; the next, 10240 ms, is over the 10 s limit and not tried
    assert sleeps == [5.0 * 2 ** k for k in range(11)]
    assert str(exc.value) == ("hang: the GPU finished a 5120 ms sleep before 20 calls were queued; "
                              "does fn wait for the GPU some other way?")


def test_update_costs_passes_repeats_on(clock):
    calls = []
    update_costs({"m": lambda: calls.append(1)}, repeats=2)
    assert len(calls) == 3 + 2


def test_cost_table_cuts_a_name_only_when_it_does_not_fit():
    # at width 80 the name column is 22 wide: a name of 21 characters still leaves one space before syncs
    names = ["n" * 21, "m" * 22, "k" * 23]
    lines = cost_table([UpdateCost(n, 0, 1, 0, [1.0], "full") for n in names]).splitlines()
    assert [line[:22] for line in lines[1:]] == ["n" * 21 + " ", "m" * 20 + "… ", "k" * 20 + "… "]


def test_cost_table_keeps_columns_of_a_blank_name_and_drops_trailing_spaces():
    lines = cost_table([UpdateCost("", 1, 2, 3, [4.0], "idle"), UpdateCost("q", 0, 1, 0, [4.0], "")]).splitlines()
    assert lines[1] == " " * 22 + "    1       2      3      4.0 [4.0, 4.0]       idle"
    assert lines[2] == "q" + " " * 21 + "    0       1      0      4.0 [4.0, 4.0]"


# ----------------------------------------------------------------------------------------------------------
# On CUDA


@gpu
def test_update_cost_of_one_kernel_is_timed_behind_the_sleep():
    x = torch.zeros(1000, device="cuda")
    cost = update_cost("add", lambda: x.add_(1), repeats=5)
    assert (cost.syncs, cost.kernels, cost.copies, cost.queue) == (0, 1, 0, "full")
    assert len(cost.repeats_us) == 5 and 0 < cost.host_us < 1000


@gpu
def test_update_cost_of_a_read_back_is_timed_with_an_idle_gpu():
    x = torch.ones(1000, device="cuda")
    cost = update_cost("item", lambda: x.sum().item(), repeats=3)
    assert (cost.syncs, cost.kernels, cost.copies, cost.queue) == (1, 1, 1, "idle")


@gpu
def test_the_sleep_is_still_running_when_the_timed_calls_end():
    x = torch.zeros(10, device="cuda")
    per_ms = _sleep_cycles_per_ms()
    assert _time_behind_sleep(lambda: x.add_(1), 10, per_ms, 50.0) is not None
    # a call that waits for the GPU outlasts any sleep: the check must notice
    assert _time_behind_sleep(lambda: torch.cuda.synchronize(), 1, per_ms, 5.0) is None


def test_update_cost_measures_on_one_core_and_restores_the_affinity():
    import os

    allowed = os.sched_getaffinity(0)
    seen = []
    cost = update_cost("affinity", lambda: seen.append(os.sched_getaffinity(0)), repeats=2, warmup=1)
    assert cost.core == min(allowed) and seen == [{min(allowed)}] * 3
    assert os.sched_getaffinity(0) == allowed


def test_one_core_restores_the_affinity_when_the_body_raises():
    import os

    from mentor.lab.update_cost import one_core

    allowed = os.sched_getaffinity(0)
    with pytest.raises(KeyError), one_core() as core:
        assert os.sched_getaffinity(0) == {core}
        raise KeyError("x")
    assert os.sched_getaffinity(0) == allowed
