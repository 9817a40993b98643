"""mentor.flat_sync: one all-reduce per sync, the same values and dtypes as torchmetrics' own sync (two gloo ranks,
every dtype), and a fallback where it does not apply. More real ranks are in test_lab_worker.py (task agree)."""

from __future__ import annotations

import io
import pickle

import pytest
import torch
from torchmetrics import CatMetric, MaxMetric, MeanMetric, Metric, SumMetric
from torchmetrics.classification import MulticlassF1Score

from mentor.flat_sync import flat_sync
from mentor.lab.ddp import single_rank_group
from mentor.suite import FusedMetrics
from mentor.syncs import SyncReport, _intercept
import ranks


def collectives(metric) -> tuple[dict[str, int], object]:
    """compute() in a one-rank gloo group: the torch.distributed calls it made, by kind, and its value."""
    with single_rank_group("gloo"):
        with _intercept(SyncReport()) as report:
            value = metric.compute()
    return dict(report.by_kind()), value


def feed(metric, steps: int = 3):
    g = torch.Generator().manual_seed(0)
    for i in range(steps):
        logits, target = torch.randn(16, 5, generator=g), torch.randint(0, 5, (16,), generator=g)
        if isinstance(metric, FusedMetrics):
            metric.update(torch.tensor(i / 4), logits, target)
        elif isinstance(metric, MulticlassF1Score):
            metric.update(logits, target)
        else:
            metric.update(logits[:, 0])
    return metric


def test_the_suite_syncs_in_one_all_reduce_with_the_same_values() -> None:
    plain, plain_value = collectives(feed(FusedMetrics(5)))
    flat, flat_value = collectives(feed(flat_sync(FusedMetrics)(5)))
    assert plain == {"collective: barrier": 6, "collective: all_gather": 9}
    assert flat == {"collective: all_reduce": 1}
    assert {k: v.tolist() for k, v in flat_value.items()} == {k: v.tolist() for k, v in plain_value.items()}


def test_torchmetrics_sum_metrics_sync_flat_too() -> None:
    flat, value = collectives(feed(flat_sync(MulticlassF1Score)(5, average="macro")))
    assert flat == {"collective: all_reduce": 1}
    assert value == feed(MulticlassF1Score(5, average="macro", sync_on_compute=False)).compute()
    flat, value = collectives(feed(flat_sync(MeanMetric)()))
    assert flat == {"collective: all_reduce": 1}
    assert value == feed(MeanMetric()).compute()


def test_a_list_state_falls_back_to_torchmetrics_sync() -> None:
    counts, value = collectives(feed(flat_sync(CatMetric)()))
    assert counts == collectives(feed(CatMetric()))[0]  # exactly torchmetrics' own collectives, no all_reduce
    assert "collective: all_reduce" not in counts
    assert value.tolist() == feed(CatMetric()).compute().tolist()


def test_states_keep_their_dtypes_and_the_local_values_come_back() -> None:
    metric = feed(flat_sync(FusedMetrics)(5))
    before = {name: getattr(metric, name).clone() for name in metric._reductions}
    with single_rank_group("gloo"):
        metric.sync()
        assert {n: getattr(metric, n).dtype for n in before} == {n: t.dtype for n, t in before.items()}
        assert all(torch.equal(getattr(metric, n), t) for n, t in before.items())  # one rank: sums equal
        metric.unsync()
    assert all(torch.equal(getattr(metric, n), t) for n, t in before.items())


def test_the_same_class_is_made_once_and_pickles() -> None:
    cls = flat_sync(FusedMetrics)
    assert flat_sync(FusedMetrics) is cls and flat_sync(cls) is cls
    assert cls.__name__ == "FlatSyncFusedMetrics" and issubclass(cls, FusedMetrics)
    metric = feed(cls(5))
    clone = pickle.loads(pickle.dumps(metric))
    assert type(clone) is cls and torch.equal(clone.tp, metric.tp)
    buffer = io.BytesIO()
    torch.save(metric, buffer)
    buffer.seek(0)
    assert type(torch.load(buffer, weights_only=False)) is cls


def test_a_class_made_in_another_process_is_found_by_name() -> None:
    import mentor.flat_sync as module

    assert module.FlatSyncMulticlassAccuracy.__name__ == "FlatSyncMulticlassAccuracy"
    with pytest.raises(AttributeError, match="has no attribute 'FlatSyncNothing'"):
        module.FlatSyncNothing  # noqa: B018


@pytest.mark.parametrize("bad", [MeanMetric(), int, "MeanMetric"])
def test_flat_sync_takes_a_metric_class(bad) -> None:
    with pytest.raises(TypeError, match="flat_sync takes a torchmetrics Metric class"):
        flat_sync(bad)


class TwoRanks:
    """torch.distributed.all_reduce as two ranks holding equal states would see it: the buffer doubles."""

    def __init__(self) -> None:
        self.calls: list[tuple[torch.dtype, int, object, object]] = []

    def __call__(self, tensor: torch.Tensor, op=torch.distributed.ReduceOp.SUM, group=None, async_op=False) -> None:
        self.calls.append((tensor.dtype, tensor.numel(), op, group))
        tensor.mul_(2)


def test_the_flat_buffer_is_float64_and_integer_states_travel_as_two_exact_halves(
        monkeypatch: pytest.MonkeyPatch) -> None:
    reduce = TwoRanks()
    monkeypatch.setattr(torch.distributed, "all_reduce", reduce)
    metric = feed(flat_sync(FusedMetrics)(5))
    metric.tp[0] = 2**60 + 1  # float64 would round it (53-bit mantissa); its two 32-bit halves are exact
    before = {name: getattr(metric, name).clone() for name in metric._reductions}
    group = object()
    metric.sync(process_group=group, distributed_available=lambda: True)
    # loss_sum (float32): 1 number; tp, fp, fn (5 each), loss_count, invalid_labels (int64): 17 numbers, 2 halves each
    assert reduce.calls == [(torch.float64, 1 + 2 * 17, torch.distributed.ReduceOp.SUM, group)]
    assert int(metric.tp[0]) == 2**61 + 2
    for name, value in before.items():
        assert getattr(metric, name).dtype == value.dtype, name
        assert torch.equal(getattr(metric, name), value * 2), name


def test_the_metrics_own_process_group_is_used_when_sync_names_none(monkeypatch: pytest.MonkeyPatch) -> None:
    reduce = TwoRanks()
    monkeypatch.setattr(torch.distributed, "all_reduce", reduce)
    group = object()
    metric = feed(flat_sync(MeanMetric)(process_group=group))
    metric.sync(distributed_available=lambda: True)
    assert [call[3] for call in reduce.calls] == [group]


def test_a_custom_dist_sync_fn_falls_back_and_gets_the_process_group() -> None:
    seen = []

    def gather(tensor: torch.Tensor, group=None) -> list[torch.Tensor]:  # two ranks with equal states
        seen.append(group)
        return [tensor, tensor]

    metric = feed(flat_sync(MeanMetric)())
    mean_value, weight = metric.mean_value.clone(), metric.weight.clone()
    group = object()
    metric.sync(dist_sync_fn=gather, process_group=group, distributed_available=lambda: True)
    assert seen == [group, group]  # one call per state: torchmetrics' own sync, with the caller's function
    assert torch.equal(metric.mean_value, 2 * mean_value) and torch.equal(metric.weight, 2 * weight)


def test_a_state_reduced_otherwise_than_by_sum_falls_back_to_torchmetrics_sync() -> None:
    counts, value = collectives(feed(flat_sync(MaxMetric)()))
    assert counts == collectives(feed(MaxMetric()))[0]  # exactly torchmetrics' own collectives, no all_reduce
    assert "collective: all_reduce" not in counts
    assert value == feed(MaxMetric()).compute()


def test_a_second_class_of_the_same_name_is_refused() -> None:
    flat_sync(MeanMetric)

    class MeanMetric2(SumMetric):
        pass

    MeanMetric2.__name__ = "MeanMetric"
    with pytest.raises(TypeError) as exc:
        flat_sync(MeanMetric2)
    assert str(exc.value) == (
        "mentor.flat_sync.FlatSyncMeanMetric already exists for another class named MeanMetric "
        f"(torchmetrics.aggregation); give {MeanMetric2.__module__}.{MeanMetric2.__qualname__} another name so that "
        "both can be pickled.")
    assert flat_sync(MeanMetric).__bases__ == (MeanMetric,)


def test_the_made_class_says_what_it_is() -> None:
    cls = flat_sync(MeanMetric)
    assert cls.__qualname__ == "FlatSyncMeanMetric" and cls.__module__ == "mentor.flat_sync"
    assert cls.__doc__ == ("MeanMetric whose states are synced across ranks in one all-reduce of one flat buffer "
                           "(mentor.flat_sync).")


def test_only_names_that_start_with_the_prefix_are_made_on_demand() -> None:
    import mentor.flat_sync as module

    # as long as "FlatSync": a prefix that is not it makes nothing, even when the rest names a metric
    with pytest.raises(AttributeError) as exc:
        getattr(module, "SyncFlatMeanMetric")
    assert str(exc.value) == "module 'mentor.flat_sync' has no attribute 'SyncFlatMeanMetric'"


# ----------------------------------------------------------------------------------------------------------
# Two gloo ranks: every dtype comes back as torchmetrics' own sync gives it


# name: (dtype, the state on rank 0, on rank 1)
STATES = {
    "int32": (torch.int32, [2**30, -5], [2**30, -7]),
    "int16": (torch.int16, [30000, -32768], [30000, 5]),
    "uint8": (torch.uint8, [200, 7], [200, 255]),
    "bool": (torch.bool, [True, False], [True, True]),
    "int64": (torch.int64, [2**53 + 1, -(2**61) - 3], [2**53 + 2, 2**62 + 5]),
    "float32": (torch.float32, [0.1, 1e30], [0.2, 3.0]),
    "float64": (torch.float64, [0.1, 1e300], [0.2, -1e-300]),
}
CASES = {**{name: [name] for name in STATES}, "mix": list(STATES)}


class DtypeSums(Metric):
    """States of the dtypes of ``STATES`` named, summed across ranks; ``update(rank)`` sets them to that rank's."""

    full_state_update = False

    def __init__(self, names: list[str], **kwargs) -> None:
        super().__init__(**kwargs)
        for name in names:
            self.add_state(name, torch.zeros(2, dtype=STATES[name][0]), dist_reduce_fx="sum")

    def update(self, rank: int) -> None:
        for name in self._defaults:
            setattr(self, name, torch.tensor(STATES[name][1 + rank], dtype=STATES[name][0]))

    def compute(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in self._defaults}


def synced(metric) -> dict[str, object]:
    """``metric.sync()``: each state's dtype and value, the collectives it made, and whether unsync() restored it."""
    local = {name: getattr(metric, name).clone() for name in metric._defaults}
    try:
        with _intercept(SyncReport()) as report:
            metric.sync()
    except Exception as err:  # noqa: BLE001 - torchmetrics' own sync of an int16 state on gloo; the parent checks
        return {"error": f"{type(err).__name__}: {err}"}
    out = {name: (str(getattr(metric, name).dtype), getattr(metric, name).tolist()) for name in metric._defaults}
    metric.unsync()
    restored = all(getattr(metric, n).dtype == t.dtype and torch.equal(getattr(metric, n), t) for n, t in local.items())
    return {"states": out, "collectives": dict(report.by_kind()), "unsynced": restored}


def dtype_sums_on_two_ranks(rank: int, world_size: int) -> dict[str, dict[str, object]]:
    """Worker: for every case of CASES, torchmetrics' own sync and the flat sync of the same states."""
    out = {}
    for case, names in CASES.items():
        plain, flat = DtypeSums(names), flat_sync(DtypeSums)(names)
        plain.update(rank)
        flat.update(rank)
        out[case] = {"plain": synced(plain), "flat": synced(flat)}
    return out


DTYPE_SUMS_ON_TWO_RANKS_KEY = ranks.on_two_ranks(dtype_sums_on_two_ranks)


def test_on_two_gloo_ranks_every_dtype_syncs_as_torchmetrics_sync_does() -> None:
    """torchmetrics stacks the gathered states and sums them with torch.sum (dim_zero_sum), which returns int64 for
    bool and integer states: the flat sync gives each state that dtype and value, in one all_reduce per sync. The old
    float64 buffer cast the sums back (int32 2**30 + 2**30 became -2**31, uint8 200 + 200 became 144, True + True
    stayed True) and rounded int64 counts above 2**53."""
    from torchmetrics.utilities.data import dim_zero_sum


    want = {name: dim_zero_sum(torch.stack([torch.tensor(r0, dtype=dtype), torch.tensor(r1, dtype=dtype)]))
            for name, (dtype, r0, r1) in STATES.items()}
    # the cases of the issue, by hand
    assert want["int32"].tolist() == [2**31, -12] and want["uint8"].tolist() == [400, 262]
    assert want["bool"].tolist() == [2, 1] and want["int16"].tolist() == [60000, -32763]
    assert want["int64"].tolist() == [2**54 + 3, 2**61 + 2]
    assert {want[n].dtype for n in ("int32", "int16", "uint8", "bool", "int64")} == {torch.int64}
    assert (want["float32"].dtype, want["float64"].tolist()) == (torch.float32, [0.30000000000000004, 1e300])
    results = ranks.results(DTYPE_SUMS_ON_TWO_RANKS_KEY)
    assert [r.error for r in results] == [None, None]
    for r in results:
        for case, names in CASES.items():
            got = r.value[case]
            expected = {name: (str(want[name].dtype), want[name].tolist()) for name in names}
            one_all_reduce = {"collective: all_reduce": 1}
            assert got["flat"] == {"states": expected, "collectives": one_all_reduce, "unsynced": True}, (r.rank, case)
            if "int16" in names:  # gloo has no int16: torchmetrics' own sync cannot run here, the flat one can
                assert got["plain"] == {"error": "RuntimeError: Invalid scalar type"}, (r.rank, case)
            else:  # the reference above is what torchmetrics' own sync gives
                assert got["plain"]["states"] == expected, (r.rank, case)
