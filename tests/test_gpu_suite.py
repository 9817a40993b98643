"""CUDA paths of mentor.suite.FusedMetrics: no sync per update, equal to torchmetrics on the GPU, and
torch.compile (inductor, and CUDA graphs) with no graph break and no recompile. Run with `pytest -m gpu`."""

import pytest
import torch
from torchmetrics.classification import MulticlassF1Score, MulticlassPrecision

from mentor.profiling import count_syncs
from mentor.suite import FusedMetrics

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _batch(n=256, classes=1000, seed=0, ignore_index=None):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn(n, classes, device="cuda", generator=gen)
    target = torch.randint(0, classes, (n,), device="cuda", generator=gen)
    if ignore_index is not None:
        target[::7] = ignore_index
    return torch.rand((), device="cuda", generator=gen), logits, target


@pytest.mark.parametrize("ignore_index", [None, -100])
def test_an_update_makes_no_sync(ignore_index):
    suite = FusedMetrics(1000, ignore_index=ignore_index).cuda()
    loss, logits, target = _batch(ignore_index=ignore_index)
    suite.update(loss, logits, target)  # the first update may allocate
    report = count_syncs(suite.update, loss, logits, target)
    assert report.count == 0, report.table()


def test_equals_torchmetrics_on_the_gpu():
    suite = FusedMetrics(1000, ignore_index=-100).cuda()
    precision = MulticlassPrecision(1000, average="macro", ignore_index=-100).cuda()
    f1 = MulticlassF1Score(1000, average="weighted", ignore_index=-100).cuda()
    for seed in range(3):
        loss, logits, target = _batch(seed=seed, ignore_index=-100)
        suite.update(loss, logits, target)
        precision.update(logits, target)
        f1.update(logits, target)
    out = suite.compute()
    assert torch.equal(out["precision_macro"], precision.compute())
    assert torch.equal(out["f1_weighted"], f1.compute())


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_compiles_without_a_break_or_a_recompile(mode):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    eager = FusedMetrics(1000).cuda()
    suite = FusedMetrics(1000).cuda()

    def step(loss, logits, target):
        suite.update(loss, logits, target)

    compiled = torch.compile(step, fullgraph=True, mode=mode)
    for seed in range(6):
        batch = _batch(seed=seed)
        compiled(*batch)
        eager.update(*batch)
    assert counters["stats"]["unique_graphs"] == 1
    got, want = suite.compute(), eager.compute()
    for key in want:
        assert torch.allclose(got[key], want[key]), (key, got[key], want[key])


@pytest.mark.parametrize("precision, channels_last", [("fp32", False), ("bf16", True)])
def test_the_suite_config_makes_no_sync_per_step_and_one_read_per_report(precision, channels_last):
    from mentor.bench import Config, compare, suite_config
    from mentor.data import device_batches
    from mentor.train import build_setup

    setup = build_setup(num_classes=10, device="cuda", precision=precision, channels_last=channels_last)
    batches = device_batches(4, image_size=32, num_classes=10, device="cuda")
    cmp = compare([Config("none"), suite_config(10, "cuda")], setup, batches, steps=3, warmup=1, rounds=2,
                  report_every=2, sync_steps=4, progress=False)
    # per report: the invalid-label count and the single stacked copy of every value
    assert (cmp["fused suite"].syncs_per_step, cmp["fused suite"].report_syncs) == (0.0, 2)
