"""Run by tests/test_fused_kernel.py in a subprocess with TRITON_INTERPRET=1 (set before Triton is imported).

Triton's interpreter runs the update kernel on CPU tensors with numpy, so the kernel's arithmetic is checked
here, without a GPU, against :meth:`FusedMetrics._plain_update` on the same data: every count equal, the loss
sum and count equal. Exits 0 when every example agrees; hypothesis prints the failing example otherwise.
"""

import os
import sys

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("run with TRITON_INTERPRET=1 (tests/test_fused_kernel.py does)")

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mentor import _fused_kernel as kernel
from mentor.suite import FusedMetrics

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, None]  # None: class indices


def states(suite):
    return (suite.tp, suite.fp, suite.fn, suite.loss_sum, suite.loss_count, suite.invalid_labels)


@st.composite
def batches(draw):
    classes = draw(st.sampled_from([2, 3, 17, 1000, 2049, 4100]))
    n = draw(st.integers(0, 40))
    dtype = draw(st.sampled_from(DTYPES))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    if dtype is None:
        preds = torch.randint(-2, classes + 2, (n,), generator=gen)
    else:
        wide = draw(st.booleans())  # a transposed view: logits with column stride != 1
        raw = torch.randint(-3, 4, (classes, n) if wide else (n, classes), generator=gen).to(dtype)
        preds = raw.t() if wide else raw
        for _ in range(draw(st.integers(0, 4))):  # ties are common above (small integers); add NaN and -inf
            if n:
                row, col = draw(st.integers(0, n - 1)), draw(st.integers(0, classes - 1))
                preds[row, col] = draw(st.sampled_from([float("nan"), float("-inf"), float("inf")]))
        if n and draw(st.booleans()):  # two NaNs in one row, in different column tiles when there are several
            row, first = draw(st.integers(0, n - 1)), draw(st.integers(0, classes - 2))
            preds[row, first] = preds[row, draw(st.integers(first + 1, classes - 1))] = float("nan")
    target = torch.randint(-2, classes + 2, (n,), generator=gen)
    ignore = draw(st.sampled_from([None, -100, 0, -1]))
    if ignore is not None and n:
        target[:: draw(st.integers(1, 5))] = ignore
    loss = torch.tensor(draw(st.floats(-10, 10, width=32)), dtype=draw(st.sampled_from([torch.float32, torch.bfloat16])))
    return classes, ignore, loss, preds, target


@settings(max_examples=int(os.environ.get("EXAMPLES", "60")), deadline=None, derandomize=True)
@given(batches(), st.integers(1, 3))
def check(batch, updates):
    classes, ignore, loss, preds, target = batch
    fused, plain = FusedMetrics(classes, ignore_index=ignore), FusedMetrics(classes, ignore_index=ignore)
    ints, constants, grid = kernel._arguments(preds, target, classes, ignore)
    for _ in range(updates):
        kernel._update_kernel[(grid,)](preds, target, loss, *states(fused), *ints, **constants)
        plain._plain_update(loss, preds, target)
    for name, got, want in zip(("tp", "fp", "fn", "loss_sum", "loss_count", "invalid_labels"),
                               states(fused), states(plain)):
        assert got.dtype == want.dtype and torch.equal(got, want), (name, got, want)


if __name__ == "__main__":
    check()
    print("ok")
