"""FusedMetrics' update on CUDA as one Triton kernel launch (private; :class:`mentor.suite.FusedMetrics` uses it).

One launch does the whole update of the suite's states: the argmax of each row of logits (or the class
indices as given), the ``ignore_index`` mask, the count of out-of-range labels, the per-class true
positives, false positives and false negatives (int64 atomic adds), and, in program 0, the loss sum and
the update count. The values equal :meth:`FusedMetrics._plain_update`'s bit for bit: the argmax follows
``torch.argmax`` (the first maximum; a NaN counts as the maximum, the first NaN wins), the counts are
integers, and the loss is cast to the sum's dtype and added once, as there.

With top-k (``_top_k_kernel``, the constexpr ``TOP_K``: the ks above 1, ascending) the same launch also
decides, for each row of logits, whether the target is among the k largest: it loads the target's own
logit, counts while it walks the row's tiles for the argmax how many logits rank above it
(:func:`ranks_above_target`: larger, or equal at a lower class index; a NaN above every number, NaNs tied
with each other), and adds to ``top_k_hits[j]`` the counted rows (not ignored, labels in range) with fewer
than ``TOP_K[j]`` above. Both kernels are one body, ``_update``; with ``TOP_K`` empty, as
``_update_kernel`` passes it, the top-k code is not compiled and its arguments are those of before.

``launcher`` returns a function that launches the kernel through Triton's ``JITFunction.run``, with no
torch dispatcher in between; the suite uses :mod:`mentor._direct_launch`'s, which skips Triton's per-call
binding after the first launch. ``fused_update``, the custom operator ``torch.ops.mentor.fused_update``
registered with ``torch.library.triton_op``, is what a ``torch.compile``'d caller uses: dynamo traces it into
the graph (no graph break) and inductor calls the same kernel; ``fused_update_top_k`` does so with top-k.
``AVAILABLE`` is False where Triton cannot be imported, ``OPERATOR`` where ``torch.library`` has no
``triton_op`` or ``wrap_triton``; in the first case the suite updates with plain torch operations, in the
second it does so under ``torch.compile``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - torch's CUDA wheels ship Triton; a CPU-only install may not
    triton = tl = None

AVAILABLE = triton is not None
ROWS_PER_PROGRAM_INDICES = 256
"""Rows of class-index predictions per program."""
ELEMENTS_PER_PROGRAM = 4096
"""Logits loaded per program and column tile (rows per program = this // the tile's columns)."""
MAX_TILE = 2048
"""The widest column tile; more classes than this are read in several tiles per row."""


def tiles(num_classes: int, logits: bool) -> tuple[int, int]:
    """``(rows per program, columns per tile)`` for ``num_classes`` classes, from the class count only.

    Neither depends on the batch size, so a new batch size does not compile a new kernel.

    Example:
        >>> tiles(1000, logits=True), tiles(10, logits=True), tiles(5000, logits=True), tiles(10, logits=False)
        ((4, 1024), (256, 16), (2, 2048), (256, 1))
    """
    if not logits:
        return ROWS_PER_PROGRAM_INDICES, 1
    cols = min(MAX_TILE, _next_power_of_2(num_classes))
    return max(1, min(ROWS_PER_PROGRAM_INDICES, ELEMENTS_PER_PROGRAM // cols)), cols


def _next_power_of_2(n: int) -> int:
    """The smallest power of 2 that is at least ``n`` (1 for ``n <= 1``), as ``triton.next_power_of_2``.

    Example:
        >>> [_next_power_of_2(n) for n in (1, 2, 3, 1000, 1024, 1025)]
        [1, 2, 4, 1024, 1024, 2048]
    """
    return 1 << max(0, n - 1).bit_length()


def programs(rows: int, rows_per_program: int) -> int:
    """Programs in the grid: enough for every row, and at least one, which adds the loss of an empty batch.

    Example:
        >>> programs(32, 4), programs(33, 4), programs(0, 4)
        (8, 9, 1)
    """
    return max(1, -(-rows // rows_per_program))


if AVAILABLE:

    @triton.jit
    def _update(preds, target, loss, tp, fp, fn, loss_sum, loss_count, invalid, top_k_hits,
                n, num_classes, preds_row_stride, preds_col_stride, target_stride, ignore_index,
                LOGITS: tl.constexpr, HAS_IGNORE: tl.constexpr, WIDE: tl.constexpr,
                ROWS: tl.constexpr, COLS: tl.constexpr, TOP_K: tl.constexpr):
        """The update, shared by the two kernels below; ``TOP_K`` (ascending ks, empty for none) adds the top-k hits."""
        pid = tl.program_id(0)
        rows = pid * ROWS + tl.arange(0, ROWS)
        in_batch = rows < n
        rows64 = rows.to(tl.int64)
        label = tl.load(target + rows64 * target_stride, mask=in_batch, other=0).to(tl.int64)
        if LOGITS:
            best_val = tl.full([ROWS], float("-inf"), tl.float64 if WIDE else tl.float32)
            best_idx = tl.zeros([ROWS], tl.int64)
            found_nan = tl.zeros([ROWS], tl.int1)
            if len(TOP_K) > 0:  # the target's own logit, and how many logits rank above it (ranks_above_target)
                labeled = in_batch & (label >= 0) & (label < num_classes)
                own = tl.load(preds + rows64 * preds_row_stride + tl.where(labeled, label, 0) * preds_col_stride,
                              mask=labeled, other=0.0)
                own = own.to(tl.float64) if WIDE else own.to(tl.float32)
                own_nan = own != own
                above = tl.zeros([ROWS], tl.int32)
            for start in range(0, num_classes, COLS):
                cols = start + tl.arange(0, COLS)
                inside = in_batch[:, None] & (cols[None, :] < num_classes)
                x = tl.load(preds + rows64[:, None] * preds_row_stride + cols[None, :].to(tl.int64) * preds_col_stride,
                            mask=inside, other=float("-inf"))
                x = x.to(tl.float64) if WIDE else x.to(tl.float32)  # exact for fp16 / bf16 / fp32 (fp64 stays fp64)
                is_nan = (x != x) & inside
                big = num_classes + COLS  # above any column index
                first_nan = tl.min(tl.where(is_nan, cols[None, :], big), axis=1)
                tile_nan = first_nan < big
                plain = tl.where(is_nan, float("-inf"), x)
                tile_max = tl.max(plain, axis=1)
                first_max = tl.min(tl.where((plain == tile_max[:, None]) & inside, cols[None, :], big), axis=1)
                # an earlier tile's NaN wins; else this tile's first NaN; else a strictly larger maximum
                take_nan = tile_nan & ~found_nan
                take_max = ~found_nan & ~tile_nan & (tile_max > best_val)
                best_idx = tl.where(take_nan, first_nan.to(tl.int64),
                                    tl.where(take_max, first_max.to(tl.int64), best_idx))
                best_val = tl.where(take_max, tile_max, best_val)
                found_nan = found_nan | tile_nan
                if len(TOP_K) > 0:
                    # above the target's logit: a NaN or a larger number (nothing is above a NaN); tied with it:
                    # an equal number, or a NaN beside a NaN target, at a lower class index
                    greater = (is_nan | (x > own[:, None])) & ~own_nan[:, None]
                    tied = ((is_nan & own_nan[:, None]) | (x == own[:, None])) & (cols[None, :] < label[:, None])
                    above += tl.sum(((greater | tied) & inside).to(tl.int32), axis=1)
            pred = best_idx
        else:
            pred = tl.load(preds + rows64 * preds_row_stride, mask=in_batch, other=0).to(tl.int64)
        in_range = (pred >= 0) & (pred < num_classes) & (label >= 0) & (label < num_classes)
        counted = in_batch
        if HAS_IGNORE:
            counted = counted & (label != ignore_index)
        keep = counted & in_range
        hit = keep & (pred == label)
        miss = keep & (pred != label)
        ones = tl.full([ROWS], 1, tl.int64)
        safe_label = tl.where(keep, label, 0)
        safe_pred = tl.where(keep, pred, 0)
        tl.atomic_add(tp + safe_label, ones, mask=hit)
        tl.atomic_add(fp + safe_pred, ones, mask=miss)
        tl.atomic_add(fn + safe_label, ones, mask=miss)
        bad = tl.sum((counted & ~in_range).to(tl.int64), axis=0)
        if bad > 0:
            tl.atomic_add(invalid, bad)
        if LOGITS:
            if len(TOP_K) > 0:
                for j in tl.static_range(len(TOP_K)):  # the target is among the k largest: fewer than k above it
                    in_top = tl.sum((keep & (above < TOP_K[j])).to(tl.int64), axis=0)
                    if in_top > 0:
                        tl.atomic_add(top_k_hits + j, in_top)
        if pid == 0:
            total = tl.load(loss_sum)
            tl.store(loss_sum, total + tl.load(loss).to(total.dtype))
            tl.store(loss_count, tl.load(loss_count) + 1)

    @triton.jit
    def _update_kernel(preds, target, loss, tp, fp, fn, loss_sum, loss_count, invalid,
                       n, num_classes, preds_row_stride, preds_col_stride, target_stride, ignore_index,
                       LOGITS: tl.constexpr, HAS_IGNORE: tl.constexpr, WIDE: tl.constexpr,
                       ROWS: tl.constexpr, COLS: tl.constexpr):
        _update(preds, target, loss, tp, fp, fn, loss_sum, loss_count, invalid, invalid,
                n, num_classes, preds_row_stride, preds_col_stride, target_stride, ignore_index,
                LOGITS, HAS_IGNORE, WIDE, ROWS, COLS, ())

    @triton.jit
    def _top_k_kernel(preds, target, loss, tp, fp, fn, loss_sum, loss_count, invalid, top_k_hits,
                      n, num_classes, preds_row_stride, preds_col_stride, target_stride, ignore_index,
                      LOGITS: tl.constexpr, HAS_IGNORE: tl.constexpr, WIDE: tl.constexpr,
                      ROWS: tl.constexpr, COLS: tl.constexpr, TOP_K: tl.constexpr):
        _update(preds, target, loss, tp, fp, fn, loss_sum, loss_count, invalid, top_k_hits,
                n, num_classes, preds_row_stride, preds_col_stride, target_stride, ignore_index,
                LOGITS, HAS_IGNORE, WIDE, ROWS, COLS, TOP_K)


def ranks_above_target(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """How many logits of each row rank above the target's own, by the kernel's rule: the target is among the
    k largest when this is less than k (the kernel's top-k test, written in torch; the tests' reference).

    A logit ranks above the target's when it is larger, or equal at a lower class index (ties go to the lower
    index; ``-0.0`` equals ``0.0``). A NaN counts as larger than every number, as in ``torch.topk``, and NaNs
    tie with each other. Targets outside ``0..C-1`` get a count as if they were clamped into it (the kernel
    leaves their rows out). ``torch.topk`` itself breaks ties in no documented order (see
    :class:`mentor.suite.FusedMetrics`), so on tied logits this rule and ``torch.topk`` may disagree.

    Example:
        >>> logits = torch.tensor([[0.5, 2.0, 2.0, float("nan")], [1.0, 1.0, 1.0, 1.0]])
        >>> ranks_above_target(logits, torch.tensor([2, 3])).tolist()  # NaN and the tied 2.0 at index 1; 3 ties
        [2, 3]
    """
    classes = logits.shape[1]
    own = logits.gather(1, target.long().clamp(0, classes - 1)[:, None])
    nan, own_nan = logits.isnan(), own.isnan()
    lower = torch.arange(classes, device=logits.device)[None, :] < target[:, None]
    greater = (nan | (logits > own)) & ~own_nan
    tied = ((nan & own_nan) | (logits == own)) & lower
    return (greater | tied).sum(1)


def _arguments(preds: torch.Tensor, target: torch.Tensor, num_classes: int, ignore_index: int | None,
               top_k: tuple[int, ...] = ()) -> tuple[tuple[int, ...], dict[str, Any], int]:
    """The kernel's integer arguments, its constexpr keywords and its grid size, for inputs laid out as these;
    with ``top_k`` (ascending ks above 1) the constexprs are :func:`kernel_for`'s ``_top_k_kernel``'s."""
    logits = preds.ndim == 2
    rows_per_program, cols = tiles(num_classes, logits)
    n = target.shape[0]
    row_stride, col_stride = (preds.stride(0), preds.stride(1)) if logits else (preds.stride(0), 0)
    ints = (n, num_classes, row_stride, col_stride, target.stride(0), 0 if ignore_index is None else ignore_index)
    constants = {"LOGITS": logits, "HAS_IGNORE": ignore_index is not None,
                 "WIDE": preds.dtype == torch.float64, "ROWS": rows_per_program, "COLS": cols}
    if top_k:
        constants["TOP_K"] = tuple(top_k)
    return ints, constants, programs(n, rows_per_program)


def kernel_for(top_k: tuple[int, ...]) -> Any:
    """The JIT kernel an update launches: ``_update_kernel``, or ``_top_k_kernel`` (one more state, ``top_k_hits``,
    after ``invalid``, and the constexpr ``TOP_K``) when ``top_k`` holds a k.

    Example:
        >>> kernel_for(()).arg_names[-1], kernel_for((5,)).arg_names[-1]
        ('COLS', 'TOP_K')
    """
    return _top_k_kernel if top_k else _update_kernel


Launcher = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Sequence[torch.Tensor]], None]


def launcher(preds: torch.Tensor, target: torch.Tensor, num_classes: int, ignore_index: int | None,
             top_k: tuple[int, ...] = ()) -> Launcher:
    """A function ``run(loss, preds, target, states)`` that launches the update kernel once, for inputs with the
    shapes, strides, dtypes and device of ``preds`` and ``target``.

    ``states`` is ``(tp, fp, fn, loss_sum, loss_count, invalid_labels)``, updated in place, with ``top_k_hits``
    after them when ``top_k`` (the ks above 1, ascending) is not empty. The grid and the
    kernel's integer and constexpr arguments are worked out here, once per layout; each run only calls
    Triton's launcher (``JITFunction.run``: it binds the arguments, looks the compiled kernel up in its cache
    and launches it on the current stream). The caller has checked the inputs (:func:`mentor.suite._check_inputs`).

    Example (making a launcher launches nothing; running it needs CUDA tensors):
        >>> logits, labels = torch.randn(32, 1000), torch.randint(0, 1000, (32,))
        >>> run = launcher(logits, labels, num_classes=1000, ignore_index=-100)
        >>> states = [torch.zeros(1000, dtype=torch.long) for _ in range(3)] + [
        ...     torch.zeros(()), torch.zeros((), dtype=torch.long), torch.zeros((), dtype=torch.long)]
        >>> if torch.cuda.is_available():
        ...     run(torch.tensor(0.5), logits, labels, states)  # (all on the GPU, in a real call)
    """
    ints, constants, grid = _arguments(preds, target, num_classes, ignore_index, top_k)
    kernel = kernel_for(top_k)[(grid,)]
    index = target.device.index

    def run(loss: torch.Tensor, preds: torch.Tensor, target: torch.Tensor, states: Sequence[torch.Tensor]) -> None:
        if torch.cuda.current_device() == index:
            kernel(preds, target, loss, *states, *ints, **constants)
        else:  # Triton launches on the current device: make it the inputs' device for this launch
            with torch.cuda.device(index):
                kernel(preds, target, loss, *states, *ints, **constants)

    return run


OPERATOR = AVAILABLE and hasattr(torch.library, "triton_op") and hasattr(torch.library, "wrap_triton")

if OPERATOR:

    @torch.library.triton_op("mentor::fused_update",
                             mutates_args={"tp", "fp", "fn", "loss_sum", "loss_count", "invalid_labels"})
    def fused_update(loss: torch.Tensor, preds: torch.Tensor, target: torch.Tensor, tp: torch.Tensor,
                     fp: torch.Tensor, fn: torch.Tensor, loss_sum: torch.Tensor, loss_count: torch.Tensor,
                     invalid_labels: torch.Tensor, num_classes: int, ignore_index: int, has_ignore: bool) -> None:
        """The update kernel as a custom operator that ``torch.compile`` traces (see the module docstring)."""
        ints, constants, grid = _arguments(preds, target, num_classes, ignore_index if has_ignore else None)
        torch.library.wrap_triton(_update_kernel)[(grid,)](preds, target, loss, tp, fp, fn, loss_sum, loss_count,
                                                            invalid_labels, *ints, **constants)

    @torch.library.triton_op("mentor::fused_update_top_k",
                             mutates_args={"tp", "fp", "fn", "loss_sum", "loss_count", "invalid_labels",
                                           "top_k_hits"})
    def fused_update_top_k(loss: torch.Tensor, preds: torch.Tensor, target: torch.Tensor, tp: torch.Tensor,
                           fp: torch.Tensor, fn: torch.Tensor, loss_sum: torch.Tensor, loss_count: torch.Tensor,
                           invalid_labels: torch.Tensor, top_k_hits: torch.Tensor, num_classes: int,
                           ignore_index: int, has_ignore: bool, top_k: list[int]) -> None:
        """``fused_update`` with the top-k hits too (``_top_k_kernel``), for ``top_k`` the ks above 1, ascending."""
        ints, constants, grid = _arguments(preds, target, num_classes, ignore_index if has_ignore else None,
                                           tuple(top_k))
        torch.library.wrap_triton(_top_k_kernel)[(grid,)](preds, target, loss, tp, fp, fn, loss_sum, loss_count,
                                                           invalid_labels, top_k_hits, *ints, **constants)
