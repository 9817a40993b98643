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
    monkeypatch.setattr(mentor.profiling, "count_syncs",
                        lambda fn: calls.append(("count_syncs", fn)) or types.SimpleNamespace(count=syncs))
    monkeypatch.setattr(uc, "_gpu_ops", lambda fn, n: calls.append(("gpu_ops", fn, n)) or ops)
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
    assert (cost.name, cost.kernels, cost.copies) == ("mean", 4, 1)
    assert ("count_syncs", fn) in calls and ("gpu_ops", fn, 3) in calls  # fn's own syncs, ops over 3 calls
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


def test_a_sync_free_update_reports_what_was_measured_of_its_own_function(monkeypatch):
    calls = fake_gpu(monkeypatch, syncs=0, ops=(8, 2))
    timed = []
    monkeypatch.setattr(uc, "_time_behind_sleep", lambda fn, n, c, ms: timed.append(fn) or 1.0)

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
    monkeypatch.setattr(uc, "_time_behind_sleep", lambda fn, n, c, ms: seen.append(n) or 1.0)
    update_cost("u", lambda: None, repeats=1)
    assert seen == [calls]


def test_a_sleep_that_never_outlasts_the_calls_names_the_last_sleep_tried(monkeypatch):
    fake_gpu(monkeypatch, syncs=0, ops=(1, 0))
    sleeps = []
    monkeypatch.setattr(uc, "_time_behind_sleep", lambda fn, n, c, ms: sleeps.append(ms))
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


def _closed(fn) -> dict:
    """What a case's lambda closes over, by the names it uses."""
    return dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__)))


def _batch(cases: dict) -> dict:
    """The batch the cases share: logits, target, padded (target with padding) and loss."""
    closed = {**_closed(cases["FusedMetrics, ignore"]), **_closed(cases["naive set"])}
    return {k: v for k, v in closed.items() if isinstance(v, torch.Tensor)}


def test_book_updates_default_to_32_samples_of_1000_classes_drawn_with_seed_0():
    from mentor.update_cost import book_updates

    batch = _batch(book_updates("cpu"))
    assert batch["logits"].shape == (32, 1000) and batch["target"].shape == (32,) and batch["loss"].shape == ()
    again = _batch(book_updates("cpu", 32, 1000, seed=0))
    assert all(torch.equal(batch[k], again[k]) for k in ("logits", "target", "padded", "loss"))


def test_book_updates_draw_one_batch_per_seed_whatever_the_global_rng():
    from mentor.update_cost import book_updates

    torch.manual_seed(1)
    first = _batch(book_updates("cpu", 64, 2, seed=3))
    torch.manual_seed(2)
    second = _batch(book_updates("cpu", 64, 2, seed=3))
    other = _batch(book_updates("cpu", 64, 2, seed=4))
    for k in ("logits", "target", "loss"):
        assert torch.equal(first[k], second[k]), k
        assert not torch.equal(first[k], other[k]), k
    # labels are 0 .. num_classes - 1: with 2 classes and 64 draws both occur (all equal has chance 2**-63)
    assert set(first["target"].tolist()) == {0, 1}
    every_eighth = torch.arange(64) % 8 == 0
    assert torch.equal(first["padded"], torch.where(every_eighth, -100, first["target"]))


def test_book_updates_put_every_metric_and_tensor_on_the_device():
    from torchmetrics import Metric

    from mentor.update_cost import book_updates

    # "meta" is a device other than the CPU that needs no GPU; nothing is updated, only placed
    def devices(value) -> list:
        if isinstance(value, torch.Tensor):
            return [value.device.type]
        if isinstance(value, Metric):
            return [value.device.type] + [s.device.type for s in value.metric_state.values()]
        if isinstance(value, dict):  # the metric sets, or a MetricCollection's metrics
            return [d for v in value.values() for d in devices(v)]
        if hasattr(value, "scores"):  # a LossAndScores
            return devices(value.loss) + devices(dict(value.scores.items()))
        return devices(dict(value.items()))  # a MetricCollection

    cases = book_updates("meta", 16, 5)
    for name, fn in cases.items():
        found = [d for v in _closed(fn).values() for d in devices(v)]
        assert found and set(found) == {"meta"}, name


def test_book_updates_pass_the_weights_they_are_named_for():
    from mentor.update_cost import book_updates

    cases = book_updates("cpu", 16, 5)
    seen = {}
    for name, metric in [("MeanMetric, w=1.0", "mean_f"), ("MeanMetric, w=tensor", "mean_t"),
                         ("NoNanCheckMeanMetric", "no_check")]:
        closed = _closed(cases[name])
        closed[metric].update = lambda *args, _name=name, **kwargs: seen.setdefault(_name, (args, kwargs))
        cases[name]()
    loss = _closed(cases["MeanMetric(loss)"])["loss"]
    args, kwargs = seen["MeanMetric, w=1.0"]
    assert args == (loss,) and kwargs == {"weight": 1.0} and type(kwargs["weight"]) is float
    for name in ("MeanMetric, w=tensor", "NoNanCheckMeanMetric"):
        args, kwargs = seen[name]
        assert args == (loss,) and list(kwargs) == ["weight"], name
        assert isinstance(kwargs["weight"], torch.Tensor) and torch.equal(kwargs["weight"], torch.ones(())), name


def test_book_updates_ignore_cases_leave_out_the_padding():
    from mentor.update_cost import book_updates

    cases = book_updates("cpu", 16, 5)
    for fn in cases.values():
        fn()
    precision = _closed(cases["Precision, ignore_idx"])["prec_ignore"]
    # micro: one prediction per counted sample, and 2 of the 16 are padding
    assert int(precision.tp.sum() + precision.fp.sum()) == 14
    suite = _closed(cases["FusedMetrics, ignore"])["suite_ignore"]
    assert int(suite.invalid_labels) == 0  # -100 is skipped, not counted as a label outside 0..4
    plain = _closed(cases["FusedMetrics"])["suite"]
    assert plain.ignore_index is None and int(plain.invalid_labels) == 0


def test_book_updates_one_group_holds_four_macro_scores_grouped_from_the_start():
    from mentor.update_cost import book_updates

    grouped = _closed(book_updates("cpu", 16, 5)["macro, one group"])["grouped"]
    assert grouped.compute_groups == {0: ["accuracy", "precision", "recall", "f1_score"]}  # before any update
    assert {name: m.average for name, m in grouped.items()} == {
        "accuracy": "macro", "precision": "macro", "recall": "macro", "f1_score": "macro"}
