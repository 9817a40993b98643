"""CUDA paths of part II's tools: update_cost's counts and queue, host_time on a real trace, the macro sets and
LossAndScores' single read-back. Run with `pytest -m gpu`."""

import pytest
import torch

from mentor.metrics import metric_set, read_values
from mentor.profiling import count_syncs
from mentor.update_cost import update_cost

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_update_cost_of_one_kernel_is_timed_behind_the_sleep():
    x = torch.zeros(1000, device="cuda")
    cost = update_cost("add", lambda: x.add_(1), repeats=5)
    assert (cost.syncs, cost.kernels, cost.copies, cost.queue) == (0, 1, 0, "full")
    assert len(cost.repeats_us) == 5 and 0 < cost.host_us < 1000


def test_update_cost_of_a_read_back_is_timed_with_an_idle_gpu():
    x = torch.ones(1000, device="cuda")
    cost = update_cost("item", lambda: x.sum().item(), repeats=3)
    assert (cost.syncs, cost.kernels, cost.copies, cost.queue) == (1, 1, 1, "idle")


def test_the_sleep_is_still_running_when_the_timed_calls_end():
    from mentor.update_cost import _sleep_cycles_per_ms, _time_behind_sleep

    x = torch.zeros(10, device="cuda")
    per_ms = _sleep_cycles_per_ms()
    assert _time_behind_sleep(lambda: x.add_(1), 10, per_ms, 50.0) is not None
    # a call that waits for the GPU outlasts any sleep: the check must notice
    assert _time_behind_sleep(lambda: torch.cuda.synchronize(), 1, per_ms, 5.0) is None


def test_host_time_finds_the_wait_of_an_item_in_a_range(tmp_path):
    from mentor.profiling import profiling_session
    from mentor.trace import host_time, load_trace

    x = torch.randn(4096, 4096, device="cuda")
    path = tmp_path / "t.json.gz"
    with profiling_session(path, wait=0, warmup=1, active=2) as prof:
        for _ in range(3):
            y = x @ x  # keeps the GPU busy, so that the read-back below waits
            with torch.profiler.record_function("read"):
                y.sum().item()
            prof.step()
    h = host_time(load_trace(path), "read")
    assert h.ranges == 2 and h.launches >= 1
    assert h.wait_us > 0.5 * h.total_us  # the matmul (about a millisecond) is waited for inside the range


@pytest.mark.parametrize("variant, syncs", [("macro sync-free", 0), ("optimized", 0)])
def test_sync_free_metric_sets_make_no_sync_per_update(variant, syncs):
    ms = metric_set(variant, num_classes=1000, device="cuda")
    logits = torch.randn(64, 1000, device="cuda")
    target = torch.randint(0, 1000, (64,), device="cuda")
    loss = torch.rand((), device="cuda")
    ms.update(loss, logits, target)
    report = count_syncs(ms.update, loss, logits, target)
    assert report.count == syncs, report.table()


def test_read_reads_the_values_back_in_one_copy():
    ms = metric_set("macro sync-free", num_classes=10, device="cuda")
    ms.update(torch.tensor(1.0, device="cuda"), torch.eye(10, device="cuda"), torch.arange(10, device="cuda"))
    values = ms.compute()
    report = count_syncs(read_values, values)
    assert report.count == 1, report.table()
    assert ms.read() == {"loss": 1.0, "accuracy": 1.0, "f1_score": 1.0, "precision": 1.0, "recall": 1.0}


def test_deferred_readback_costs_no_sync_and_reads_the_right_steps():
    from mentor.profiling import sync_guard
    from mentor.readback import DeferredReadback

    model = torch.nn.Linear(64, 10).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(256, 64, device="cuda"), torch.randint(0, 10, (256,), device="cuda")
    readback, losses, shown = DeferredReadback(), [], []
    counter = torch.zeros((), dtype=torch.int64, device="cuda")  # torch.tensor(step, device="cuda") would sync
    with sync_guard() as report:
        for step in range(30):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
            readback.push({"loss": loss.detach(), "step": counter.clone()}, step=step)
            counter += 1
            reading = readback.latest()
            if reading is not None:
                shown.append(reading)
    assert report.count == 0, report.table()
    final = readback.wait()
    exact = torch.stack(losses).double().tolist()
    assert final.step == 29 and final.values == {"loss": exact[29], "step": 29.0}
    assert shown, "no reading arrived during 30 steps"
    for reading in shown:
        assert reading.values == {"loss": exact[reading.step], "step": float(reading.step)}
    assert [r.step for r in shown] == sorted(r.step for r in shown)


@pytest.mark.parametrize("name, syncs", [
    ("no reads", 0), ("item() every step", 4), ("float() in a logger", 4), ("NaN check every step", 4),
    ("item() every N steps", 2), ("one copy every N steps", 2), ("deferred readback", 0),
])
def test_read_patterns_sync_as_their_names_say(name, syncs):
    from types import SimpleNamespace

    from mentor.profiling import sync_guard
    from mentor.read_patterns import pattern_hooks

    hook, reads = pattern_hooks(name, every=2)
    losses = torch.rand(4, device="cuda") + 0.5
    steps = [SimpleNamespace(index=i, loss=losses[i]) for i in range(4)]
    with sync_guard() as report:
        for step in steps:
            if hook is not None:
                hook(step)
    assert report.count == syncs, report.table()


def test_print_of_a_cuda_loss_syncs_every_step():
    from types import SimpleNamespace

    from mentor.profiling import sync_guard
    from mentor.read_patterns import pattern_hooks

    hook, reads = pattern_hooks("print every step")
    losses = torch.rand(4, device="cuda")
    with sync_guard() as report:
        for i in range(4):
            hook(SimpleNamespace(index=i, loss=losses[i]))
    assert report.count >= 4 and len(reads.printed.getvalue().splitlines()) == 4, report.table()


def test_the_stale_read_demo_reads_the_old_value_first():
    from mentor.read_patterns import stale_read_demo

    assert stale_read_demo() == {"before": -1.0, "early": -1.0, "event_done_early": False, "after": 42.0}


def test_blocks_count_syncs_report_on_time_and_read_every_block_on_the_gpu():
    from mentor.bench import Config, metrics_config, suite_config
    from mentor.blocks import compare_blocks
    from mentor.data import device_batches
    from mentor.train import build_setup

    setup = build_setup(num_classes=10, device="cuda")
    configs = [Config("no metrics"), metrics_config("naive", 10, "cuda"), suite_config(10, "cuda")]
    cmp = compare_blocks(configs, setup, device_batches(8, 64, 10, "cuda"), rounds=3, block=6, settle=2,
                         report_every=5)
    assert [cmp[c.name].syncs_per_step for c in configs] == [0, 2, 0]
    assert all(len(steps) == 4 and min(steps) > 0 for c in configs for steps in cmp[c.name].round_step_ms)
    # 4 timed steps per block: timed step 5 is round 1 position 0, timed step 10 round 2 position 1
    assert cmp.settings["report_steps"]["fused suite"] == [[1, 0], [2, 1]]
    hook = cmp.settings["hook_ms"]
    assert hook["no metrics"] < hook["fused suite"] < hook["naive"]
