"""mentor.flat_sync: one all-reduce per sync, the same values as torchmetrics' own sync, and a fallback
where it does not apply. Two real ranks are in test_mentor_worker.py (task agree)."""

from __future__ import annotations

import io
import pickle

import pytest
import torch
from torchmetrics import CatMetric, MeanMetric
from torchmetrics.classification import MulticlassF1Score

from mentor.ddp import single_rank_group
from mentor.flat_sync import flat_sync
from mentor.profiling import SyncReport, _intercept
from mentor.suite import FusedMetrics


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
    assert "collective: all_reduce" not in counts and counts["collective: all_gather"] >= 1
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
