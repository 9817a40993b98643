"""The thresholded update on CUDA as one Triton kernel launch (private; :mod:`mentor.binary` and
:mod:`mentor.multilabel` use it).

One launch does a whole update of :class:`~mentor._thresholded.ThresholdedMetric`'s states: the sigmoid of
each logit (or the probability as given, or the 0/1 label as given), the comparison with the threshold, the
``ignore_index`` mask, the count of targets (and label predictions) that are neither 0 nor 1, the true and false
positives and negatives (per label, or in total), added with int64 atomics, and, in program 0, the loss sum and
the update count. The inputs are read as a matrix of ``rows x cols`` elements with a row and a column stride each:
a multilabel ``(N, L)`` pair as it is, a binary ``(N,)`` pair as ``N x 1``, a binary ``(N, ...)`` pair as
``N*prod(...) x 1`` when every dimension of each collapses into one stride (a contiguous pair: one element per row,
so that a few large samples, ``(8, 512, 512)`` masks, spread over many programs), else as ``N x prod(...)`` when
its trailing dimensions do (:func:`matrix`). Row and column offsets are int64 (more than 2**31 elements).

The values equal :func:`mentor._thresholded.plain_counts`' (plain torch, the CPU path):

- ``preds > threshold`` in torch casts the Python threshold to ``preds``' dtype (``x > 0.3`` on float16 compares
  with float16(0.3) = 0.30005); the kernel compares with :func:`compared_threshold`, that value, computed once on
  the host (tests/test_threshold_kernel.py checks it against torch for every float16 and bfloat16 value).
- the sigmoid is torch's CUDA formula, ``1 / (1 + exp(-x))`` in float32 (float64 for float64 inputs), rounded to
  ``preds``' dtype (``sigmoid_kernel_cuda``, aten/src/ATen/native/cuda/UnarySpecialOpsKernel.cu: ``one / (one +
  std::exp(-opmath_t{a}))``, ``opmath_t`` float for half and bfloat16), with the correctly rounded division
  (``tl.math.div_rn``) and CUDA's ``expf`` / ``exp`` (libdevice). Under Triton's interpreter (the CPU checks)
  ``exp`` is numpy's. A NaN logit gives a NaN probability, which is not above the threshold (a negative), as in
  torch; ``+inf`` gives 1, ``-inf`` 0.
- the counts are integers, and the loss is cast to the sum's dtype and added once.

``ThresholdLauncher`` launches the kernel for one input layout through :class:`mentor._direct_launch.DirectLauncher`
(used here as it is, subclassed for this kernel's arguments), which calls the compiled kernel directly after its
first launch. ``threshold_update``, the custom operator ``torch.ops.mentor.threshold_update`` registered with
``torch.library.triton_op``, is what a ``torch.compile``'d update calls: traced without a graph break, launched by
inductor. ``AVAILABLE`` is False where Triton cannot be imported, ``OPERATOR`` where ``torch.library`` lacks
``triton_op`` or ``wrap_triton``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from mentor import _direct_launch
from mentor._fused_kernel import AVAILABLE, _next_power_of_2, programs, tl, triton  # Triton, or None without it
ELEMENTS_PER_PROGRAM = 4096
"""Elements loaded per program and column tile (rows per program = this // the tile's columns)."""
MAX_ROWS = 1024
"""The most rows one program reads."""
MAX_TILE = 1024
"""The widest column tile; wider inputs are read in several tiles per row."""
INPUTS = {"logits": 0, "probs": 1, "labels": 2}
"""The kernel's ``INPUTS`` for sigmoid-then-threshold, threshold, and 0/1 labels (integer or bool preds)."""
STATES = ("tp", "fp", "tn", "fn", "loss_sum", "loss_count", "invalid_labels")
"""The states the kernel updates, in the order of its arguments after ``preds, target, loss``."""


def tiles(cols: int) -> tuple[int, int]:
    """``(rows per program, columns per tile)`` for a matrix of ``cols`` columns; neither depends on the rows.

    Example:
        >>> tiles(1), tiles(10), tiles(1000), tiles(5000)
        ((1024, 1), (256, 16), (4, 1024), (4, 1024))
    """
    width = min(MAX_TILE, _next_power_of_2(cols))
    return max(1, min(MAX_ROWS, ELEMENTS_PER_PROGRAM // width)), width


def _collapse(sizes: Sequence[int], strides: Sequence[int]) -> tuple[int, int] | None:
    """``(count, stride)`` of dimensions that one stride walks through, or None when they need two or more."""
    kept = [(size, stride) for size, stride in zip(sizes, strides) if size != 1]
    count = 1
    for size, _ in kept:
        count *= size
    if count == 0 or not kept:
        return count, 0
    for (_, outer), (inner_size, inner) in zip(kept, kept[1:]):
        if outer != inner * inner_size:
            return None
    return count, kept[-1][1]


def matrix(preds: torch.Tensor, target: torch.Tensor) -> tuple[int, int, int, int, int, int] | None:
    """``(rows, cols, preds' row and column strides, target's row and column strides)``: the pair read as a matrix.

    A 1-dim pair is ``N x 1``; an ``(N, ...)`` pair is ``N x prod(...)`` when the trailing dimensions of each
    collapse into one stride (a slice, a transpose of two dimensions does not always); None when they do not
    (the caller then passes contiguous copies). Reads shapes and strides only.

    Example:
        >>> x = torch.zeros(6, 4)
        >>> matrix(x, x), matrix(x[:, 0], x[:, 1]), matrix(x.t(), x.t())
        ((6, 4, 4, 1, 4, 1), (6, 1, 4, 0, 4, 0), (4, 6, 1, 4, 1, 4))
        >>> matrix(torch.zeros(2, 3, 4).transpose(1, 2), torch.zeros(2, 4, 3)) is None
        True
    """
    rows = preds.shape[0]
    if preds.ndim == 1:
        return rows, 1, preds.stride(0), 0, target.stride(0), 0
    p, t = _collapse(preds.shape[1:], preds.stride()[1:]), _collapse(target.shape[1:], target.stride()[1:])
    if p is None or t is None:
        return None
    return rows, p[0], preds.stride(0), p[1], target.stride(0), t[1]


def flat(preds: torch.Tensor, target: torch.Tensor) -> tuple[int, int, int, int, int, int] | None:
    """The pair read as one column, ``(elements, 1, preds' stride, 0, target's stride, 0)``, when every dimension of
    each collapses into one stride (contiguous tensors do); None when not. Reads shapes and strides only.

    Example:
        >>> x = torch.zeros(8, 5, 3)
        >>> flat(x, x), flat(x[:, :, 1], x[:, :, 2]), flat(x[:, 1:], x[:, 1:])
        ((120, 1, 1, 0, 1, 0), (40, 1, 3, 0, 3, 0), None)
    """
    p, t = _collapse(preds.shape, preds.stride()), _collapse(target.shape, target.stride())
    if p is None or t is None:
        return None
    return p[0], 1, p[1], 0, t[1], 0


def compared_threshold(threshold: float, dtype: torch.dtype) -> float:
    """The value ``preds > threshold`` compares with for ``preds`` of this dtype: ``threshold`` cast to it.

    Example:
        >>> [compared_threshold(0.3, dtype) for dtype in (torch.float16, torch.bfloat16, torch.float64)]
        [0.300048828125, 0.30078125, 0.3]
    """
    return float(torch.tensor(threshold, dtype=torch.float64).to(dtype))


def interpreting() -> bool:
    """Whether Triton runs kernels with its interpreter (``TRITON_INTERPRET=1``: numpy on CPU tensors, no libdevice).

    Example:
        >>> interpreting() == (os.environ.get("TRITON_INTERPRET") == "1")
        True
    """
    return os.environ.get("TRITON_INTERPRET") == "1"


def uses_libdevice() -> bool:
    """Whether the kernel takes ``exp`` from CUDA's libdevice (``__nv_expf``, ``__nv_exp``: CUDA's ``expf`` and ``exp``,
    which torch's sigmoid uses), not ``tl.exp``: on an NVIDIA build, outside the interpreter.

    Example:
        >>> uses_libdevice() == (not interpreting() and torch.version.hip is None)
        True
    """
    return not interpreting() and torch.version.hip is None


if AVAILABLE:

    @triton.jit
    def _positive(x, THRESHOLD: tl.constexpr, LOGITS: tl.constexpr, WIDE: tl.constexpr, LIBDEVICE: tl.constexpr):
        """Whether each prediction counts as positive: ``sigmoid(x) > threshold`` or ``x > threshold``."""
        compute = tl.float64 if WIDE else tl.float32
        value = x.to(compute)  # exact for float16 / bfloat16 / float32
        if LOGITS:
            # libdevice reached through tl: inductor recompiles this source with the imports it writes, which are
            # tl and names imported from triton, not modules (user_defined_triton_kernel_transitive_closure_source_code,
            # torch/_inductor/codegen/wrapper.py)
            if LIBDEVICE:
                e = tl.extra.cuda.libdevice.exp(-value)
            else:
                e = tl.exp(-value)
            if WIDE:
                value = 1.0 / (1.0 + e)  # float64 division is IEEE (div.rn.f64)
            else:
                value = tl.math.div_rn(tl.full(value.shape, 1.0, compute), 1.0 + e)  # not div.full.f32
            value = value.to(x.dtype).to(compute)  # torch's sigmoid returns preds' dtype: round to it
        return value > tl.full([], THRESHOLD, compute)

    @triton.jit
    def _threshold_kernel(preds, target, loss, tp, fp, tn, fn, loss_sum, loss_count, invalid_labels,
                          rows, cols, preds_row_stride, preds_col_stride, target_row_stride, target_col_stride,
                          ignore_index, INPUTS: tl.constexpr, THRESHOLD: tl.constexpr, WIDE: tl.constexpr,
                          LIBDEVICE: tl.constexpr, HAS_IGNORE: tl.constexpr, PER_LABEL: tl.constexpr,
                          ROWS: tl.constexpr, COLS: tl.constexpr):
        pid = tl.program_id(0)
        r64 = pid.to(tl.int64) * ROWS + tl.arange(0, ROWS)  # int64: pid * ROWS passes 2**31 with 2**31 rows
        in_rows = r64 < rows
        n_tp = tl.full([], 0, tl.int64)
        n_fp = tl.full([], 0, tl.int64)
        n_tn = tl.full([], 0, tl.int64)
        n_fn = tl.full([], 0, tl.int64)
        n_bad = tl.full([], 0, tl.int64)
        for start in range(0, cols, COLS):
            c = start + tl.arange(0, COLS)
            in_cols = c < cols
            c64 = c.to(tl.int64)
            inside = in_rows[:, None] & in_cols[None, :]
            x = tl.load(preds + r64[:, None] * preds_row_stride + c64[None, :] * preds_col_stride, mask=inside,
                        other=0)
            y = tl.load(target + r64[:, None] * target_row_stride + c64[None, :] * target_col_stride, mask=inside,
                        other=0).to(tl.int64)
            truth = y == 1
            valid = truth | (y == 0)
            if INPUTS == 2:
                label = x.to(tl.int64)
                positive = label == 1
                valid = valid & (positive | (label == 0))
            else:
                positive = _positive(x, THRESHOLD, INPUTS == 0, WIDE, LIBDEVICE)
            counted = inside
            if HAS_IGNORE:
                counted = counted & (y != ignore_index)
            keep = counted & valid
            hit_tp = (keep & positive & truth).to(tl.int64)
            hit_fp = (keep & positive & ~truth).to(tl.int64)
            hit_tn = (keep & ~positive & ~truth).to(tl.int64)
            hit_fn = (keep & ~positive & truth).to(tl.int64)
            n_bad += tl.sum(tl.sum((counted & ~valid).to(tl.int64), axis=1), axis=0)
            if PER_LABEL:  # one count per column (label), added where it is not 0
                col_tp = tl.sum(hit_tp, axis=0)
                col_fp = tl.sum(hit_fp, axis=0)
                col_tn = tl.sum(hit_tn, axis=0)
                col_fn = tl.sum(hit_fn, axis=0)
                tl.atomic_add(tp + c64, col_tp, mask=in_cols & (col_tp > 0))
                tl.atomic_add(fp + c64, col_fp, mask=in_cols & (col_fp > 0))
                tl.atomic_add(tn + c64, col_tn, mask=in_cols & (col_tn > 0))
                tl.atomic_add(fn + c64, col_fn, mask=in_cols & (col_fn > 0))
            else:
                n_tp += tl.sum(tl.sum(hit_tp, axis=1), axis=0)
                n_fp += tl.sum(tl.sum(hit_fp, axis=1), axis=0)
                n_tn += tl.sum(tl.sum(hit_tn, axis=1), axis=0)
                n_fn += tl.sum(tl.sum(hit_fn, axis=1), axis=0)
        if not PER_LABEL:
            if n_tp > 0:
                tl.atomic_add(tp, n_tp)
            if n_fp > 0:
                tl.atomic_add(fp, n_fp)
            if n_tn > 0:
                tl.atomic_add(tn, n_tn)
            if n_fn > 0:
                tl.atomic_add(fn, n_fn)
        if n_bad > 0:
            tl.atomic_add(invalid_labels, n_bad)
        if pid == 0:
            total = tl.load(loss_sum)
            tl.store(loss_sum, total + tl.load(loss).to(total.dtype))
            tl.store(loss_count, tl.load(loss_count) + 1)


def arguments(preds: torch.Tensor, target: torch.Tensor, *, threshold: float, ignore_index: int | None,
              inputs: str, per_label: bool) -> tuple[tuple[int, ...], dict[str, Any], int]:
    """The kernel's integer arguments, its constexpr keywords and its grid size for this input layout.

    ``preds`` and ``target`` must read as a matrix (:func:`matrix` is not None); ``threshold`` is the value the
    predictions are compared with, :func:`compared_threshold` for ``preds``' dtype (worked out by the caller, on
    the host: here the tensors may be fake ones, under ``torch.compile``); ``inputs`` is ``"logits"`` or
    ``"probs"`` for floating preds (integer and bool preds are read as labels whatever it says). Without
    ``per_label``, a pair whose every dimension collapses into one stride is read as one column of all its
    elements (:func:`flat`), so that the rows, and the programs, are as many as the elements allow.

    Example:
        >>> ints, constants, grid = arguments(torch.zeros(32, 5), torch.zeros(32, 5, dtype=torch.long), threshold=0.25,
        ...                                   ignore_index=-1, inputs="logits", per_label=True)
        >>> ints, grid, constants["ROWS"], constants["COLS"], constants["INPUTS"], constants["THRESHOLD"]
        ((32, 5, 5, 1, 5, 1, -1), 1, 512, 8, 0, 0.25)
    """
    rows, cols, p_row, p_col, t_row, t_col = matrix(preds, target)
    if not per_label and cols != 1:
        rows, cols, p_row, p_col, t_row, t_col = flat(preds, target) or (rows, cols, p_row, p_col, t_row, t_col)
    rows_per_program, width = tiles(cols)
    floating = preds.is_floating_point()
    constants = {
        "INPUTS": INPUTS[inputs] if floating else INPUTS["labels"],
        "THRESHOLD": float(threshold) if floating else 0.5,
        "WIDE": preds.dtype == torch.float64,
        "LIBDEVICE": uses_libdevice(),
        "HAS_IGNORE": ignore_index is not None,
        "PER_LABEL": per_label,
        "ROWS": rows_per_program,
        "COLS": width,
    }
    ints = (rows, cols, p_row, p_col, t_row, t_col, 0 if ignore_index is None else ignore_index)
    return ints, constants, programs(rows, rows_per_program)


_PARAMETERS = ["rows", "cols", "preds_row_stride", "preds_col_stride", "target_row_stride", "target_col_stride",
               "ignore_index", "INPUTS", "THRESHOLD", "WIDE", "LIBDEVICE", "HAS_IGNORE", "PER_LABEL", "ROWS", "COLS"]


class ThresholdLauncher(_direct_launch.DirectLauncher):
    """``run(loss, preds, target, states)``: one launch of the thresholded update for inputs laid out as these.

    :class:`mentor._direct_launch.DirectLauncher`'s launch path, as it is (its first launch through Triton's
    ``JITFunction.run``, later ones straight to the compiled kernel, its fallbacks), with this kernel and its
    arguments in place of the multiclass one: only the attributes that its constructor sets are set here.
    ``states`` are :data:`STATES` in order; the caller has checked the inputs.

    Example (making one launches nothing; running it needs CUDA tensors):
        >>> run = ThresholdLauncher(torch.randn(32, 5), torch.zeros(32, 5, dtype=torch.long), threshold=0.5,
        ...                         ignore_index=None, inputs="logits", per_label=True)
        >>> run.grid, run.direct, run.bound
        (1, 0, 0)
    """

    def __init__(self, preds: torch.Tensor, target: torch.Tensor, *, threshold: float, ignore_index: int | None,
                 inputs: str, per_label: bool) -> None:
        ints, constants, self.grid = arguments(preds, target, threshold=threshold, ignore_index=ignore_index,
                                               inputs=inputs, per_label=per_label)
        self._ints, self._constants = ints, constants
        if AVAILABLE and list(_threshold_kernel.arg_names[3 + len(STATES):]) != _PARAMETERS:
            raise RuntimeError("the threshold kernel's parameters changed; update ThresholdLauncher.")
        self._tail = (*ints, *constants.values())
        self._jit = _threshold_kernel[(self.grid,)] if AVAILABLE else None
        self._index = target.device.index
        self._compiled: Any = None
        self._get_stream: Any = None
        self.direct = 0
        self.bound = 0


OPERATOR = AVAILABLE and hasattr(torch.library, "triton_op") and hasattr(torch.library, "wrap_triton")

if OPERATOR:

    @torch.library.triton_op("mentor::threshold_update",
                             mutates_args={"tp", "fp", "tn", "fn", "loss_sum", "loss_count", "invalid_labels"})
    def threshold_update(loss: torch.Tensor, preds: torch.Tensor, target: torch.Tensor, tp: torch.Tensor,
                         fp: torch.Tensor, tn: torch.Tensor, fn: torch.Tensor, loss_sum: torch.Tensor,
                         loss_count: torch.Tensor, invalid_labels: torch.Tensor, threshold: float, ignore_index: int,
                         has_ignore: bool, logits: bool, per_label: bool) -> None:
        """The update kernel as a custom operator that ``torch.compile`` traces (see the module docstring)."""
        ints, constants, grid = arguments(preds, target, threshold=threshold,
                                          ignore_index=ignore_index if has_ignore else None,
                                          inputs="logits" if logits else "probs", per_label=per_label)
        torch.library.wrap_triton(_threshold_kernel)[(grid,)](preds, target, loss, tp, fp, tn, fn, loss_sum,
                                                               loss_count, invalid_labels, *ints, **constants)
