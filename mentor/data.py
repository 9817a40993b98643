"""Synthetic data: the article's random-image dataset, its DataLoader, and batches that live on the GPU."""

from __future__ import annotations

from collections.abc import Iterator

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
