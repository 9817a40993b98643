"""Marks and helpers for tests that need a CUDA device: ``@gpu``, and ``warm`` for a metric's first update.

A ``@gpu`` test carries the ``gpu`` marker (``pytest -m gpu`` on the GPU machine selects it) and is skipped,
saying why, where torch sees no CUDA device (CI, the 2-core machine)."""

import pytest
import torch

NO_CUDA = not torch.cuda.is_available()


def gpu(test):
    """Mark ``test`` as needing CUDA: selected by ``-m gpu``, skipped without a CUDA device."""
    return pytest.mark.gpu(pytest.mark.skipif(NO_CUDA, reason="needs a CUDA device")(test))


def warm(metric, *args, **kwargs):
    """Update ``metric`` once and wait for the GPU: the first update allocates and moves state; count from the second."""
    metric.update(*args, **kwargs)
    torch.cuda.synchronize()
    return metric
