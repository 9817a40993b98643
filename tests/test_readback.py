"""mentor.readback: DeferredReadback's logic on CPU, with fake events standing in for CUDA's.

The fakes replace the three CUDA-only pieces (whether a device defers, the pinned buffer, the event),
so that the ring of buffers, the order of readings and the rule "never read before the event" are
checked here with exact values. The real GPU path (0 syncs, correct values) is the ``@gpu`` test at the end
(run with `pytest -m gpu`).
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


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> FakeGPU:
    """Make CPU tensors take the CUDA path: pushes defer, and buffers and events are fakes."""
    fake = FakeGPU()
    monkeypatch.setattr(readback, "_defers", lambda device: True)
    monkeypatch.setattr(readback, "_pinned_buffer", fake.buffer)
    monkeypatch.setattr(readback, "_record_event", lambda: FakeEvent(fake.events))
    return fake


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
    fake = FakeGPU()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(readback, "_defers", lambda device: True)
        mp.setattr(readback, "_pinned_buffer", fake.buffer)
        mp.setattr(readback, "_record_event", lambda: FakeEvent(fake.events))
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
