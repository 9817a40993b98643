"""mentor.flat_sync: one all-reduce per sync, the same values as torchmetrics' own sync, and a fallback
where it does not apply. Two real ranks are in test_lab_worker.py (task agree)."""

from __future__ import annotations

import io
import pickle

import pytest
import torch
from torchmetrics import CatMetric, MaxMetric, MeanMetric, SumMetric
from torchmetrics.classification import MulticlassF1Score

from mentor.flat_sync import flat_sync
from mentor.lab.ddp import single_rank_group
from mentor.suite import FusedMetrics
from mentor.syncs import SyncReport, _intercept


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


def test_the_flat_buffer_is_float64_so_large_counts_stay_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    reduce = TwoRanks()
    monkeypatch.setattr(torch.distributed, "all_reduce", reduce)
    metric = feed(flat_sync(FusedMetrics)(5))
    metric.tp[0] = 2**40 + 1  # float32 would round it (24-bit mantissa); float64 holds it
    before = {name: getattr(metric, name).clone() for name in metric._reductions}
    group = object()
    metric.sync(process_group=group, distributed_available=lambda: True)
    # tp, fp, fn (5 each), loss_sum, loss_count, invalid_labels: 18 numbers in one call
    assert reduce.calls == [(torch.float64, 18, torch.distributed.ReduceOp.SUM, group)]
    assert int(metric.tp[0]) == 2**41 + 2
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
        "mentor.flat_sync.FlatSyncMeanMetric already exists for another class named MeanMetric; "
        f"give {MeanMetric2.__module__}.{MeanMetric2.__qualname__} another name so that both can be pickled.")
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
