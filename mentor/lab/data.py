"""Synthetic data: the article's random-image dataset, its DataLoader, and batches that live on the GPU."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch.utils.data import DataLoader, Dataset


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}.")
    return value


class FakeDataset(Dataset):
    """Random images with labels ``index % num_classes``, made on the fly by the loader's workers.

    Example:
        >>> image, label = FakeDataset(image_size=8, num_classes=10)[13]
        >>> tuple(image.shape), int(label)
        ((3, 8, 8), 3)
    """

    def __init__(self, length: int = 100_000_000, image_size: int = 224, num_classes: int = 1000) -> None:
        self.length = _positive_int("length", length)
        self.image_size = _positive_int("image_size", image_size)
        self.num_classes = _positive_int("num_classes", num_classes)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} is outside 0..{self.length - 1}.")
        image = torch.randn(3, self.image_size, self.image_size)
        return image, torch.tensor(index % self.num_classes, dtype=torch.long)


def make_loader(
    dataset: Dataset, batch_size: int = 128, num_workers: int = 12, pin_memory: bool = True
) -> DataLoader:
    """A DataLoader over ``dataset`` with worker processes and pinned host memory, as in the article.

    On the H200 machine the 12 workers cannot draw random images as fast as the GPU trains on
    them, so the loader itself slows the step (chapter 1 of the book measures by how much).
    The book's measurements use :func:`device_batches` instead; this loader is here for loops
    that need a real pipeline.

    Example:
        >>> loader = make_loader(FakeDataset(image_size=8), batch_size=4, num_workers=0, pin_memory=False)
        >>> tuple(next(iter(loader))[0].shape)
        (4, 3, 8, 8)
    """
    if not isinstance(dataset, Dataset):
        raise TypeError(f"dataset must be a torch Dataset such as FakeDataset(), not {type(dataset).__name__}.")
    _positive_int("batch_size", batch_size)
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers must be an int >= 0, got {num_workers!r}.")
    pin = bool(pin_memory) and torch.cuda.is_available()
    return DataLoader(
        dataset, batch_size=batch_size, num_workers=num_workers, pin_memory=pin,
        persistent_workers=num_workers > 0,
    )


def device_batches(
    batch_size: int,
    image_size: int = 224,
    num_classes: int = 1000,
    device: torch.device | str = "cpu",
    distinct: int = 4,
    seed: int = 0,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """An endless stream of random ``(images, labels)`` batches made once, on ``device``.

    Cycling over a few batches already on the GPU takes the input pipeline out of the
    measurement: what remains is the training step and the metric code.

    Example:
        >>> images, labels = next(device_batches(4, image_size=8, num_classes=10))
        >>> tuple(images.shape), labels.dtype
        ((4, 3, 8, 8), torch.int64)
    """
    _positive_int("batch_size", batch_size)
    _positive_int("image_size", image_size)
    _positive_int("num_classes", num_classes)
    _positive_int("distinct", distinct)
    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    batches = [
        (
            torch.randn(batch_size, 3, image_size, image_size, generator=gen).to(device),
            torch.randint(0, num_classes, (batch_size,), generator=gen).to(device),
        )
        for _ in range(distinct)
    ]
    return _cycle(batches)


def _cycle(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    while True:
        yield from batches


def host_batches(
    batch_size: int,
    image_size: int = 224,
    num_classes: int = 1000,
    distinct: int = 4,
    pin_memory: bool = True,
    seed: int = 0,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """An endless stream of random batches made once in host memory (pinned when CUDA is available).

    The training loop copies each batch to the GPU, as it would a DataLoader's, but no worker
    draws anything: comparing this stream with :func:`device_batches` measures the host-to-device
    copy alone, and comparing it with a DataLoader measures the workers alone.

    Example:
        >>> images, labels = next(host_batches(4, image_size=8, num_classes=10))
        >>> images.device.type, tuple(images.shape)
        ('cpu', (4, 3, 8, 8))
    """
    for name, value in (("batch_size", batch_size), ("image_size", image_size), ("num_classes", num_classes),
                        ("distinct", distinct)):
        _positive_int(name, value)
    gen = torch.Generator().manual_seed(seed)
    pin = bool(pin_memory) and torch.cuda.is_available()
    batches = []
    for _ in range(distinct):
        images = torch.randn(batch_size, 3, image_size, image_size, generator=gen)
        labels = torch.randint(0, num_classes, (batch_size,), generator=gen)
        batches.append((images.pin_memory(), labels.pin_memory()) if pin else (images, labels))
    return _cycle(batches)


class DevicePrefetcher:
    """Iterate over host batches with each one already on ``device``, copied on a side stream one step ahead.

    While the GPU runs step *n*, the copy of batch *n + 1* runs on its own CUDA stream, so it
    overlaps the compute instead of queueing in front of it. Before a batch is handed out, the
    compute stream waits for its copy (``wait_stream``), and the tensors are marked as used by
    the compute stream (``record_stream``) so that the caching allocator does not reuse their
    memory too early. The copies overlap only when the host memory is pinned (a DataLoader with
    ``pin_memory=True``, or :func:`host_batches`). On the CPU it hands the batches through.

    Example:
        >>> batches = DevicePrefetcher(host_batches(2, image_size=8, num_classes=10), "cpu")
        >>> images, labels = next(iter(batches))
        >>> images.device.type
        'cpu'
    """

    def __init__(self, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], device: torch.device | str) -> None:
        if not hasattr(batches, "__iter__"):
            raise TypeError(f"batches must be an iterable of (images, labels), such as a DataLoader, "
                            f"not {type(batches).__name__}.")
        self.batches = batches
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("DevicePrefetcher was given a CUDA device but torch sees none; pass 'cpu'.")

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        source = iter(self.batches)
        if self.device.type != "cuda":
            yield from ((x.to(self.device), y.to(self.device)) for x, y in source)
            return
        stream = torch.cuda.Stream(self.device)

        def copy() -> tuple[torch.Tensor, torch.Tensor] | None:
            try:
                x, y = next(source)
            except StopIteration:
                return None
            with torch.cuda.stream(stream):
                return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

        ahead = copy()
        while ahead is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(stream)
            for t in ahead:
                t.record_stream(current)
            batch, ahead = ahead, copy()
            yield batch


def loader_ms_per_batch(loader: Iterable, batches: int, skip: int = 0) -> float:
    """Mean host time (ms) per batch drawn from ``loader``, after drawing ``skip`` batches untimed.

    With ``skip`` at least the loader's prefetch buffer (``num_workers × prefetch_factor``), the
    buffer filled at start-up is used up, and what is timed is the workers' steady-state rate,
    with no training competing for the host. The mean, total time over ``batches``, is the
    rate; a median would not be: workers that finish together deliver their batches in bursts,
    so most batches arrive at once and a few after a long wait.

    Example:
        >>> loader = make_loader(FakeDataset(image_size=8), batch_size=4, num_workers=0, pin_memory=False)
        >>> loader_ms_per_batch(loader, batches=3) > 0
        True
    """
    import time

    _positive_int("batches", batches)
    if isinstance(skip, bool) or not isinstance(skip, int) or skip < 0:
        raise ValueError(f"skip must be an int >= 0, got {skip!r}.")
    it = iter(loader)
    for _ in range(skip):
        next(it)
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    return (time.perf_counter() - start) * 1000.0 / batches


def copy_ms(batch_size: int, image_size: int = 224, repeats: int = 20) -> float:
    """Median GPU time (ms) of copying one pinned batch of images to the GPU, timed with CUDA events.

    Example (needs CUDA):
        >>> copy_ms(128)                                         # doctest: +SKIP
        1.6
    """
    import statistics

    if not torch.cuda.is_available():
        raise RuntimeError("copy_ms times a host-to-device copy and torch sees no CUDA device; run it on a GPU.")
    _positive_int("repeats", repeats)
    host = torch.randn(batch_size, 3, image_size, image_size).pin_memory()
    dev = torch.empty_like(host, device="cuda")
    times = []
    for _ in range(repeats + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dev.copy_(host, non_blocking=True)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[2:])
