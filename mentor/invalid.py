"""Labels outside the classes, kept loud without a read-back: NaN values on the device, an error on the host.

A prediction or target outside ``0..num_classes - 1`` (and not ``ignore_index``) is left out of
:class:`~mentor.suite.FusedMetrics`' counts and counted on the device. Reading that count back at
``compute()`` would make the host wait for the GPU at every report, so ``compute()`` reads nothing:
:func:`nan_if_invalid` makes every value of the report NaN on the device when the count is not 0, and
the report carries the count itself under ``"invalid_labels"`` (0 when every label was valid). The host
learns of it when the values arrive: :meth:`mentor.readback.DeferredReadback.latest` and
:meth:`~mentor.readback.DeferredReadback.wait` (and so :class:`mentor.lightning.LogEvery`) raise
:class:`InvalidLabelsError` then, and :func:`check_report` does the same for values you read yourself.

A key holds such a count when ``invalid_labels`` is a whole word of it: the key itself, or joined to a
prefix or a postfix by a character that is neither a letter nor a digit (``"train/invalid_labels"``,
``"val_invalid_labels"`` from a ``MetricCollection``'s prefix, ``"invalid_labels_val"`` from its postfix).

Example:
    >>> check_report({"loss": 0.5, "accuracy_micro": 0.75, "invalid_labels": 0.0})
    {'loss': 0.5, 'accuracy_micro': 0.75}
    >>> try:
    ...     check_report({"loss": float("nan"), "train/invalid_labels": 2.0}, step=40)
    ... except InvalidLabelsError as error:
    ...     print(error.count, error.step, error.counts)
    2 40 {'train/invalid_labels': 2}
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from typing import Any

import torch

COUNT_KEY = "invalid_labels"
"""The key of the invalid-label count in ``FusedMetrics.compute()``'s dict."""
_COUNT_WORD = re.compile(r"(?<![A-Za-z0-9])invalid_labels(?![A-Za-z0-9])")


class InvalidLabelsError(ValueError):
    """Labels outside ``0..num_classes - 1`` reached a metric: its report's values are NaN, not scores.

    ``counts`` maps each key that held a nonzero count to that count, ``count`` is their sum, ``step`` the
    step of the report (None when unknown), ``num_classes`` the metric's (None when unknown: the message then
    names the range of each kind of metric). A ``ValueError``, as the error ``compute()`` used to raise.

    Example:
        >>> print(InvalidLabelsError(3, step=7, num_classes=5))
        3 prediction(s) or target(s) outside 0..4 reached the metric since its last reset (step 7) and were left out \
of its counts, so every value of that report is NaN; fix the labels, or pass ignore_index=<the padding label> to the \
metric to skip them.
    """

    def __init__(self, counts: Mapping[str, float] | int, step: int | None = None,
                 num_classes: int | None = None) -> None:
        self.counts = {COUNT_KEY: _whole(counts)} if isinstance(counts, numbers.Real) else {
            str(k): _whole(v) for k, v in counts.items()}
        self.count = sum(self.counts.values())
        self.step, self.num_classes = step, num_classes
        where = [] if step is None else [f"step {step}"]
        if list(self.counts) != [COUNT_KEY]:
            where += [f"{key}: {value}" for key, value in self.counts.items()]
        span = f"0..{num_classes - 1}" if num_classes is not None else (
            "its range (0..num_classes-1 for a multiclass metric, 0 or 1 for a binary or multilabel target)")
        super().__init__(
            f"{self.count} prediction(s) or target(s) outside {span} reached the metric since its last reset"
            f"{' (' + ', '.join(where) + ')' if where else ''} and were left out of its counts, so every value "
            f"of that report is NaN; fix the labels, or pass ignore_index=<the padding label> to the metric to "
            f"skip them.")

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        return InvalidLabelsError, (self.counts, self.step, self.num_classes)


def _whole(value: float) -> Any:
    """A count as an int when it is one (3.0 -> 3), else as it is (NaN stays NaN)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def is_count_key(key: str) -> bool:
    """Whether ``key`` names an invalid-label count: ``invalid_labels`` as a whole word of it (module docstring).

    Example:
        >>> [is_count_key(k) for k in ("invalid_labels", "train/invalid_labels", "a_invalid_labels", "valid_labels")]
        [True, True, True, False]
    """
    return COUNT_KEY in key and _COUNT_WORD.search(key) is not None


def _number(key: str, value: Any) -> float:
    """``value`` as a Python float: a number, or a one-element tensor (read here: a sync if it is on a GPU)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{key!r} must hold one number (the invalid-label count), not a tensor of shape "
                             f"{tuple(value.shape)}.")
        return float(value.item())
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    raise TypeError(f"{key!r} must be the invalid-label count, a number or a one-element tensor, not "
                    f"{type(value).__name__}.")


def _nonzero_counts(values: Mapping[str, Any]) -> dict[str, float]:
    """The count keys of ``values`` whose count is not 0 (a NaN count is not 0), with their counts."""
    counts = {key: _number(key, value) for key, value in values.items() if isinstance(key, str) and is_count_key(key)}
    return {key: count for key, count in counts.items() if count != 0 or math.isnan(count)}


def check_report(values: Mapping[str, Any], *, step: int | None = None,
                 num_classes: int | None = None) -> dict[str, Any]:
    """Raise :class:`InvalidLabelsError` if a count of ``values`` is not 0; else a new dict of the other values.

    ``values`` is a report you read back yourself: a mapping of Python numbers, or of tensors (a tensor count
    is read here, one sync each when on a GPU: read them first, in one copy, to avoid that). It must hold at
    least one count key (``"invalid_labels"``, or a key with that word, see the module docstring): a report
    without one has nothing to check, which is refused rather than passed unchecked. The returned dict keeps
    the values as they were given, in their order, without the count keys. ``step`` and ``num_classes`` only
    complete the error's message.

    Example:
        >>> check_report({"loss": torch.tensor(0.5), "invalid_labels": torch.tensor(0)})
        {'loss': tensor(0.5000)}
        >>> check_report({"loss": 0.5})
        Traceback (most recent call last):
        ...
        ValueError: check_report checks the invalid-label count that FusedMetrics.compute() returns under \
'invalid_labels'; these values have none (keys: ['loss']): pass the whole report.
    """
    if not isinstance(values, Mapping):
        raise TypeError(f"check_report takes the report as a mapping of name -> value (compute()'s dict, or the "
                        f"values read from it), not {type(values).__name__}.")
    if not any(isinstance(key, str) and is_count_key(key) for key in values):
        raise ValueError(f"check_report checks the invalid-label count that FusedMetrics.compute() returns under "
                         f"{COUNT_KEY!r}; these values have none (keys: {list(values)}): pass the whole report.")
    bad = _nonzero_counts(values)
    if bad:
        raise InvalidLabelsError(bad, step=step, num_classes=num_classes)
    return {key: value for key, value in values.items() if not (isinstance(key, str) and is_count_key(key))}


def nan_if_invalid(values: Mapping[str, torch.Tensor], count: torch.Tensor) -> dict[str, torch.Tensor]:
    """``values``, every element NaN when ``count > 0``, and ``count`` itself under ``"invalid_labels"``.

    Nothing is read back: ``torch.where`` picks NaN or the value on the tensors' device, so the choice is made
    when the GPU gets there. The values of one dtype and device are joined into one tensor first, so that
    one ``where`` serves them all (per dtype and device: the join, the test and the pick, whatever the number of
    values; an integer value's cast to float adds one);
    each value returned is a view of that tensor, with the shape it came in. A floating value keeps its
    dtype; an integer one becomes the default float dtype (NaN needs a float). ``count`` is returned as it
    is, not copied.

    Example:
        >>> nan_if_invalid({"loss": torch.tensor(0.5), "per_class": torch.tensor([1.0, 0.5])}, torch.tensor(2))
        {'loss': tensor(nan), 'per_class': tensor([nan, nan]), 'invalid_labels': tensor(2)}
        >>> nan_if_invalid({"loss": torch.tensor(0.5)}, torch.tensor(0))
        {'loss': tensor(0.5000), 'invalid_labels': tensor(0)}
    """
    if not isinstance(count, torch.Tensor) or count.ndim != 0 or count.is_floating_point() or count.is_complex():
        raise TypeError(f"count must be a 0-dim integer tensor (the invalid-label count), not "
                        f"{count.dtype if isinstance(count, torch.Tensor) else type(count).__name__}"
                        f"{f' of shape {tuple(count.shape)}' if isinstance(count, torch.Tensor) else ''}.")
    for key, value in values.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"value {key!r} is a {type(value).__name__}; pass the tensors compute() made, unread.")
    if COUNT_KEY in values:
        raise ValueError(f"values already hold {COUNT_KEY!r}; pass the values without it and the count as count.")
    invalid = count > 0
    groups: dict[tuple[torch.dtype, torch.device], list[str]] = {}
    floats = {key: value if value.is_floating_point() else value.to(torch.get_default_dtype())
              for key, value in values.items()}
    for key, value in floats.items():
        groups.setdefault((value.dtype, value.device), []).append(key)
    out: dict[str, torch.Tensor] = {}
    for keys in groups.values():
        joined = torch.cat([floats[key].reshape(-1) for key in keys])
        picked = torch.where(invalid.to(joined.device), math.nan, joined)
        start = 0
        for key in keys:
            shape, size = floats[key].shape, floats[key].numel()
            out[key] = picked[start] if not shape else picked[start:start + size].view(shape)
            start += size
    out = {key: out[key] for key in values}  # the order values came in
    out[COUNT_KEY] = count
    return out
