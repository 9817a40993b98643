"""mentor.lab.read_patterns: what each way of reading the loss reads, and when the NaN checks fire, on CPU.

The syncs each pattern costs on a GPU are counted by the ``@gpu`` tests at the end (run with `pytest -m gpu`)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from test_readback import FakeEvent, FakeGPU

from marks import gpu
from mentor import readback
from mentor.lab.read_patterns import READ_PATTERNS, NonFiniteLoss, pattern_hooks, read_configs, stale_read_demo
from mentor.syncs import sync_guard

LOSSES = [0.5, 0.25, 0.125, 1.0, 2.0, 0.75]


def loop(name: str, steps: list[tuple[int, float]], every: int = 2, reached: list[int] | None = None):
    """Run a pattern's hooks as a training loop does: ``on_step`` on each (step index, loss) pair, as given, and
    ``on_report`` after every ``every`` of them; ``reached`` collects the index of each step begun."""
    on_step, on_report, reads = pattern_hooks(name)
    for count, (i, loss) in enumerate(steps, start=1):
        if reached is not None:
            reached.append(i)
        if on_step is not None:
            on_step(SimpleNamespace(index=i, loss=torch.tensor(loss)))
        if on_report is not None and count % every == 0:
            on_report(count)
    return reads


def run(name: str, losses: list[float] = LOSSES, every: int = 2):
    return loop(name, list(enumerate(losses)), every)


@pytest.mark.parametrize("name", ["item() every step", "float() in a logger", "deferred readback"])
def test_every_step_patterns_read_every_loss(name: str) -> None:
    assert run(name).values == list(enumerate(LOSSES))  # on CPU a deferred read arrives at once


def test_every_n_reads_the_last_loss_of_each_window() -> None:
    assert run("item() every N steps", every=2).values == [(1, 0.25), (3, 1.0), (5, 0.75)]
    assert run("item() every N steps", every=4).values == [(3, 1.0)]


def test_one_copy_every_n_reads_the_window_mean() -> None:
    assert run("one copy every N steps", every=2).values == [(1, 0.375), (3, 0.5625), (5, 1.375)]
    assert run("one copy every N steps", every=3).values == [(2, pytest.approx(0.875 / 3)), (5, pytest.approx(1.25))]


def test_print_formats_each_step() -> None:
    printed = run("print every step", LOSSES[:2]).printed.getvalue()
    assert printed == "step 0: loss 0.5\nstep 1: loss 0.25\n"


def test_no_reads_has_no_hook() -> None:
    on_step, on_report, reads = pattern_hooks("no reads")
    assert on_step is None and on_report is None and reads.values == []


@pytest.mark.parametrize("name, on_step, on_report", [
    ("item() every step", True, False), ("print every step", True, False), ("float() in a logger", True, False),
    ("NaN check every step", True, False), ("deferred readback", True, False),
    ("item() every N steps", True, True), ("one copy every N steps", True, True),
])
def test_only_the_every_n_patterns_read_in_the_report(name: str, on_step: bool, on_report: bool) -> None:
    step, report, _ = pattern_hooks(name)
    assert (callable(step), callable(report)) == (on_step, on_report) and (report is None) == (not on_report)


@pytest.mark.parametrize("name", ["item() every N steps", "one copy every N steps"])
def test_a_report_with_no_step_since_the_last_reads_nothing(name: str) -> None:
    on_step, on_report, reads = pattern_hooks(name)
    on_report(0)
    on_step(SimpleNamespace(index=0, loss=torch.tensor(0.5)))
    on_report(1)
    on_report(1)
    assert reads.values == [(0, 0.5)]


@pytest.mark.parametrize("name, fires_at", [
    ("NaN check every step", 2), ("one copy every N steps", 3), ("deferred readback", 2),
])
def test_nan_checks_fire_with_the_step_that_holds_the_nan(name: str, fires_at: int) -> None:
    """A NaN at step 2: the per-step checks see it at once; the coalesced copy counts it on the device and
    raises at the end of its window (step 3, every=2)."""
    losses = [0.5, 0.25, math.nan, 1.0, 2.0]
    reached: list[int] = []
    with pytest.raises(NonFiniteLoss, match=rf"^the loss of step {fires_at} is NaN or infinite$"):
        loop(name, list(enumerate(losses)), every=2, reached=reached)
    assert reached[-1] == fires_at


def test_reading_every_n_steps_misses_a_nan_in_between() -> None:
    """The sampled loss of steps 1 and 3 is finite: the NaN of step 2 is never read."""
    assert run("item() every N steps", [0.5, 0.25, math.nan, 1.0], every=2).values == [(1, 0.25), (3, 1.0)]


def test_the_deferred_check_fires_when_the_nan_arrives(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU the NaN's reading arrives a step or more later: the check raises then, naming the NaN's step."""
    fake = FakeGPU()
    monkeypatch.setattr(readback, "_defers", lambda device: True)
    monkeypatch.setattr(readback, "_pinned_buffer", fake.buffer)
    monkeypatch.setattr(readback, "_record_event", lambda: FakeEvent(fake.events))
    hook, _, reads = pattern_hooks("deferred readback")
    losses = [0.5, math.nan, 1.0, 2.0]
    for i, loss in enumerate(losses[:3]):
        hook(SimpleNamespace(index=i, loss=torch.tensor(loss)))
        if i >= 1:  # the GPU finishes step i - 1 while the host launches step i + 1
            fake.events[i - 1].done = True
            fake.buffers[(i - 1) % 4].land()
    assert reads.values == [(0, 0.5)]
    with pytest.raises(NonFiniteLoss, match="the loss of step 1 is NaN or infinite"):
        hook(SimpleNamespace(index=3, loss=torch.tensor(losses[3])))


def test_read_configs_are_bench_configs_in_order() -> None:
    configs = read_configs()
    assert [c.name for c in configs] == list(READ_PATTERNS)
    assert configs[5].description == "loss.item() and the NaN check at each report only (a NaN in between is missed)"
    assert configs[0].make() == (None, None)
    on_step, on_report = configs[1].make()
    assert callable(on_step) and on_report is None
    on_step, on_report = configs[6].make()
    assert callable(on_step) and callable(on_report)


def test_read_configs_run_in_a_block_comparison_with_reports() -> None:
    from mentor.lab.blocks import compare_blocks
    from mentor.lab.data import device_batches
    from mentor.lab.train import build_setup

    setup = build_setup(num_classes=10)
    cmp = compare_blocks(read_configs(), setup, device_batches(2, 32, 10), rounds=2, block=3, settle=1,
                         report_every=1)
    assert [r.name for r in cmp.results] == list(READ_PATTERNS)
    reporting = {"item() every N steps", "one copy every N steps"}
    assert {n for n, steps in cmp.settings["report_steps"].items() if steps} == reporting
    assert all(cmp.settings["report_steps"][n] == [[0, 0], [1, 0]] for n in reporting)


def test_an_unknown_pattern_is_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown read pattern 'tqdm': pass one of"):
        pattern_hooks("tqdm")
    with pytest.raises(ValueError, match=r"unknown read pattern 'tqdm': pass one of"):
        read_configs(["no reads", "tqdm"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_the_stale_read_demo_needs_cuda() -> None:
    with pytest.raises(RuntimeError, match="stale_read_demo shows a CUDA copy in flight; torch sees no CUDA"):
        stale_read_demo()


def test_the_stale_read_demo_without_cuda_says_exactly_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from mentor.lab import read_patterns

    monkeypatch.setattr(read_patterns.torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError) as raised:
        read_patterns.stale_read_demo()
    assert str(raised.value) == "stale_read_demo shows a CUDA copy in flight; torch sees no CUDA device here."


def test_the_stale_read_demo_sleeps_then_copies_and_reads_before_and_after_the_event(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake torch (in mentor.lab.read_patterns only): the copy lands when the host waits on the event.

    The default sleep is 100_000_000 cycles, queued before the copy; the early read sees -1.0 and an event
    not done, the read after event.synchronize() sees 42.0.
    """
    from mentor.lab import read_patterns

    log: list = []

    class Tensor:
        def __init__(self, value: float, where: str) -> None:
            self.value, self.where, self.pending = value, where, None

        def copy_(self, src: "Tensor", non_blocking: bool = False) -> None:
            log.append(("copy", src.where, self.where, non_blocking))
            self.pending = src.value

        def item(self) -> float:
            log.append(("item", self.value))
            return self.value

    host_buffers: list[Tensor] = []

    def full(size, value, dtype=None, pin_memory=False, device=None):
        assert size == (1,) and dtype == "float64"
        tensor = Tensor(value, device or ("pinned" if pin_memory else "pageable"))
        if device is None:
            host_buffers.append(tensor)
        return tensor

    class Event:
        def record(self) -> None:
            log.append("record")

        def query(self) -> bool:
            return False

        def synchronize(self) -> None:
            log.append("event.synchronize")
            for buffer in host_buffers:
                if buffer.pending is not None:
                    buffer.value, buffer.pending = buffer.pending, None

    cuda = SimpleNamespace(is_available=lambda: True, synchronize=lambda: log.append("cuda.synchronize"),
                           _sleep=lambda cycles: log.append(("sleep", cycles)), Event=Event)
    monkeypatch.setattr(read_patterns, "torch", SimpleNamespace(cuda=cuda, full=full, float64="float64"))
    result = read_patterns.stale_read_demo()
    assert result == {"before": -1.0, "early": -1.0, "event_done_early": False, "after": 42.0}
    assert log == ["cuda.synchronize", ("sleep", 100_000_000), ("copy", "cuda", "pinned", True), "record",
                   ("item", -1.0), "event.synchronize", ("item", 42.0)]


def run_at(name: str, steps: list[tuple[int, float]], every: int = 2):
    """Run a pattern's hooks on (step index, loss) pairs, as given, with a report after every ``every`` of them."""
    return loop(name, steps, every)


@pytest.mark.parametrize("name", ["item() every step", "float() in a logger"])
def test_the_unchecked_every_step_reads_keep_a_nan_and_raise_nothing(name: str) -> None:
    """These two patterns only read: a NaN or an infinity is kept as read, no check raises (the deferred one checks)."""
    values = run(name, [0.5, math.nan, math.inf]).values
    assert values[0] == (0, 0.5) and values[1][0] == 1 and math.isnan(values[1][1]) and values[2] == (2, math.inf)


def test_the_nan_check_every_step_reads_no_values() -> None:
    """The per-step NaN check only checks: it keeps no (step, value) pairs."""
    assert run("NaN check every step").values == []


def test_the_patterns_label_reads_with_the_step_index_they_are_given() -> None:
    """Indices need not start at 0 (a resumed run): each value carries its step's own index."""
    steps = [(10, 0.5), (11, 0.25), (12, 4.0)]
    for name in ["item() every step", "float() in a logger", "deferred readback"]:
        assert run_at(name, steps).values == steps, name
    assert run_at("item() every N steps", steps).values == [(11, 0.25)]  # the report after the second step


def test_the_deferred_pattern_tells_new_readings_by_their_step_not_their_value() -> None:
    """The loss of step 0 is 1.0, the next reading's step is 1: a value equal to the new step number is no repeat."""
    assert run("deferred readback", [1.0, 5.0, 2.0]).values == [(0, 1.0), (1, 5.0), (2, 2.0)]


def test_pattern_hooks_fill_the_reads_they_are_given() -> None:
    """A Reads passed in is the one returned and filled (after what it already held)."""
    from mentor.lab.read_patterns import Reads

    mine = Reads(values=[(-1, 9.0)])
    hook, _, reads = pattern_hooks("item() every step", reads=mine)
    hook(SimpleNamespace(index=0, loss=torch.tensor(0.5)))
    assert reads is mine and mine.values == [(-1, 9.0), (0, 0.5)]


@pytest.mark.parametrize("loss", [math.nan, math.inf, -math.inf])
def test_item_every_n_checks_the_sampled_loss_and_names_its_step(loss: float) -> None:
    """The sampled loss of step 1 (every=2) is non-finite: the check raises with the whole message."""
    with pytest.raises(NonFiniteLoss) as raised:
        run("item() every N steps", [0.5, loss, 1.0], every=2)
    assert str(raised.value) == "the loss of step 1 is NaN or infinite"


def test_a_report_every_step_reads_each_step() -> None:
    assert run("item() every N steps", [0.5, 0.25], every=1).values == [(0, 0.5), (1, 0.25)]
    assert run("one copy every N steps", [0.5, 0.25], every=1).values == [(0, 0.5), (1, 0.25)]


def test_read_configs_make_hooks_that_check_at_the_report() -> None:
    """The config's report checks the newest loss: a NaN at step 1 raises at the report after it, naming step 1."""
    (config,) = read_configs(["item() every N steps"])
    on_step, on_report = config.make()
    on_step(SimpleNamespace(index=0, loss=torch.tensor(0.5)))
    on_step(SimpleNamespace(index=1, loss=torch.tensor(math.nan)))
    with pytest.raises(NonFiniteLoss, match=r"^the loss of step 1 is NaN or infinite$"):
        on_report(2)


# ----------------------------------------------------------------------------------------------------------
# On CUDA: the syncs of each pattern, and the stale read


@gpu
@pytest.mark.parametrize("name, syncs", [
    ("no reads", 0), ("item() every step", 4), ("float() in a logger", 4), ("NaN check every step", 4),
    ("item() every N steps", 2), ("one copy every N steps", 2), ("deferred readback", 0),
])
def test_read_patterns_sync_as_their_names_say(name, syncs):
    on_step, on_report, reads = pattern_hooks(name)
    losses = torch.rand(4, device="cuda") + 0.5
    steps = [SimpleNamespace(index=i, loss=losses[i]) for i in range(4)]
    with sync_guard() as report:
        for count, step in enumerate(steps, start=1):
            if on_step is not None:
                on_step(step)
            if on_report is not None and count % 2 == 0:
                on_report(count)
    assert report.count == syncs, report.table()


@gpu
def test_print_of_a_cuda_loss_syncs_every_step():
    hook, _, reads = pattern_hooks("print every step")
    losses = torch.rand(4, device="cuda")
    with sync_guard() as report:
        for i in range(4):
            hook(SimpleNamespace(index=i, loss=losses[i]))
    assert report.count >= 4 and len(reads.printed.getvalue().splitlines()) == 4, report.table()


@gpu
def test_the_stale_read_demo_reads_the_old_value_first():
    assert stale_read_demo() == {"before": -1.0, "early": -1.0, "event_done_early": False, "after": 42.0}
