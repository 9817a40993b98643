"""Marks shared by the test files: ``@gpu`` for a test that needs a CUDA device.

A ``@gpu`` test carries the ``gpu`` marker (``pytest -m gpu`` on the GPU machine selects it) and is skipped,
saying why, where torch sees no CUDA device (CI, the 2-core machine)."""

import pytest
import torch

NO_CUDA = not torch.cuda.is_available()


def gpu(test):
    """Mark ``test`` as needing CUDA: selected by ``-m gpu``, skipped without a CUDA device."""
    return pytest.mark.gpu(pytest.mark.skipif(NO_CUDA, reason="needs a CUDA device")(test))
