"""FusedMetrics' scores from its counts, and its top-k accuracy (private; :mod:`mentor.suite` re-exports ``scores``).

``scores`` turns the per-class true positive, false positive and false negative counts into accuracy,
precision, recall and F1 with every average, as torchmetrics does. The top-k part: ``top_k_values`` checks
``FusedMetrics``' ``top_k`` argument, ``top_k_hits`` counts the targets among the k largest logits with
``torch.topk`` as torchmetrics does (the plain update's way), and ``top_k_scores`` divides the hits by the
counted samples. All of it runs on the device, with no sync.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

AVERAGES = ("micro", "macro", "weighted")
SCORES = ("accuracy", "precision", "recall", "f1")


def scores(tp: torch.Tensor, fp: torch.Tensor, fn: torch.Tensor, zero_division: float = 0.0,
           per_class: bool = False) -> dict[str, torch.Tensor]:
    """Accuracy, precision, recall and F1 with micro, macro and weighted averages from per-class counts.

    The arithmetic is torchmetrics' (``_safe_divide`` and ``_adjust_weights_safe_divide`` in
    ``torchmetrics.utilities.compute``), in float32 as there, on the device and without a sync;
    accuracy ignores ``zero_division``, as torchmetrics' does. The values are views of the two tensors that
    :func:`score_tables` makes in a fixed number of operations, whatever the number of classes.

    Example:
        >>> s = scores(torch.tensor([1, 1, 0]), torch.tensor([0, 1, 0]), torch.tensor([1, 0, 0]))
        >>> round(float(s["precision_macro"]), 4), round(float(s["recall_weighted"]), 4)
        (0.75, 0.6667)
    """
    table, per = score_tables(tp, fp, fn, zero_division)
    return score_views(table, per if per_class else None)


def score_tables(tp: torch.Tensor, fp: torch.Tensor, fn: torch.Tensor,
                 zero_division: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(table, per)``: ``table[i, j]`` is score ``SCORES[i]`` with average ``AVERAGES[j]``, ``per[i]`` score
    ``SCORES[i]`` per class; all of them in a fixed number of tensor operations, whatever the number of classes.

    Each operation is torchmetrics' own, element for element: the per-class and micro ratios are
    ``_safe_divide`` of the same integer sums cast to float (the micro column is the classes' sums, appended as
    one more class), and an average is ``_safe_divide(weights * score, weights.sum())`` summed over the classes,
    with weights 1 for the classes seen in predictions or targets (macro) or the support (weighted), each of the
    8 averages by a sum of its own (8 sums, whatever the number of classes), so that it reduces in the order of
    torchmetrics' own sum. Integer counts are summed as integers before the cast, as torchmetrics sums its
    ``long`` states, except F1's denominator, which torchmetrics adds in float (``2 tp + fn``, then ``+ fp``);
    float counts keep their dtype.

    Example:
        >>> table, per = score_tables(torch.tensor([1, 1, 0]), torch.tensor([0, 1, 0]), torch.tensor([1, 0, 0]))
        >>> table.shape, per.shape, round(float(table[1, 1]), 4)  # precision, macro
        (torch.Size([4, 3]), torch.Size([4, 3]), 0.75)
    """
    c = tp.shape[-1]
    counts = torch.stack((tp, fp, fn))
    counts = torch.cat((counts, counts.sum(1, keepdim=True)), 1)  # (3, C + 1): the micro sums as class C
    pairs = counts[:1] + counts[1:]  # tp + fp, tp + fn
    num = _float(counts[0]).expand(4, c + 1).clone()  # tp for accuracy, precision, recall; 2 tp for F1
    num[3] *= 2  # torchmetrics' (1 + beta2) * tp, beta2 = 1.0
    f1_den = (num[3] + _float(counts[2])) + _float(counts[1])  # + beta2 * fn, then + fp, in float, in that order
    den = torch.cat((_float(torch.cat((pairs[1:], pairs[:1], pairs[1:]))), f1_den[None]))
    per = torch.where(den != 0, num / den, torch.full((), zero_division, dtype=num.dtype, device=num.device))
    if zero_division != 0:  # accuracy has no zero_division in torchmetrics: 0 there
        per[0] = torch.where(den[0] != 0, per[0], torch.zeros((), dtype=num.dtype, device=num.device))
    # weights: 1 for a class seen in predictions or targets (macro), its support (weighted)
    weights = _float(torch.stack((pairs[0, :c] + counts[2, :c] > 0, pairs[1, :c])))
    averaged = weighted_sums(weights, per[:, :c], weights.sum(1, keepdim=True)[:, None])  # (2, 4)
    return torch.stack((per[:, c], averaged[0], averaged[1]), 1), per[:, :c]


def score_views(table: torch.Tensor, per: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """``{"accuracy_micro": table[0, 0], ...}`` (and ``"{score}_per_class"`` from ``per``): views, no copy.

    Example:
        >>> list(score_views(torch.zeros(4, 3)))[:4]
        ['accuracy_micro', 'accuracy_macro', 'accuracy_weighted', 'precision_micro']
    """
    out = {}
    for i, name in enumerate(SCORES):
        for j, average in enumerate(AVERAGES):
            out[f"{name}_{average}"] = table[i, j]
        if per is not None:
            out[f"{name}_per_class"] = per[i]
    return out


_ROW_ALIGN = 64
"""Elements between the starts of two rows of averaged terms: 256 bytes and more, as CUDA's allocator aligns."""


def weighted_sums(weights: torch.Tensor, per: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """``out[j, i]``: the sum over the classes of ``weights[j] * per[i] / total[j]`` (0 where ``total[j]`` is 0),
    torchmetrics' ``_safe_divide(weights * score, weights.sum()).sum()`` for every weighting ``j`` and score ``i``.

    Each of these sums reduces its own row, and every row starts :data:`_ROW_ALIGN` elements after the last, at an
    address aligned as a new tensor's: the sum then takes the order of torchmetrics' sum of its own ``(C,)``
    tensor. One sum of the ``(J, I, C)`` table would split its rows among other threads (on CUDA, which sizes a
    reduction's blocks by its number of outputs, and on a CPU above 32768 values), and differ in the last bits.

    Example:
        >>> weighted_sums(torch.tensor([[1.0, 1.0]]), torch.tensor([[0.5, 1.0]]), torch.tensor([[[2.0]]]))
        tensor([[0.7500]])
    """
    n = per.shape[-1]
    rows = weights.shape[0] * per.shape[0]
    terms = torch.empty((rows, -(-n // _ROW_ALIGN) * _ROW_ALIGN), dtype=per.dtype, device=per.device)
    torch.where(total != 0, weights[:, None] * per[None] / total, torch.zeros((), dtype=per.dtype, device=per.device),
                out=terms[:, :n].view(weights.shape[0], per.shape[0], n))
    return torch.stack([row[:n].sum() for row in terms.unbind()]).view(weights.shape[0], per.shape[0])


def _float(x: torch.Tensor) -> torch.Tensor:
    """``x`` as float32 unless it is floating already (then as it is), as ``_safe_divide`` casts."""
    return x if x.is_floating_point() else x.float()


def _divide(num: torch.Tensor, denom: torch.Tensor, zero_division: float) -> torch.Tensor:
    """torchmetrics' ``_safe_divide``: float32 (or the input's float dtype), ``zero_division`` where denom is 0."""
    num = num if num.is_floating_point() else num.float()
    denom = denom if denom.is_floating_point() else denom.float()
    return torch.where(denom != 0, num / denom, torch.full((), zero_division, dtype=num.dtype, device=num.device))


def top_k_values(top_k: int | Sequence[int], num_classes: int) -> tuple[int, ...]:
    """The ks of ``FusedMetrics``' ``top_k`` argument above 1, ascending: the ones it counts (``"accuracy_top{k}"``;
    k = 1 is ``"accuracy_micro"``, always there). Raises ``ValueError`` for anything but an int from 1 to
    ``num_classes`` or a tuple (or list) of such ints, each once.

    Example:
        >>> top_k_values(5, 10), top_k_values((1, 5, 3), 10), top_k_values(1, 10)
        ((5,), (3, 5), ())
    """
    how = "pass an int k from 1 to num_classes (e.g. 5) or a tuple of them (e.g. (1, 5))"
    ks = tuple(top_k) if isinstance(top_k, (tuple, list)) else (top_k,)
    if not ks:
        raise ValueError(f"top_k must hold at least one k; {how}, got {top_k!r}.")
    for k in ks:
        if isinstance(k, bool) or not isinstance(k, int):
            raise ValueError(f"top_k must be an int or a tuple of ints; {how}, got {top_k!r}.")
        if k < 1:
            raise ValueError(f"top_k must be at least 1 (top_k=1 is the plain accuracy); {how}, got {top_k!r}.")
        if k > num_classes:
            raise ValueError(f"top_k must be at most num_classes ({num_classes}), got {top_k!r}: a row has only "
                             f"{num_classes} logits to rank; pass ks from 1 to {num_classes}.")
    repeated = sorted({k for k in ks if ks.count(k) > 1})
    if repeated:
        raise ValueError(f"top_k lists {', '.join(map(str, repeated))} more than once, got {top_k!r}; "
                         f"pass each k once, e.g. {tuple(sorted(set(ks)))}.")
    return tuple(sorted(k for k in ks if k > 1))


def top_k_hits(logits: torch.Tensor, target: torch.Tensor, keep: torch.Tensor, ks: Sequence[int]) -> torch.Tensor:
    """For each k of ``ks``, how many rows that ``keep`` marks have their target among the k largest logits, by
    ``torch.topk`` exactly as torchmetrics 1.9.0 calls it (one long per k).

    torchmetrics' top-k test (``_refine_preds_oh``, ``functional/classification/stat_scores.py:366-368``) is
    ``torch.topk(preds, k=top_k, dim=1).indices``, on the logits reshaped to ``(N, C, 1)`` (:342), compared
    with the target; here the same call on the same view, once per k, so that tied logits are picked as there.

    Example:
        >>> logits = torch.tensor([[3.0, 2.0, 1.0], [1.0, 2.0, 3.0]])
        >>> top_k_hits(logits, torch.tensor([1, 0]), torch.tensor([True, True]), (2, 3)).tolist()
        [1, 2]
    """
    rows = logits[..., None]  # (N, C, 1), as torchmetrics' _multiclass_stat_scores_format leaves them
    hits = [((torch.topk(rows, k, dim=1).indices[..., 0] == target[:, None]).any(1) & keep).sum() for k in ks]
    return torch.stack(hits)


def top_k_scores(hits: torch.Tensor, tp: torch.Tensor, fn: torch.Tensor, ks: Sequence[int]) -> dict[str, torch.Tensor]:
    """``{"accuracy_top{k}": hits / counted samples}`` for each k of ``ks``: torchmetrics' micro accuracy
    (``_safe_divide(tp, tp + fn)`` summed over the classes, ``functional/classification/accuracy.py:78-85``),
    0 before any counted sample. Every counted sample (not ignored, labels in range) adds 1 to ``tp`` or ``fn``
    of its target, so ``tp.sum() + fn.sum()`` is their number.

    Example:
        >>> top_k_scores(torch.tensor([3, 4]), torch.tensor([1, 1, 0]), torch.tensor([1, 0, 2]), (2, 3))
        {'accuracy_top2': tensor(0.6000), 'accuracy_top3': tensor(0.8000)}
    """
    return {f"accuracy_top{k}": ratio for k, ratio in zip(ks, top_k_ratios(hits, tp, fn).unbind())}


def top_k_ratios(hits: torch.Tensor, tp: torch.Tensor, fn: torch.Tensor) -> torch.Tensor:
    """``hits / counted samples`` for every k at once, as one tensor (:func:`top_k_scores` names them).

    Example:
        >>> top_k_ratios(torch.tensor([3, 4]), torch.tensor([1, 1, 0]), torch.tensor([1, 0, 2]))
        tensor([0.6000, 0.8000])
    """
    return _divide(hits, tp.sum() + fn.sum(), 0.0)
