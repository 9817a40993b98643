"""mentor.lab.data: FakeDataset, make_loader, device_batches, host_batches, DevicePrefetcher, loader_ms_per_batch
and copy_ms (fakes stand in for CUDA); on CUDA (``@gpu``, run with `pytest -m gpu`): pinned host batches, the
prefetcher without a sync, copy_ms in the range of a real link."""

import itertools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from marks import gpu
from mentor.lab.data import (
    DevicePrefetcher,
    FakeDataset,
    copy_ms,
    device_batches,
    host_batches,
    loader_ms_per_batch,
    make_loader,
)
from mentor.syncs import sync_guard

# slow CPUs and the NumPy/Tensor strategies: judge the examples, not the time it takes to draw them
SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]


@settings(max_examples=50, deadline=None, suppress_health_check=SLOW_OK)
@given(length=st.integers(1, 10_000), num_classes=st.integers(1, 1000), data=st.data())
def test_fake_dataset_label_is_index_mod_classes(length, num_classes, data):
    ds = FakeDataset(length=length, image_size=2, num_classes=num_classes)
    index = data.draw(st.integers(0, length - 1))
    image, label = ds[index]
    assert label.dtype == torch.long and label.shape == ()
    assert int(label) == index % num_classes
    assert tuple(image.shape) == (3, 2, 2) and image.dtype == torch.float32


def test_fake_dataset_len_and_shape():
    ds = FakeDataset(length=7, image_size=5, num_classes=3)
    assert len(ds) == 7
    assert tuple(ds[6][0].shape) == (3, 5, 5)


@pytest.mark.parametrize("index", [-1, 7, 100])
def test_fake_dataset_index_out_of_range(index):
    ds = FakeDataset(length=7, image_size=2)
    with pytest.raises(IndexError, match=r"outside 0\.\.6"):
        ds[index]


@pytest.mark.parametrize("field", ["length", "image_size", "num_classes"])
@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "4", None])
def test_fake_dataset_rejects_bad_sizes(field, bad):
    with pytest.raises(ValueError, match=f"{field} must be a positive int, got {bad!r}"):
        FakeDataset(**{field: bad})


def test_make_loader_without_workers():
    loader = make_loader(FakeDataset(length=10, image_size=4, num_classes=3), batch_size=4, num_workers=0)
    assert isinstance(loader, DataLoader)
    assert loader.num_workers == 0
    assert loader.pin_memory is torch.cuda.is_available()  # pin only with CUDA
    batches = list(loader)
    # sequential sampling: labels of the first batch are indices 0..3 modulo 3 classes
    assert batches[0][1].tolist() == [0, 1, 2, 0]
    assert [tuple(b[0].shape) for b in batches] == [(4, 3, 4, 4), (4, 3, 4, 4), (2, 3, 4, 4)]


def test_make_loader_rejects_bad_input():
    ds = FakeDataset(length=4, image_size=2)
    with pytest.raises(TypeError, match=r"torch Dataset such as FakeDataset\(\), not list"):
        make_loader([1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        make_loader(ds, batch_size=0, num_workers=0)
    with pytest.raises(ValueError, match=r"num_workers must be an int >= 0, got -1"):
        make_loader(ds, num_workers=-1)
    with pytest.raises(ValueError, match=r"num_workers must be an int >= 0, got True"):
        make_loader(ds, num_workers=True)


def test_device_batches_shapes_and_labels():
    images, labels = next(device_batches(5, image_size=6, num_classes=3))
    assert tuple(images.shape) == (5, 3, 6, 6) and images.dtype == torch.float32
    assert tuple(labels.shape) == (5,) and labels.dtype == torch.long
    assert images.device.type == "cpu"
    assert 0 <= int(labels.min()) and int(labels.max()) < 3


@pytest.mark.parametrize("distinct", [1, 2, 5])
def test_device_batches_cycle_through_distinct(distinct):
    stream = device_batches(2, image_size=4, num_classes=10, distinct=distinct)
    first_round = list(itertools.islice(stream, distinct))
    second_round = list(itertools.islice(stream, distinct))
    for (a_img, a_lab), (b_img, b_lab) in zip(first_round, second_round):
        assert torch.equal(a_img, b_img) and torch.equal(a_lab, b_lab)
    # within one round the batches differ (random images from one generator)
    for (a, _), (b, _) in itertools.combinations(first_round, 2):
        assert not torch.equal(a, b)


def test_device_batches_deterministic_per_seed():
    def take(seed):
        return list(itertools.islice(device_batches(3, 4, 10, seed=seed), 3))

    for (a, la), (b, lb) in zip(take(0), take(0)):
        assert torch.equal(a, b) and torch.equal(la, lb)
    assert not torch.equal(take(0)[0][0], take(1)[0][0])


def test_device_batches_does_not_touch_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    next(device_batches(2, 4, 10))
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("field", ["batch_size", "image_size", "num_classes", "distinct"])
def test_device_batches_rejects_bad_sizes(field):
    kwargs = dict(batch_size=2, image_size=4, num_classes=10, distinct=2)
    kwargs[field] = 0
    with pytest.raises(ValueError, match=f"{field} must be a positive int, got 0"):
        device_batches(**kwargs)


# --- host batches, the side-stream prefetcher and the loader's steady-state rate ---


def test_host_batches_cycle_through_distinct_batches_in_host_memory():
    stream = host_batches(3, image_size=4, num_classes=10, distinct=2)
    first = [next(stream) for _ in range(2)]
    again = next(stream)
    assert torch.equal(again[0], first[0][0]) and torch.equal(again[1], first[0][1])
    assert not torch.equal(first[0][0], first[1][0])
    assert first[0][0].device.type == "cpu" and tuple(first[0][0].shape) == (3, 3, 4, 4)
    assert not first[0][0].is_pinned()  # no CUDA here: pinning needs it


def test_host_batches_equal_device_batches_for_the_same_seed():
    # one generator, drawn in the same order: the host stream is the device stream before the copy
    host, dev = host_batches(2, 4, 10, seed=5), device_batches(2, 4, 10, seed=5)
    for _ in range(4):
        (a, la), (b, lb) = next(host), next(dev)
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_prefetcher_on_cpu_passes_batches_through_in_order_and_ends():
    source = [(torch.full((1,), float(i)), torch.tensor([i])) for i in range(3)]
    out = list(DevicePrefetcher(source, "cpu"))
    assert [int(y) for _, y in out] == [0, 1, 2]
    assert [float(x) for x, _ in out] == [0.0, 1.0, 2.0]
    assert [int(y) for _, y in DevicePrefetcher(source, "cpu")] == [0, 1, 2]  # re-iterable, like a DataLoader


def test_prefetcher_rejects_bad_input():
    with pytest.raises(TypeError, match="batches must be an iterable"):
        DevicePrefetcher(3, "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="torch sees none"):
            DevicePrefetcher([], "cuda")


class ClockedLoader:
    """Each batch advances a fake clock by the next of ``costs_ms``."""

    def __init__(self, clock, costs_ms):
        self.clock, self.costs_ms = clock, costs_ms

    def __iter__(self):
        for cost in self.costs_ms:
            self.clock["now"] += cost / 1000.0
            yield cost


def test_loader_ms_per_batch_times_only_after_skip(monkeypatch):
    clock = {"now": 100.0}
    monkeypatch.setattr("time.perf_counter", lambda: clock["now"])
    loader = ClockedLoader(clock, [0.5, 0.5, 40.0, 10.0, 30.0])  # the buffer is fast, the workers are not
    assert loader_ms_per_batch(loader, batches=3, skip=2) == pytest.approx(80.0 / 3)
    # bursts: the mean is the rate, where a median (0.5 ms) would call these workers fast
    assert loader_ms_per_batch(ClockedLoader(clock, [0.5, 0.5, 41.0]), batches=3) == pytest.approx(14.0)


@pytest.mark.parametrize("kwargs, message", [
    (dict(batches=0), "batches must be a positive int, got 0"),
    (dict(batches=2, skip=-1), "skip must be an int >= 0, got -1"),
])
def test_loader_ms_per_batch_rejects_bad_counts(kwargs, message):
    with pytest.raises(ValueError, match=message):
        loader_ms_per_batch([], **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_copy_ms_needs_cuda():
    with pytest.raises(RuntimeError, match="torch sees no CUDA device"):
        copy_ms(2, 4)


def test_copy_ms_without_cuda_says_exactly_why(monkeypatch):
    from mentor.lab import data

    monkeypatch.setattr(data.torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError) as raised:
        copy_ms(2, 4)
    assert str(raised.value) == ("copy_ms times a host-to-device copy and torch sees no CUDA device; "
                                 "run it on a GPU.")


def test_copy_ms_copies_a_224_pixel_batch_22_times_and_takes_the_median_of_the_last_20(monkeypatch):
    """A fake torch (in mentor.lab.data only) stands in for CUDA: its events report hand-made times.

    The first two copies are warm-up (times 500 and 400, dropped); the 20 timed ones take 1.0 ... 20.0 ms,
    so the median is 10.5; a 21st timed copy or a dropped warm-up time would change it.
    """
    from types import SimpleNamespace

    from mentor.lab import data

    times = iter([500.0, 400.0] + [float(t) for t in range(1, 40)])
    log = []

    class Host:
        def __init__(self, shape):
            self.shape = shape

        def pin_memory(self):
            log.append(("pin", self.shape))
            return self

    class Dev:
        def copy_(self, src, non_blocking=False):
            log.append(("copy", src.shape, non_blocking))

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.recorded = False

        def record(self):
            log.append("record")
            self.recorded = True

        def synchronize(self):
            assert self.recorded

        def elapsed_time(self, end):
            # the time runs from this (start) event to the end event, both recorded around the copy
            assert isinstance(end, Event) and end is not self and self.recorded and end.recorded
            return next(times)

    def empty_like(host, device):
        log.append(("empty_like", host.shape, device))
        return Dev()

    fake = SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: True, Event=Event),
                           randn=lambda *shape: Host(shape), empty_like=empty_like)
    monkeypatch.setattr(data, "torch", fake)
    assert copy_ms(8) == 10.5
    shape = (8, 3, 224, 224)
    assert log == [("pin", shape), ("empty_like", shape, "cuda")] + ["record", ("copy", shape, True), "record"] * 22


# --- defaults, whole messages, pinning and the CUDA copy protocol (fakes stand in for CUDA) ---


def test_fake_dataset_defaults_are_the_articles_224_pixels_and_1000_classes() -> None:
    ds = FakeDataset()
    assert len(ds) == 100_000_000
    assert tuple(ds[0][0].shape) == (3, 224, 224)
    assert (int(ds[999][1]), int(ds[1000][1]), int(ds[2001][1])) == (999, 0, 1)  # labels are index % 1000


def test_fake_dataset_label_is_long_even_for_a_numpy_int32_index() -> None:
    """A sampler built with NumPy hands out np.int32 indices; the label is still a torch.long."""
    import numpy as np

    label = FakeDataset(length=7, image_size=2, num_classes=3)[np.int32(5)][1]
    assert label.dtype == torch.long and int(label) == 2


@pytest.mark.filterwarnings("ignore:This DataLoader will create 12 worker processes")
def test_make_loader_defaults_and_persistent_workers_only_with_workers() -> None:
    """Defaults: batch 128 and 12 workers kept alive between epochs; no workers means nothing to keep."""
    ds = FakeDataset(length=10, image_size=2)
    loader = make_loader(ds)  # no worker starts before the first iteration
    assert (loader.batch_size, loader.num_workers, loader.persistent_workers) == (128, 12, True)
    one = make_loader(ds, batch_size=4, num_workers=1)
    assert (one.batch_size, one.num_workers, one.persistent_workers) == (4, 1, True)
    assert make_loader(ds, batch_size=4, num_workers=0).persistent_workers is False


def test_make_loader_pins_by_default_when_cuda_is_there(monkeypatch: pytest.MonkeyPatch) -> None:
    ds = FakeDataset(length=10, image_size=2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert make_loader(ds, num_workers=0).pin_memory is True
    assert make_loader(ds, num_workers=0, pin_memory=False).pin_memory is False
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert make_loader(ds, num_workers=0, pin_memory=True).pin_memory is False


def test_device_batches_land_on_the_given_device() -> None:
    # the meta device exists without any hardware: the batches must be moved there, not left on the CPU
    images, labels = next(device_batches(2, image_size=4, num_classes=10, device="meta"))
    assert (images.device.type, labels.device.type) == ("meta", "meta")
    assert tuple(images.shape) == (2, 3, 4, 4) and tuple(labels.shape) == (2,)


def test_host_batches_defaults_are_224_pixels_1000_classes_4_batches_and_seed_0() -> None:
    """The stream equals a generator seeded with 0 drawing images then labels in [0, 1000), 4 times, then repeats."""
    gen = torch.Generator().manual_seed(0)
    expected = [(torch.randn(8, 3, 224, 224, generator=gen), torch.randint(0, 1000, (8,), generator=gen))
                for _ in range(4)]
    stream = host_batches(8)
    for images, labels in expected + expected[:1]:
        got_images, got_labels = next(stream)
        assert torch.equal(got_images, images) and torch.equal(got_labels, labels)


def test_host_batches_pin_by_default_when_cuda_is_there(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a GPU, pinning is faked: the stream must hand out the tensors pin_memory() returned."""
    pinned = []

    def fake_pin(self: torch.Tensor) -> torch.Tensor:
        out = self.clone()
        pinned.append(out)
        return out

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    stream = host_batches(2, image_size=4, num_classes=10, distinct=3)
    assert len(pinned) == 6  # images and labels of each of the 3 batches
    for i in range(3):
        images, labels = next(stream)
        assert images is pinned[2 * i] and labels is pinned[2 * i + 1]
    pinned.clear()
    host_batches(2, image_size=4, num_classes=10, distinct=3, pin_memory=False)
    assert pinned == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    host_batches(2, image_size=4, num_classes=10, distinct=3, pin_memory=True)
    assert pinned == []


@pytest.mark.parametrize("field", ["batch_size", "image_size", "num_classes", "distinct"])
def test_host_batches_reject_bad_sizes_with_the_whole_message(field: str) -> None:
    kwargs = dict(batch_size=2, image_size=4, num_classes=10, distinct=2)
    kwargs[field] = 0
    with pytest.raises(ValueError) as raised:
        host_batches(**kwargs)
    assert str(raised.value) == f"{field} must be a positive int, got 0."


def test_prefetcher_whole_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TypeError) as raised:
        DevicePrefetcher(3, "cpu")  # type: ignore[arg-type]
    assert str(raised.value) == "batches must be an iterable of (images, labels), such as a DataLoader, not int."
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError) as raised:
        DevicePrefetcher([], "cuda")
    assert str(raised.value) == "DevicePrefetcher was given a CUDA device but torch sees none; pass 'cpu'."


def test_prefetcher_moves_images_and_labels_to_a_non_cuda_device() -> None:
    source = [(torch.zeros(2, 3), torch.tensor([1, 0]))]
    (images, labels), = list(DevicePrefetcher(source, "meta"))
    assert (images.device.type, labels.device.type) == ("meta", "meta")
    assert tuple(images.shape) == (2, 3) and labels.dtype == torch.long


def test_prefetcher_on_cuda_copies_one_batch_ahead_on_a_side_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake streams and host 'tensors' log what the prefetcher asks of CUDA, in order.

    Batch 0 is copied (non-blocking, on the side stream) before the loop; each batch is handed out only after
    the compute stream waits for the side stream, its tensors are recorded on the compute stream, and the copy
    of the next batch is issued.
    """
    import contextlib

    log: list = []

    class Stream:
        def __init__(self, name: str) -> None:
            self.name = name

        def wait_stream(self, other: "Stream") -> None:
            log.append(("wait", self.name, other.name))

    class HostTensor:
        def __init__(self, name: str) -> None:
            self.name = name

        def to(self, device: torch.device, non_blocking: bool = False) -> "HostTensor":
            log.append(("copy", self.name, str(device), non_blocking))
            return HostTensor(self.name + "@gpu")

        def record_stream(self, stream: Stream) -> None:
            log.append(("record", self.name, stream.name))

    @contextlib.contextmanager
    def on(stream: Stream):
        log.append(("enter", stream.name))
        yield
        log.append(("exit", stream.name))

    def side_stream(device: torch.device) -> Stream:
        log.append(("new stream", str(device)))
        return Stream("side")

    def current_stream(device: torch.device) -> Stream:
        log.append(("current", str(device)))
        return Stream("compute")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "Stream", side_stream)
    monkeypatch.setattr(torch.cuda, "stream", on)
    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    source = [(HostTensor("x0"), HostTensor("y0")), (HostTensor("x1"), HostTensor("y1"))]
    it = iter(DevicePrefetcher(source, "cuda:1"))
    x, y = next(it)
    assert (x.name, y.name) == ("x0@gpu", "y0@gpu")

    def copy(i: int) -> list:
        return [("enter", "side"), ("copy", f"x{i}", "cuda:1", True), ("copy", f"y{i}", "cuda:1", True),
                ("exit", "side")]

    def hand_out(i: int) -> list:
        return [("current", "cuda:1"), ("wait", "compute", "side"), ("record", f"x{i}@gpu", "compute"),
                ("record", f"y{i}@gpu", "compute")]

    assert log == [("new stream", "cuda:1")] + copy(0) + hand_out(0) + copy(1)
    log.clear()
    x, y = next(it)
    assert (x.name, y.name) == ("x1@gpu", "y1@gpu")
    assert log == hand_out(1)
    assert list(it) == []


def test_loader_ms_per_batch_rejects_a_bool_skip_with_the_whole_message() -> None:
    with pytest.raises(ValueError) as raised:
        loader_ms_per_batch([], batches=2, skip=True)
    assert str(raised.value) == "skip must be an int >= 0, got True."


def test_copy_ms_checks_repeats_with_the_whole_message(monkeypatch: pytest.MonkeyPatch) -> None:
    from mentor.lab import data

    monkeypatch.setattr(data.torch.cuda, "is_available", lambda: True)  # the check comes before any CUDA call
    with pytest.raises(ValueError) as raised:
        copy_ms(2, 4, repeats=0)
    assert str(raised.value) == "repeats must be a positive int, got 0."


# --- on CUDA ---


@gpu
def test_host_batches_are_pinned():
    images, labels = next(host_batches(2, image_size=8, num_classes=10))
    assert images.is_pinned() and labels.is_pinned()


@gpu
def test_prefetcher_delivers_the_same_batches_on_the_gpu_without_a_sync():
    expected = list(itertools.islice(host_batches(4, 8, 10, distinct=3), 6))
    prefetched = iter(DevicePrefetcher(host_batches(4, 8, 10, distinct=3), "cuda"))
    next(prefetched)  # the first batch creates the side stream
    with sync_guard() as report:
        got = [next(prefetched) for _ in range(5)]
        sums = [x.sum() * 1 for x, _ in got]  # use them on the compute stream
    assert report.count == 0, report.table()
    for (x, y), (ex, ey), s in zip(got, expected[1:], sums):
        assert x.device.type == "cuda" and torch.equal(x.cpu(), ex) and torch.equal(y.cpu(), ey)
        assert float(s) == pytest.approx(float(ex.sum()), rel=1e-5)


@gpu
def test_copy_ms_is_in_the_range_of_a_pcie_or_c2c_link():
    # 128 x 3 x 224 x 224 float32 = 77 MB; any host link of 10 to 1000 GB/s lands in this range
    assert 0.077 < copy_ms(128, 224, repeats=5) < 7.7
