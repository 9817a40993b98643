"""mentor.readback: DeferredReadback's logic on CPU, with fake events standing in for CUDA's.

The fakes replace the three CUDA-only pieces (whether a device defers, the pinned buffer, the event),
so that the ring of buffers, the order of readings and the rule "never read before the event" are
checked here with exact values, and so is the error raised where a report with invalid labels arrives (never
before, at every call while it is the newest, once for one that a newer push replaced). The real GPU path (0 syncs,
correct values, the error of a FusedMetrics report made with no read) is the ``@gpu`` tests at the end (run with
`pytest -m gpu`).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from exact import whole
from marks import gpu
from mentor import readback
from mentor.invalid import InvalidLabelsError
from mentor.readback import DeferredReadback, Reading
from mentor.syncs import sync_guard


class FakeEvent:
    """An event that completes when the test says so; it counts the host's waits on it."""

    def __init__(self, log: list) -> None:
        self.done = False
        self.waits = 0
        log.append(self)

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waits += 1
        self.done = True


class FakeBuffer:
    """A host buffer whose copy lands only when its event completes: reading early shows the old contents."""

    def __init__(self, size: int) -> None:
        self.data = torch.zeros(size, dtype=torch.float64)
        self.reads = 0

    def numel(self) -> int:
        return self.data.numel()

    def copy_(self, src: torch.Tensor, non_blocking: bool = False) -> None:
        assert non_blocking is True
        self.pending = src.clone()

    def land(self) -> None:
        self.data = self.pending

    def tolist(self) -> list[float]:
        self.reads += 1
        return self.data.tolist()


@dataclass
class FakeGPU:
    """The events and buffers made while CPU tensors take the CUDA path."""

    events: list[FakeEvent] = field(default_factory=list)
    buffers: list[FakeBuffer] = field(default_factory=list)

    def buffer(self, size: int) -> FakeBuffer:
        self.buffers.append(FakeBuffer(size))
        return self.buffers[-1]


def _take_the_cuda_path(mp: pytest.MonkeyPatch) -> FakeGPU:
    """Make CPU tensors take the CUDA path: pushes defer, and buffers and events are fakes."""
    fake = FakeGPU()
    mp.setattr(readback, "_defers", lambda device: True)
    mp.setattr(readback, "_pinned_buffer", fake.buffer)
    mp.setattr(readback, "_record_event", lambda: FakeEvent(fake.events))
    return fake


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> FakeGPU:
    """:func:`_take_the_cuda_path` for one test."""
    return _take_the_cuda_path(monkeypatch)


def test_nothing_is_read_before_its_event_completes(fake_gpu: FakeGPU) -> None:
    rb = DeferredReadback(slots=2)
    rb.push({"loss": torch.tensor(0.75)}, step=10)
    assert rb.latest() is None
    fake_gpu.events[0].done = True
    for buffer in fake_gpu.buffers:
        buffer.land()
    assert rb.latest() == Reading(10, {"loss": 0.75})


def test_latest_is_the_newest_completed_push_and_keeps_it(fake_gpu: FakeGPU) -> None:
    rb = DeferredReadback(slots=3)
    for step in range(3):
        rb.push({"loss": torch.tensor(float(step))}, step=step)
    fake_gpu.events[0].done = True
    fake_gpu.buffers[0].land()
    assert rb.latest() == Reading(0, {"loss": 0.0})
    fake_gpu.events[1].done = fake_gpu.events[2].done = True
    for buffer in fake_gpu.buffers[1:]:
        buffer.land()
    assert rb.latest() == Reading(2, {"loss": 2.0})  # step 1 is skipped: step 2 is newer
    assert rb.latest() == Reading(2, {"loss": 2.0})  # and kept while nothing newer arrives


def test_an_older_completed_push_is_shown_while_the_newest_is_pending(fake_gpu: FakeGPU) -> None:
    rb = DeferredReadback(slots=4)
    for step in range(3):
        rb.push({"loss": torch.tensor(step + 0.5)}, step=step)
    fake_gpu.events[1].done = True
    fake_gpu.buffers[1].land()
    assert rb.latest() == Reading(1, {"loss": 1.5})


def test_buffers_are_reused_in_turn_and_a_push_overwrites_the_oldest(fake_gpu: FakeGPU) -> None:
    rb = DeferredReadback(slots=2)
    for step in range(5):
        rb.push({"a": torch.tensor(step), "b": torch.tensor(-step)}, step=step)
    assert len(fake_gpu.buffers) == 2
    assert len(fake_gpu.events) == 5
    # the buffers hold the copies of steps 3 (slot 1) and 4 (slot 0); steps 0-2 were overwritten unread
    fake_gpu.events[3].done = True
    fake_gpu.buffers[1].land()
    assert rb.latest() == Reading(3, {"a": 3.0, "b": -3.0})
    fake_gpu.events[0].done = True  # step 0's event completing says nothing about the slot's current copy
    assert rb.latest() == Reading(3, {"a": 3.0, "b": -3.0})


def test_a_new_set_of_keys_gets_a_buffer_of_its_size(fake_gpu: FakeGPU) -> None:
    rb = DeferredReadback(slots=2)
    rb.push({"loss": torch.tensor(1.0)})
    rb.push({"loss": torch.tensor(2.0)})
    rb.push({"loss": torch.tensor(3.0), "acc": torch.tensor(0.5)})
    assert [b.numel() for b in fake_gpu.buffers] == [1, 1, 2]
    fake_gpu.events[2].done = True
    fake_gpu.buffers[2].land()
    assert rb.latest() == Reading(2, {"loss": 3.0, "acc": 0.5})  # step defaults to the push count


def test_wait_synchronizes_on_the_newest_push_only(fake_gpu: FakeGPU) -> None:
    rb = DeferredReadback(slots=3)
    assert rb.wait() is None
    rb.push({"loss": torch.tensor(1.0)}, step=0)
    rb.push({"loss": torch.tensor(2.0)}, step=1)
    for buffer in fake_gpu.buffers:
        buffer.land()
    assert rb.wait() == Reading(1, {"loss": 2.0})
    assert [e.waits for e in fake_gpu.events] == [0, 1]
    assert rb.wait() == Reading(1, {"loss": 2.0})
    assert [e.waits for e in fake_gpu.events] == [0, 1]  # already read: no second wait


def test_the_stacked_copy_is_float64_and_exact_for_large_counts(fake_gpu: FakeGPU) -> None:
    rb = DeferredReadback()
    rb.push({"seen": torch.tensor(2**40 + 1), "loss": torch.tensor(0.1, dtype=torch.float32)})
    buffer = fake_gpu.buffers[0]
    assert buffer.pending.dtype == torch.float64
    buffer.land()
    fake_gpu.events[0].done = True
    assert rb.latest().values == {"seen": float(2**40 + 1), "loss": float(torch.tensor(0.1, dtype=torch.float32))}


@settings(max_examples=60, deadline=None)
@given(slots=st.integers(2, 5), plan=st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=12))
def test_readings_never_go_back_and_only_come_from_completed_copies(slots: int, plan: list[tuple[bool, bool]]) -> None:
    """Property: whatever completes when, latest() shows a landed copy, never older than the one shown before."""
    with pytest.MonkeyPatch.context() as mp:
        fake = _take_the_cuda_path(mp)
        rb = DeferredReadback(slots=slots)
        owner: dict[int, int] = {}  # buffer index -> step of its newest copy
        shown = -1
        for step, (complete_now, read_now) in enumerate(plan):
            rb.push({"v": torch.tensor(float(step))}, step=step)
            owner[step % slots] = step
            if complete_now:  # the GPU finishes everything enqueued so far
                for event in fake.events:
                    event.done = True
                for buffer in fake.buffers:
                    buffer.land()
            if read_now:
                reading = rb.latest()
                if reading is not None:
                    assert reading.values == {"v": float(reading.step)}
                    assert reading.step >= shown
                    assert owner[reading.step % slots] == reading.step or reading.step == shown
                    shown = reading.step


def test_cpu_values_are_read_at_once() -> None:
    rb = DeferredReadback()
    assert rb.latest() is None
    rb.push({"loss": torch.tensor([0.25]), "ok": torch.tensor(True)}, step=7)
    assert rb.latest() == Reading(7, {"loss": 0.25, "ok": 1.0})
    assert rb.wait() == Reading(7, {"loss": 0.25, "ok": 1.0})


@pytest.mark.parametrize("slots", [1, 0, 2.0, True, "4"])
def test_bad_slots_are_refused(slots: object) -> None:
    with pytest.raises(ValueError, match=r"slots must be a whole number >= 2 .*not"):
        DeferredReadback(slots=slots)  # type: ignore[arg-type]


@pytest.mark.parametrize("values, error, match", [
    ({}, TypeError, r"push takes a non-empty dict of name -> tensor"),
    ([torch.tensor(1.0)], TypeError, r"push takes a non-empty dict.*not list"),
    ({"loss": 0.5}, TypeError, r"push's value 'loss' is a float, not a tensor.*already been read back"),
    ({"loss": torch.ones(3)}, ValueError, r"push's value 'loss' has shape \(3,\); pass one-element tensors"),
    ({1: torch.tensor(1.0)}, TypeError, r"push's keys name the values and must be strings, not 1"),
    ({"a": torch.tensor(1.0), "b": torch.tensor(1.0, device="meta")}, ValueError, r"on several devices \(cpu, meta\)"),
    ({"a": torch.tensor(1.0, device="meta")}, ValueError, r"push reads CUDA or CPU tensors, not meta ones"),
])
def test_bad_values_are_refused_by_name(values: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        DeferredReadback().push(values)  # type: ignore[arg-type]


def test_a_reading_pickles() -> None:
    assert pickle.loads(pickle.dumps(Reading(3, {"loss": 0.5}))) == Reading(3, {"loss": 0.5})


def test_cpu_values_of_one_integer_dtype_are_read_as_python_floats() -> None:
    # one dtype takes the stack-then-convert path; the reading must still hold floats, as Reading promises
    rb = DeferredReadback()
    rb.push({"correct": torch.tensor(3), "seen": torch.tensor(4)}, step=2)
    reading = rb.latest()
    assert reading == Reading(2, {"correct": 3.0, "seen": 4.0})
    assert [type(v) for v in reading.values.values()] == [float, float]


def test_only_cuda_devices_defer_their_reads() -> None:
    # the real _defers (the fake_gpu fixture replaces it): a torch.device is made without a GPU
    assert readback._defers(torch.device("cuda")) is True
    assert readback._defers(torch.device("cuda", 1)) is True
    assert readback._defers(torch.device("cpu")) is False
    assert readback._defers(torch.device("meta")) is False


def test_a_reading_is_converted_once_and_kept(fake_gpu: FakeGPU) -> None:
    # latest() stops at the push it already read: its buffer is not read again, the same Reading comes back
    rb = DeferredReadback(slots=2)
    rb.push({"loss": torch.tensor(0.5)}, step=0)
    fake_gpu.events[0].done = True
    fake_gpu.buffers[0].land()
    first = rb.latest()
    assert first == Reading(0, {"loss": 0.5}) and fake_gpu.buffers[0].reads == 1
    rb.push({"loss": torch.tensor(1.5)}, step=1)  # still in flight
    assert rb.latest() is first and rb.latest() is first
    assert fake_gpu.buffers[0].reads == 1


def test_a_reading_owns_its_values_and_they_cannot_be_edited() -> None:
    """latest() returns the same Reading until a newer push arrives: an edit of its values showed in later calls."""
    rb = DeferredReadback()
    rb.push({"loss": torch.tensor(0.5)}, step=3)
    reading = rb.latest()
    with pytest.raises(TypeError, match=whole("'mappingproxy' object does not support item assignment")):
        reading.values["loss"] = 9.0  # type: ignore[index]
    with pytest.raises(AttributeError, match=r"^'mappingproxy' object has no attribute 'clear'$"):
        reading.values.clear()  # type: ignore[attr-defined]
    assert rb.latest().values == {"loss": 0.5} and rb.wait().values == {"loss": 0.5}
    # a Reading made by hand copies the mapping it is given
    source = {"loss": 0.25}
    made = Reading(4, source)
    source["loss"] = 1.0
    assert made.values == {"loss": 0.25}
    assert repr(made) == "Reading(step=4, values={'loss': 0.25})"
    copy = pickle.loads(pickle.dumps(made))
    assert copy == made and type(copy.values).__name__ == "mappingproxy"


def test_a_deferred_reading_owns_its_values_too(fake_gpu: FakeGPU) -> None:
    rb = DeferredReadback(slots=2)
    rb.push({"loss": torch.tensor(0.5)}, step=0)
    fake_gpu.events[0].done = True
    fake_gpu.buffers[0].land()
    with pytest.raises(TypeError, match=whole("'mappingproxy' object does not support item assignment")):
        rb.latest().values["loss"] = 9.0  # type: ignore[index]
    assert rb.latest() == Reading(0, {"loss": 0.5})


@pytest.mark.parametrize("step", [1.5, True, -1, "3", torch.tensor(3)], ids=repr)
def test_a_bad_step_is_refused_by_name(step: object) -> None:
    tensor = isinstance(step, torch.Tensor)
    hint = " (reading a tensor's value is a sync: pass the loop's own counter)" if tensor else ""
    message = ("push's step must be a whole number >= 0, such as the loop's step=i, or None for the number of earlier "
               f"pushes, not {step!r}{hint}.")
    rb = DeferredReadback()
    with pytest.raises(ValueError, match=whole(message)):
        rb.push({"loss": torch.tensor(0.5)}, step=step)  # type: ignore[arg-type]
    assert rb.latest() is None
    rb.push({"loss": torch.tensor(0.5)}, step=0)  # 0 is a step; a refused push was not counted
    rb.push({"loss": torch.tensor(0.75)})
    assert rb.latest() == Reading(1, {"loss": 0.75})


# --- invalid labels: a report whose count is not 0 raises where it arrives ---

TAIL = (" and were left out of its counts, so every value of that report is NaN; fix the labels, or pass "
        "ignore_index=<the padding label> to the metric to skip them.")
NAN = float("nan")


def land_all(fake: FakeGPU) -> None:
    """The GPU finishes everything enqueued so far."""
    for event in fake.events:
        event.done = True
    for buffer in fake.buffers:
        buffer.land()


def test_an_invalid_report_raises_when_it_arrives_and_at_every_call_until_a_clean_one(fake_gpu: FakeGPU) -> None:
    rb = DeferredReadback(slots=3)
    rb.push({"loss": torch.tensor(NAN), "invalid_labels": torch.tensor(2)}, step=10)
    assert rb.latest() is None  # not arrived: nothing to raise yet, nothing read
    land_all(fake_gpu)
    message = whole("2 prediction(s) or target(s) outside its range (0..num_classes-1 for a multiclass metric, 0 or 1 for a binary or multilabel target) reached the metric since its last reset "
                    "(step 10)" + TAIL)
    for _ in range(2):
        with pytest.raises(InvalidLabelsError, match=message) as caught:
            rb.latest()
        assert (caught.value.count, caught.value.step, caught.value.counts) == (2, 10, {"invalid_labels": 2})
    with pytest.raises(InvalidLabelsError, match=message):
        rb.wait()
    assert [e.waits for e in fake_gpu.events] == [0] and fake_gpu.buffers[0].reads == 1  # read once, never waited
    rb.push({"loss": torch.tensor(0.5), "invalid_labels": torch.tensor(0)}, step=11)
    with pytest.raises(InvalidLabelsError, match=message):
        rb.latest()  # the clean push is still in flight: the newest arrived is the invalid one
    land_all(fake_gpu)
    assert rb.latest() == Reading(11, {"loss": 0.5, "invalid_labels": 0.0})  # the count stays in the values
    assert rb.wait() == Reading(11, {"loss": 0.5, "invalid_labels": 0.0})


def test_prefixed_counts_of_several_metrics_count_and_are_named(fake_gpu: FakeGPU) -> None:
    rb = DeferredReadback()
    rb.push({"train/loss": torch.tensor(NAN), "train/invalid_labels": torch.tensor(0),
             "val/a_invalid_labels_x": torch.tensor(3), "valid_labels": torch.tensor(5)}, step=4)
    land_all(fake_gpu)
    with pytest.raises(InvalidLabelsError, match=whole(
            "3 prediction(s) or target(s) outside its range (0..num_classes-1 for a multiclass metric, 0 or 1 for a binary or multilabel target) reached the metric since its last reset (step 4, "
            "val/a_invalid_labels_x: 3)" + TAIL)):
        rb.latest()


def test_a_key_that_is_no_count_never_raises(fake_gpu: FakeGPU) -> None:
    rb = DeferredReadback()
    rb.push({"valid_labels": torch.tensor(3), "invalid_labelsx": torch.tensor(2), "xinvalid_labels": torch.tensor(1)},
            step=1)
    land_all(fake_gpu)
    assert rb.latest() == Reading(1, {"valid_labels": 3.0, "invalid_labelsx": 2.0, "xinvalid_labels": 1.0})


@pytest.mark.parametrize("read", ["latest", "wait"])
def test_an_invalid_report_skipped_by_a_newer_arrival_raises_once(fake_gpu: FakeGPU, read: str) -> None:
    """Both copies arrived before the call: the newest is shown, but the older's invalid labels are not lost."""
    rb = DeferredReadback(slots=4)
    rb.push({"loss": torch.tensor(0.5), "invalid_labels": torch.tensor(0)}, step=0)
    rb.push({"loss": torch.tensor(NAN), "invalid_labels": torch.tensor(1)}, step=1)
    rb.push({"loss": torch.tensor(NAN), "invalid_labels": torch.tensor(4)}, step=2)
    rb.push({"loss": torch.tensor(0.25), "invalid_labels": torch.tensor(0)}, step=3)
    land_all(fake_gpu)
    with pytest.raises(InvalidLabelsError) as caught:
        getattr(rb, read)()
    assert (caught.value.step, caught.value.counts) == (2, {"invalid_labels": 4})  # the newest of the skipped ones
    assert rb.latest() == Reading(3, {"loss": 0.25, "invalid_labels": 0.0})  # once: then the newest
    assert rb.wait() == Reading(3, {"loss": 0.25, "invalid_labels": 0.0})
    assert [b.reads for b in fake_gpu.buffers] == [1, 1, 1, 1]  # each arrived push read once, skipped ones too


def test_cpu_reports_raise_at_the_call_after_the_push_and_a_replaced_one_once() -> None:
    rb = DeferredReadback()
    rb.push({"loss": torch.tensor(NAN), "invalid_labels": torch.tensor(5)}, step=0)  # read at once, no error yet
    with pytest.raises(InvalidLabelsError) as caught:
        rb.latest()
    assert (caught.value.count, caught.value.step) == (5, 0)
    with pytest.raises(InvalidLabelsError):
        rb.wait()
    rb.push({"loss": torch.tensor(0.5), "invalid_labels": torch.tensor(0)}, step=1)
    assert rb.latest() == Reading(1, {"loss": 0.5, "invalid_labels": 0.0})  # told already: no second error
    # two pushes between calls: the invalid one is replaced before any call could raise for it
    rb.push({"loss": torch.tensor(NAN), "invalid_labels": torch.tensor(1)}, step=2)
    rb.push({"loss": torch.tensor(0.75), "invalid_labels": torch.tensor(0)}, step=3)
    with pytest.raises(InvalidLabelsError) as caught:
        rb.latest()
    assert (caught.value.count, caught.value.step) == (1, 2)
    assert rb.latest() == Reading(3, {"loss": 0.75, "invalid_labels": 0.0})


def test_a_fused_metrics_report_with_invalid_labels_raises_where_it_is_read() -> None:
    from mentor.suite import FusedMetrics

    suite, rb = FusedMetrics(3), DeferredReadback()
    suite.update(torch.tensor(1.0), torch.tensor([0, 1, 4]), torch.tensor([0, 1, -2]))  # 4 and -2: one position
    rb.push(suite.compute(), step=7)
    with pytest.raises(InvalidLabelsError) as caught:
        rb.latest()
    assert (caught.value.count, caught.value.step) == (1, 7)
    suite.reset()
    suite.update(torch.tensor(1.0), torch.tensor([0, 1]), torch.tensor([0, 1]))
    rb.push(suite.compute(), step=8)
    reading = rb.latest()
    assert reading.step == 8 and reading.values["invalid_labels"] == 0.0 and reading.values["accuracy_micro"] == 1.0


@settings(max_examples=60, deadline=None)
@given(slots=st.integers(2, 4), plan=st.lists(st.tuples(st.booleans(), st.booleans(), st.booleans()), min_size=1,
                                              max_size=12))
def test_no_reading_with_invalid_labels_is_ever_returned(slots: int, plan: list[tuple[bool, bool, bool]]) -> None:
    """Property: whatever completes when, a returned reading is a clean push's, an error names an invalid push,
    and while the newest arrived push is invalid every call raises for it."""
    with pytest.MonkeyPatch.context() as mp:
        fake = _take_the_cuda_path(mp)
        rb = DeferredReadback(slots=slots)
        invalid = set()
        for step, (bad, complete_now, read_now) in enumerate(plan):
            if bad:
                invalid.add(step)
            rb.push({"v": torch.tensor(float(step)), "invalid_labels": torch.tensor(int(bad))}, step=step)
            if complete_now:
                land_all(fake)
            if read_now:
                try:
                    reading = rb.latest()
                except InvalidLabelsError as error:
                    assert error.step in invalid and error.counts == {"invalid_labels": 1}
                else:
                    if reading is not None:
                        assert reading.step not in invalid
                        assert reading.values == {"v": float(reading.step), "invalid_labels": 0.0}
                if complete_now and bad:  # the newest push arrived and is invalid
                    with pytest.raises(InvalidLabelsError) as caught:
                        rb.latest()
                    assert caught.value.step == step


@gpu
def test_a_cuda_reading_owns_its_values():
    rb = DeferredReadback()
    rb.push({"loss": torch.tensor(0.5, device="cuda")}, step=0)
    reading = rb.wait()
    with pytest.raises(TypeError, match=whole("'mappingproxy' object does not support item assignment")):
        reading.values["loss"] = 9.0
    rb.push({"loss": torch.tensor(1.5, device="cuda")}, step=1)
    assert rb.wait() == Reading(1, {"loss": 1.5}) and rb.latest().values == {"loss": 1.5}
    assert reading == Reading(0, {"loss": 0.5})


@gpu
def test_deferred_readback_costs_no_sync_and_reads_the_right_steps():
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


@gpu
def test_on_cuda_an_invalid_report_is_made_and_pushed_without_a_sync_and_raises_when_it_arrives():
    """FusedMetrics on CUDA: an update with invalid labels, compute, push and reset under a strict guard (no read),
    then the error where the copy arrives, from wait() and from latest(), with the count and the step; the values
    themselves are NaN, and a clean report afterwards reads normally, its count 0."""
    import math

    from mentor.suite import FusedMetrics

    def cuda(*values):
        return torch.tensor(values, device="cuda")

    good = (torch.tensor(0.5, device="cuda"), cuda(0, 1, 2), cuda(0, 1, 1))
    bad = (torch.tensor(0.5, device="cuda"), cuda(0, 12, 2), cuda(0, 1, -3))  # pred 12, target -3: 2 invalid
    suite, rb = FusedMetrics(10).cuda(), DeferredReadback()
    for step in range(rb.slots):  # warm: the kernel's launcher, every slot's pinned buffer
        suite.update(*good)
        rb.push(suite.compute(), step=step)
        suite.reset()
    assert rb.wait().values["invalid_labels"] == 0.0
    with sync_guard(strict=True):
        suite.update(*bad)
        values = suite.compute()
        rb.push(values, step=10)
        suite.reset()
    with pytest.raises(InvalidLabelsError) as caught:
        rb.wait()
    assert (caught.value.count, caught.value.step, caught.value.counts) == (2, 10, {"invalid_labels": 2})
    with pytest.raises(InvalidLabelsError) as caught:
        rb.latest()
    assert caught.value.step == 10
    host = {key: value.item() for key, value in values.items()}
    assert host["invalid_labels"] == 2 and len(host) == 14
    assert [key for key, value in host.items() if not math.isnan(value)] == ["invalid_labels"]

    with sync_guard(strict=True):  # latest() alone: it raises at the first call after the copy arrived
        suite.update(*bad)
        suite.update(*bad)
        rb.push(suite.compute(), step=11)
        suite.reset()
    torch.cuda.synchronize()
    with pytest.raises(InvalidLabelsError) as caught:
        rb.latest()
    assert (caught.value.count, caught.value.step) == (4, 11)

    suite.update(*good)
    rb.push(suite.compute(), step=12)
    reading = rb.wait()
    assert reading.step == 12 and reading.values["invalid_labels"] == 0.0 and reading.values["accuracy_micro"] == (
        float(torch.tensor(2 / 3, dtype=torch.float32)))
