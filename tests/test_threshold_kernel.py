"""mentor._threshold_kernel: the thresholded update as one Triton kernel, and the threshold torch compares with.

On the CPU: the kernel run by Triton's interpreter equals the plain update (:func:`mentor._thresholded.plain_counts`)
on random inputs of every dtype and layout (hypothesis, in a subprocess: this file run as a script with
``TRITON_INTERPRET=1``); the threshold the kernel compares with equals torch's ``x > threshold`` for every float16
and bfloat16 value; the layout helpers. On CUDA (``@gpu``): the kernel's decision for every float16 and bfloat16
value, and for float32 and float64 values around the threshold, equals torch's sigmoid and comparison on the GPU.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import background
from marks import gpu
from mentor import _threshold_kernel as kernel
from mentor._thresholded import plain_counts

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32, torch.float64: torch.int64}
STATES = kernel.STATES


def every_value(dtype: torch.dtype) -> torch.Tensor:
    """Every bit pattern of a 16-bit float dtype (NaNs and infinities included), as a tensor of it."""
    return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)


def neighbours(value: float, dtype: torch.dtype, steps: int = 2) -> list[float]:
    """``value`` in ``dtype`` and the finite values up to ``steps`` representable numbers either side of it."""
    bits = torch.tensor([value], dtype=dtype).view(BITS[dtype])
    out = []
    for k in range(-steps, steps + 1):
        near = (bits + k).view(dtype)
        if torch.isfinite(near).all() and (value != 0 or k == 0):
            out.append(float(near))
    return out


def ties(threshold: float, dtype: torch.dtype, inputs: str) -> list[float]:
    """Predictions at the threshold and around it: the threshold in ``dtype`` (probabilities) or its logit (logits)."""
    compared = kernel.compared_threshold(threshold, dtype)
    if inputs == "probs":
        return neighbours(compared, dtype) + [0.0, 1.0]
    logit = float(torch.logit(torch.tensor(compared, dtype=torch.float64)))
    return neighbours(logit, dtype) + [0.0]


def relaid(tensor: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values in another memory layout: ``"strided"`` (every other row of a buffer, from an offset of one
    row), ``"transposed"`` (the last two dimensions stored transposed) or ``"contiguous"`` (as it is)."""
    if layout == "strided":
        buffer = torch.zeros((2 * tensor.shape[0] + 1, *tensor.shape[1:]), dtype=tensor.dtype)
        buffer[1::2] = tensor
        return buffer[1::2]
    if layout == "transposed" and tensor.ndim >= 2:
        return tensor.transpose(-1, -2).contiguous().transpose(-1, -2)
    return tensor


# What the kernel compares with.

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("threshold", [0.5, 0.3, 0.1, 0.7, 0.999, 1e-3, 0.300048828125, 0.30029296875, 1 / 3])
def test_the_compared_threshold_is_torchs_for_every_16_bit_value(dtype, threshold):
    values = every_value(dtype)
    compared = kernel.compared_threshold(threshold, dtype)
    assert torch.equal(values > threshold, values.double() > compared)
    assert compared == float(torch.tensor(compared, dtype=dtype))  # a value of the dtype


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.floats(1e-6, 1 - 1e-6), st.sampled_from([torch.float32, torch.float64]))
def test_the_compared_threshold_is_torchs_around_it(threshold, dtype):
    compared = kernel.compared_threshold(threshold, dtype)
    around = torch.tensor(neighbours(compared, dtype, 3) + neighbours(threshold, dtype, 3), dtype=dtype)
    assert torch.equal(around > threshold, around.double() > compared)


# The layout helpers.

def test_tiles_depend_on_the_columns_only():
    assert [kernel.tiles(c) for c in (1, 2, 3, 10, 1000, 1024, 1025, 100_000)] == [
        (1024, 1), (1024, 2), (1024, 4), (256, 16), (4, 1024), (4, 1024), (4, 1024), (4, 1024)]


def test_matrix_reads_strides_and_refuses_what_one_stride_cannot_walk():
    x = torch.zeros(4, 3, 5)
    assert kernel.matrix(x, x) == (4, 15, 15, 1, 15, 1)
    assert kernel.matrix(x[:, 1:2, :], torch.zeros(4, 1, 5)) == (4, 5, 15, 1, 5, 1)  # a size-1 dimension: no stride
    assert kernel.matrix(x[:, :, 2:3], x[:, 1:2, 2:3]) == (4, 3, 15, 5, 15, 0)
    assert kernel.matrix(x[::2], x[1::2]) == (2, 15, 30, 1, 30, 1)
    assert kernel.matrix(x.transpose(1, 2), x.transpose(1, 2)) is None  # (4, 5, 3) with strides (15, 1, 5)
    assert kernel.matrix(x[:, :, ::2], x[:, :, ::2]) is None  # (3, 3) walked by strides 5 and 2
    assert kernel.matrix(torch.zeros(0, 3), torch.zeros(0, 3)) == (0, 3, 3, 1, 3, 1)
    assert kernel.matrix(torch.zeros(3, 0), torch.zeros(3, 0)) == (3, 0, 1, 0, 1, 0)  # no columns to read
    column = torch.zeros(3, 7)[:, 2]
    assert kernel.matrix(column, torch.zeros(3, dtype=torch.long)) == (3, 1, 7, 0, 1, 0)


def test_the_arguments_follow_the_layout_and_the_dtype():
    ints, constants, grid = kernel.arguments(torch.zeros(5, 3000).t(), torch.zeros(3000, 5, dtype=torch.int32),
                                             threshold=0.25, ignore_index=None, inputs="probs", per_label=True)
    assert ints == (3000, 5, 1, 3000, 5, 1, 0) and grid == 6  # 512 rows a program
    assert constants == {"INPUTS": 1, "THRESHOLD": 0.25, "WIDE": False, "LIBDEVICE": kernel.uses_libdevice(),
                         "HAS_IGNORE": False, "PER_LABEL": True, "ROWS": 512, "COLS": 8}
    _, constants, grid = kernel.arguments(torch.zeros(0, dtype=torch.bool), torch.zeros(0, dtype=torch.long),
                                          threshold=0.25, ignore_index=-1, inputs="logits", per_label=False)
    assert (constants["INPUTS"], constants["HAS_IGNORE"], constants["THRESHOLD"], grid) == (2, True, 0.5, 1)
    assert kernel.arguments(torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.long), threshold=0.25,
                            ignore_index=None, inputs="logits", per_label=False)[1]["WIDE"] is True


def test_a_binary_pair_that_one_stride_walks_is_read_as_one_column_of_every_element():
    """(8, 512, 512) masks as 8 rows of 262144 columns would be 2 programs of 4 rows each; as one column, 2048."""
    masks = torch.zeros(8, 512, 512)
    ints, constants, grid = kernel.arguments(masks, torch.zeros(8, 512, 512, dtype=torch.uint8), threshold=0.5,
                                             ignore_index=None, inputs="logits", per_label=False)
    assert ints[:6] == (8 * 512 * 512, 1, 1, 0, 1, 0)
    assert (constants["ROWS"], constants["COLS"], grid) == (1024, 1, 2048)
    # per label, the columns are the labels: kept
    assert kernel.arguments(masks[:, 0], torch.zeros(8, 512, dtype=torch.long), threshold=0.5, ignore_index=None,
                            inputs="logits", per_label=True)[0][:6] == (8, 512, 512 * 512, 1, 512, 1)
    # every other sample: no single stride walks it, the rows are the samples
    every_other = torch.zeros(16, 4, 3)[::2]
    assert kernel.arguments(every_other, every_other.long(), threshold=0.5, ignore_index=None, inputs="probs",
                            per_label=False)[0][:6] == (8, 12, 24, 1, 12, 1)  # the target a contiguous copy
    assert kernel.flat(every_other, every_other.long()) is None


@pytest.mark.skipif(not kernel.AVAILABLE, reason="Triton is not installed")
def test_the_launcher_is_a_direct_launcher_with_this_kernels_arguments():
    from mentor import _direct_launch

    run = kernel.ThresholdLauncher(torch.zeros(40, 3), torch.zeros(40, 3, dtype=torch.long), threshold=0.75,
                                   ignore_index=-100, inputs="probs", per_label=True)
    assert isinstance(run, _direct_launch.DirectLauncher)
    # what DirectLauncher.__call__ and _through_triton read: the grid, the integers and constexprs in the kernel's order
    assert run.grid == 1 and run._ints == (40, 3, 3, 1, 3, 1, -100)
    assert run._tail == (*run._ints, 1, 0.75, False, kernel.uses_libdevice(), True, True, 1024, 4)
    assert list(kernel._threshold_kernel.arg_names) == ["preds", "target", "loss", *STATES, *kernel._PARAMETERS]
    assert (run._compiled, run.direct, run.bound, run._index) == (None, 0, 0, None)


# The kernel under Triton's interpreter, against the plain update (run in a subprocess: see the end of this file).

@st.composite
def kernel_cases(draw):
    """Inputs of every kind: dtype, layout, threshold, ignore_index, invalid targets and label predictions."""
    per_label = draw(st.booleans())
    n = draw(st.integers(0, 40))
    shape = (n, draw(st.integers(1, 9))) if per_label else draw(st.sampled_from([(n,), (n, 3), (n, 2, 3)]))
    dtype = draw(st.sampled_from(FLOATS + [torch.int64, torch.int32, torch.bool, torch.uint8]))
    inputs = draw(st.sampled_from(["logits", "probs"]))
    threshold = draw(st.sampled_from([0.5, 0.3, 0.75]) | st.floats(0.01, 0.99))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    count = 1
    for size in shape:
        count *= size
    if dtype.is_floating_point:
        raw = torch.randn(count, generator=gen, dtype=torch.float64) * 4 if inputs == "logits" else torch.rand(
            count, generator=gen, dtype=torch.float64)
        preds = raw.to(dtype)
        # ties, in every other example: a quarter of the values exactly at the threshold (probabilities), or 0 with a
        # threshold of 0.5 (logits, whose sigmoid is then exactly 0.5 in every dtype); values a step either side of
        # the threshold; NaN and infinities. Logits a step either side of the threshold's logit are left to the GPU
        # test: there Triton's exp is CUDA's, as torch's is, where the interpreter's (numpy's) and torch's CPU one
        # may round differently.
        if inputs == "logits" and draw(st.booleans()):
            threshold = 0.5
        tie = kernel.compared_threshold(threshold, dtype) if inputs == "probs" else 0.0
        if draw(st.booleans()):
            preds[torch.rand(count, generator=gen) < 0.25] = tie
        specials = neighbours(tie, dtype) if inputs == "probs" else [0.0]
        specials += [float("nan"), float("inf"), float("-inf")]
        for _ in range(draw(st.integers(0, 5)) if count else 0):
            preds[draw(st.integers(0, count - 1))] = draw(st.sampled_from(specials))
    else:
        preds = torch.randint(-1, 3, (count,), generator=gen).to(dtype)
    # targets 0 or 1, and about one in eight -1 or 2 (invalid unless ignored)
    target = torch.randint(0, 2, (count,), generator=gen)
    odd = torch.rand(count, generator=gen) < 0.125
    target[odd] = torch.randint(0, 2, (count,), generator=gen)[odd] * 3 - 1
    target = target.to(draw(st.sampled_from([torch.int64, torch.int32, torch.int8])))
    ignore = draw(st.sampled_from([None, -1, 0, 2]))
    # the kernel reads any layout of one stride per dimension pair; a 3-dim transpose is the metrics' to copy
    layout = draw(st.sampled_from(["contiguous", "strided"] + (["transposed"] if len(shape) == 2 else [])))
    preds, target = relaid(preds.view(shape), layout), relaid(target.view(shape), layout)
    loss_dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    loss = torch.tensor(draw(st.floats(-10, 10, width=32)), dtype=loss_dtype)
    return per_label, inputs, threshold, ignore, loss, preds, target


def _zeros(per_label: bool, width: int) -> list[torch.Tensor]:
    counts = [torch.zeros(width if per_label else (), dtype=torch.long) for _ in range(4)]
    return counts + [torch.zeros(()), torch.zeros((), dtype=torch.long), torch.zeros((), dtype=torch.long)]


@settings(max_examples=int(os.environ.get("EXAMPLES", "60")), deadline=None, derandomize=True)
@given(kernel_cases(), st.integers(1, 2))
def _interpreted_equals_plain(case, updates):
    per_label, inputs, threshold, ignore, loss, preds, target = case
    width = preds.shape[1] if per_label else 1
    states = _zeros(per_label, width)
    compared = kernel.compared_threshold(threshold, preds.dtype) if preds.is_floating_point() else 0.5
    ints, constants, grid = kernel.arguments(preds, target, threshold=compared, ignore_index=ignore, inputs=inputs,
                                             per_label=per_label)
    assert constants["LIBDEVICE"] is False
    for _ in range(updates):
        kernel._threshold_kernel[(grid,)](preds, target, loss, *states, *ints, **constants)
    counts, invalid = plain_counts(preds, target, threshold=threshold, ignore_index=ignore, inputs=inputs,
                                   per_label=per_label)
    assert torch.equal(torch.stack(states[:4]), counts * updates), (states[:4], counts)
    assert int(states[6]) == int(invalid) * updates
    assert states[4].item() == loss.float().item() * updates and int(states[5]) == updates


def interpreted_threshold(env: dict[str, str]):
    """Background job: this file as a script under Triton's interpreter, 100 hypothesis examples (None without
    Triton)."""
    if not kernel.AVAILABLE:
        return None
    return background.run([sys.executable, str(Path(__file__))], {**env, "TRITON_INTERPRET": "1", "EXAMPLES": "100"},
                          timeout=600, cwd=Path(__file__).parent)


INTERPRETED = background.job(interpreted_threshold, "test_the_interpreted_kernel_equals_the_plain_update")


@pytest.mark.subprocess
@pytest.mark.skipif(not kernel.AVAILABLE, reason="Triton is not installed")
def test_the_interpreted_kernel_equals_the_plain_update():
    """Triton's interpreter runs the kernel on CPU tensors (numpy): 100 hypothesis examples of every kind above."""
    done = background.result(INTERPRETED)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-3000:] + done.stderr[-3000:]


# On CUDA: the kernel's decisions, element by element, against torch's sigmoid and comparison on the GPU.

def _decisions(values: torch.Tensor, threshold: float, inputs: str) -> torch.Tensor:
    """The kernel's decision for each value: one label per value, all targets 1, so ``tp`` per label is 0 or 1."""
    preds = values.view(1, -1)
    target = torch.ones(preds.shape, dtype=torch.long, device=values.device)
    states = [s.to(values.device) for s in _zeros(True, preds.shape[1])]
    run = kernel.ThresholdLauncher(preds, target, threshold=kernel.compared_threshold(threshold, values.dtype),
                                   ignore_index=None, inputs=inputs, per_label=True)
    run(torch.zeros((), device=values.device), preds, target, states)
    assert int(states[3].sum()) + int(states[0].sum()) == preds.shape[1]  # every value decided once
    return states[0].bool()


@gpu
@pytest.mark.parametrize("inputs", ["logits", "probs"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_on_cuda_every_16_bit_value_is_decided_as_torch_decides(dtype, inputs):
    values = every_value(dtype).cuda()
    for threshold in (0.5, 0.3, 0.01, 0.7310585786300049):  # the last: sigmoid(1); each compiles a kernel
        want = (values.sigmoid() if inputs == "logits" else values) > threshold
        got = _decisions(values, threshold, inputs)
        assert torch.equal(got, want), (threshold, values[got != want][:10].tolist())


@gpu
@pytest.mark.parametrize("inputs", ["logits", "probs"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_on_cuda_wide_values_around_the_threshold_are_decided_as_torch_decides(dtype, inputs):
    gen = torch.Generator(device="cuda").manual_seed(0)
    for threshold in (0.5, 1 / 3, 0.01, 0.999):  # each compiles a kernel
        centre = torch.logit(torch.tensor(threshold, dtype=torch.float64)) if inputs == "logits" else torch.tensor(
            threshold, dtype=torch.float64)
        centre = centre.to(dtype).cuda()
        # the 2**16 values either side of the threshold (or its logit), then values spread wide
        steps = torch.arange(-(2**16), 2**16, device="cuda", dtype=BITS[dtype])
        near = (centre.view(BITS[dtype]) + steps).view(dtype)
        wide = torch.randn(2**17, device="cuda", generator=gen, dtype=dtype) * (8 if inputs == "logits" else 1)
        specials = torch.tensor([0.0, float("nan"), float("inf"), float("-inf"), 100.0, -100.0, 1.0], dtype=dtype,
                                device="cuda")
        values = torch.cat([near, wide, specials])
        want = (values.sigmoid() if inputs == "logits" else values) > threshold
        got = _decisions(values, threshold, inputs)
        assert torch.equal(got, want), (threshold, values[got != want][:10].tolist())


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("run with TRITON_INTERPRET=1 (test_the_interpreted_kernel_equals_the_plain_update does)")
    _interpreted_equals_plain()
    print("ok")
