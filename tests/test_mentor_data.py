"""CPU tests of mentor.data: FakeDataset, make_loader and device_batches."""

import itertools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from mentor.data import FakeDataset, device_batches, make_loader

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

from mentor.data import DevicePrefetcher, copy_ms, host_batches, loader_ms_per_batch  # noqa: E402


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
    from mentor import data

    monkeypatch.setattr(data.torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError) as raised:
        copy_ms(2, 4)
    assert str(raised.value) == ("copy_ms times a host-to-device copy and torch sees no CUDA device; "
                                 "run it on a GPU.")


def test_copy_ms_copies_a_224_pixel_batch_22_times_and_takes_the_median_of_the_last_20(monkeypatch):
    """A fake torch (in mentor.data only) stands in for CUDA: its events report hand-made times.

    The first two copies are warm-up (times 500 and 400, dropped); the 20 timed ones take 1.0 ... 20.0 ms,
    so the median is 10.5; a 21st timed copy or a dropped warm-up time would change it.
    """
    from types import SimpleNamespace

    from mentor import data

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

        def record(self):
            pass

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return next(times)

    def empty_like(host, device):
        log.append(("empty_like", host.shape, device))
        return Dev()

    fake = SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: True, Event=Event),
                           randn=lambda *shape: Host(shape), empty_like=empty_like)
    monkeypatch.setattr(data, "torch", fake)
    assert copy_ms(8) == 10.5
    shape = (8, 3, 224, 224)
    assert log == [("pin", shape), ("empty_like", shape, "cuda")] + [("copy", shape, True)] * 22
