"""Statistics of step times: one configuration's :class:`Result`, an :class:`Interval`, and the paired bootstrap.

:func:`paired_overhead` compares two configurations that ran in the same interleaved rounds: the
overhead of one over the other in percent, with a percentile bootstrap interval that resamples
rounds, so that a round's drift hits both sides. :class:`mentor.lab.comparison.Comparison` applies
it to every configuration of a run.

Example:
    >>> base = Result("none", "", [[10.0, 10.0], [12.0, 12.0], [11.0, 11.0]])
    >>> slow = Result("metrics", "", [[11.0, 11.0], [13.2, 13.2], [12.1, 12.1]])
    >>> print(paired_overhead(slow.round_step_ms, base.round_step_ms))
    +10.0 % [10.0, 10.0]
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

import numpy as np

KINDS = ("median", "throughput")
"""What :func:`paired_overhead` can compare: the median step time, or the total time of all timed steps."""

RESAMPLES = 4000
"""Bootstrap resamples per interval."""

NOT_COUNTED = "not counted"
"""``Result.syncs_note`` when syncs were not counted (``count_syncs=False``)."""
CPU_NOTE = "n/a (CPU)"
"""``Result.syncs_note`` when the run was on the CPU, where syncs cannot be counted."""


@dataclass(frozen=True)
class Interval:
    """A point estimate in percent with a confidence interval ``[lo, hi]`` (NaN when there is none).

    Example:
        >>> print(Interval(7.0, 6.1, 8.0))
        +7.0 % [6.1, 8.0]
        >>> Interval(-0.25, -1.0, 0.5).fmt(2)
        '-0.25 % [-1.00, 0.50]'
        >>> print(Interval(7.0, float("nan"), float("nan")))
        +7.0 % [one round: no interval]
    """

    point: float
    lo: float
    hi: float
    level: float = 0.95

    def __post_init__(self) -> None:
        for label in ("point", "lo", "hi", "level"):
            value = getattr(self, label)
            if isinstance(value, bool) or not isinstance(value, Real):
                raise TypeError(f"Interval.{label} must be a number, got {value!r}.")
        if not math.isfinite(self.point):
            raise ValueError(f"Interval.point must be finite, got {self.point!r}.")
        if math.isnan(self.lo) != math.isnan(self.hi):
            raise ValueError(f"Interval lo and hi must both be numbers or both NaN, got {self.lo!r}, {self.hi!r}.")
        if not self.lo <= self.hi and not math.isnan(self.lo):
            raise ValueError(f"Interval needs lo <= hi, got lo={self.lo!r}, hi={self.hi!r}.")
        if not 0 < self.level < 1:
            raise ValueError(f"Interval.level must be between 0 and 1 (0.95 for 95 %), got {self.level!r}.")

    @property
    def has_interval(self) -> bool:
        """False when there is only a point estimate (one round)."""
        return not math.isnan(self.lo)

    def fmt(self, digits: int = 1) -> str:
        """``+7.0 % [6.1, 8.0]`` with ``digits`` decimals; the point always carries its sign. A number that is not 0
        but would print as 0 gets the decimals that show its sign (:func:`number`), so that the printed ends tell
        on which side of 0 the interval lies.

        Example:
            >>> Interval(0.027, 0.009, 0.045).fmt(1), Interval(-0.02, -0.04, 0.01).fmt(1)
            ('+0.03 % [0.01, 0.04]', '-0.02 % [-0.04, 0.01]')
        """
        return self.cell(digits).replace(" [", " % [", 1) if self.has_interval else f"{self.cell(digits)} %" + (
            " [one round: no interval]")

    def cell(self, digits: int = 1) -> str:
        """:meth:`fmt` without the percent sign, for a table's cell: ``+7.0 [6.1, 8.0]``, or the point alone.

        Example:
            >>> Interval(7.0, 6.1, 8.0).cell(), Interval(0.0, -0.004, 0.0).cell()
            ('+7.0 [6.1, 8.0]', '+0.0 [-0.004, 0.0]')
        """
        if isinstance(digits, bool) or not isinstance(digits, int) or digits < 0:
            raise ValueError(f"digits must be an int >= 0, got {digits!r}.")
        point = number(self.point, digits, sign=True)
        if not self.has_interval:
            return point
        return f"{point} [{number(self.lo, digits)}, {number(self.hi, digits)}]"

    def __str__(self) -> str:
        return self.fmt(1)


def number(value: float, digits: int = 1, sign: bool = False) -> str:
    """``value`` with ``digits`` decimals, or with more while it is not 0 but would print as 0 or -0 (its first
    significant digit shown): the book prints an interval's ends this way in text, tables and figure labels, so that
    a reader sees on which side of 0 each end lies. ``sign`` puts a ``+`` before positive numbers. An exact 0 prints
    as 0.

    Example:
        >>> number(0.009), number(-0.0004), number(0.00004), number(0.0), number(2.26, sign=True)
        ('0.01', '-0.0004', '0.00004', '0.0', '+2.3')
    """
    if isinstance(digits, bool) or not isinstance(digits, int) or digits < 0:
        raise ValueError(f"digits must be an int >= 0, got {digits!r}.")
    shown = digits
    while value != 0 and round(value, shown) == 0 and shown < 15:
        shown += 1
    text = f"{value:{'+' if sign else ''}.{shown}f}"
    return text.replace("-0.", "0.", 1) if value == 0 else text


def _check_count_or_none(owner: str, label: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{owner}: {label} must be a number >= 0 or None (not counted), got {value!r}.")


@dataclass
class Result:
    """Timings of one configuration: every timed step of every round, in milliseconds.

    ``report_steps`` are the positions within a round whose step also ran ``on_report``
    (see :func:`mentor.lab.compare.report_positions`). ``syncs_per_step`` and ``report_syncs`` (syncs of one
    ``on_report`` call) come from an untimed pass; when they are ``None``, ``syncs_note``
    says why (``"not counted"`` or ``"n/a (CPU)"``).

    Example:
        >>> r = Result("x", "", [[1.0, 3.0], [2.0, 4.0]], report_steps=[1])
        >>> r.round_medians_ms, r.total_ms, r.median_ms
        ([2.0, 3.0], [4.0, 6.0], 2.5)
    """

    name: str
    description: str
    round_step_ms: list[list[float]]
    report_steps: list[int] = field(default_factory=list)
    syncs_per_step: float | None = None
    report_syncs: float | None = None
    syncs_note: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Result name must be a non-empty string, got {self.name!r}.")
        who = f"Result {self.name!r}"
        rounds = self.round_step_ms
        if isinstance(rounds, (str, bytes)) or not isinstance(rounds, Sequence) or not rounds:
            raise ValueError(f"{who}: round_step_ms must be a non-empty list of rounds, each a list of step "
                             f"times in ms, got {rounds!r}.")
        clean = []
        for k, steps in enumerate(rounds):
            if isinstance(steps, (str, bytes)) or not isinstance(steps, Sequence) or not steps:
                raise ValueError(f"{who}: round {k} of round_step_ms must be a non-empty list of step times "
                                 f"in ms, got {steps!r}.")
            for j, t in enumerate(steps):
                if isinstance(t, bool) or not isinstance(t, Real) or not math.isfinite(t) or t <= 0:
                    raise ValueError(f"{who}: step {j} of round {k} is {t!r}; step times must be finite "
                                     "positive milliseconds.")
            clean.append([float(t) for t in steps])
        self.round_step_ms = clean
        shortest = min(len(s) for s in clean)
        positions = list(self.report_steps)
        ints = all(isinstance(p, int) and not isinstance(p, bool) for p in positions)
        if not ints or positions != sorted(set(positions)) \
                or (positions and not 0 <= positions[0] <= positions[-1] < shortest):
            raise ValueError(f"{who}: report_steps must be increasing step positions in 0..{shortest - 1}, "
                             f"got {self.report_steps!r}; report_positions(warmup, steps, report_every) gives them.")
        self.report_steps = positions
        _check_count_or_none(who, "syncs_per_step", self.syncs_per_step)
        _check_count_or_none(who, "report_syncs", self.report_syncs)
        if self.syncs_note is not None and not isinstance(self.syncs_note, str):
            raise TypeError(f"{who}: syncs_note must be a string or None, got {self.syncs_note!r}.")

    @property
    def rounds(self) -> int:
        """Number of rounds."""
        return len(self.round_step_ms)

    @property
    def step_ms(self) -> list[float]:
        """Every timed step of every round, pooled in round order."""
        return [t for steps in self.round_step_ms for t in steps]

    @property
    def round_medians_ms(self) -> list[float]:
        """Median step time of each round."""
        return [statistics.median(steps) for steps in self.round_step_ms]

    @property
    def total_ms(self) -> list[float]:
        """Time of all timed steps of each round, report steps included."""
        return [math.fsum(steps) for steps in self.round_step_ms]

    @property
    def median_ms(self) -> float:
        """Median over every timed step of every round."""
        return statistics.median(self.step_ms)

    @property
    def spread_ms(self) -> tuple[float, float]:
        """Lowest and highest per-round median (a description of drift, not a statistical test)."""
        medians = self.round_medians_ms
        return min(medians), max(medians)

    @property
    def report_step_ms(self) -> list[float]:
        """Times of the steps that ran ``on_report``, over all rounds."""
        return [steps[p] for steps in self.round_step_ms for p in self.report_steps]


def _pooled_medians(rounds: list[list[float]], idx: np.ndarray) -> np.ndarray:
    """Median of the pooled steps of the rounds ``idx[b]``, for every resample ``b``."""
    if len({len(s) for s in rounds}) == 1:
        arr = np.asarray(rounds)
        return np.median(arr[idx].reshape(idx.shape[0], -1), axis=1)
    arrs = [np.asarray(s) for s in rounds]
    return np.array([np.median(np.concatenate([arrs[i] for i in row])) for row in idx])




def _rounds(label: str, rounds: Any) -> list[list[float]]:
    """``rounds`` checked as a non-empty list of non-empty rounds of positive finite step times (as
    :class:`Result` checks them), with an error that names ``label`` as :func:`paired_overhead`'s argument."""
    try:
        return Result(label, "", rounds).round_step_ms
    except ValueError as err:
        text = str(err).removeprefix(f"Result {label!r}: ").replace("round_step_ms", label)
        text = re.sub(r"^(step \d+ of round \d+) is", rf"\1 of {label} is", text)
        raise ValueError(f"paired_overhead: {text}") from None


def paired_overhead(rounds: Sequence[Sequence[float]], base: Sequence[Sequence[float]], kind: str = "median",
                    level: float = 0.95, seed: int = 0) -> Interval:
    """Overhead of ``rounds`` over ``base`` in percent, ``(ratio - 1) * 100``, with a paired bootstrap interval.

    Both are lists of rounds, each round the step times (ms) of one run; round ``k`` of both ran
    in the same interleaved round. ``kind="median"``: ratio of the median step times, each pooled
    over all rounds. ``kind="throughput"``: ratio of the total times of all timed steps, report
    steps included, i.e. the loss of throughput.

    The interval is a paired percentile bootstrap over rounds: :data:`RESAMPLES` times, draw as
    many round indices as there are rounds, with replacement, take the same rounds of both (they
    ran interleaved, so a round's drift hits both) and recompute the statistic from those rounds'
    steps; ``lo`` and ``hi`` are the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles. The draws
    come from ``numpy.random.default_rng(seed)``, so the interval is reproducible.

    What it means and its limit: the interval says how much the estimate moves when the rounds
    of this one session are redrawn. It captures round-to-round drift on one machine in one
    process, not the variation between processes, machines or driver versions. With few rounds
    (5) the bootstrap is coarse (only so many distinct resamples) and tends to be too narrow.
    With one round there is no interval: ``lo`` and ``hi`` are NaN.

    Example:
        >>> paired_overhead([[11.0], [22.0]], [[10.0], [20.0]]).fmt(3)
        '+10.000 % [10.000, 10.000]'
        >>> print(paired_overhead([[11.0]], [[10.0]], kind="throughput"))
        +10.0 % [one round: no interval]
    """
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}: pass one of {list(KINDS)}.")
    if isinstance(level, bool) or not isinstance(level, Real) or not 0 < level < 1:
        raise ValueError(f"level must be a number between 0 and 1 (0.95 for 95 %), got {level!r}.")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int (it seeds the bootstrap), got {seed!r}.")
    a, b = _rounds("rounds", rounds), _rounds("base", base)
    if len(a) != len(b):
        raise ValueError(f"rounds has {len(a)} rounds and base {len(b)}: the bootstrap pairs round k of one with "
                         "round k of the other, so pass rounds of the same run.")
    if kind == "median":
        point = statistics.median(t for r in a for t in r) / statistics.median(t for r in b for t in r)
    else:
        point = math.fsum(math.fsum(r) for r in a) / math.fsum(math.fsum(r) for r in b)
    point = (point - 1.0) * 100.0
    if len(a) < 2:
        return Interval(point, math.nan, math.nan, level)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a), size=(RESAMPLES, len(a)))
    if kind == "median":
        ratios = _pooled_medians(a, idx) / _pooled_medians(b, idx)
    else:
        ta, tb = np.asarray([math.fsum(r) for r in a]), np.asarray([math.fsum(r) for r in b])
        ratios = ta[idx].sum(axis=1) / tb[idx].sum(axis=1)
    lo, hi = np.quantile((ratios - 1.0) * 100.0, [(1 - level) / 2, (1 + level) / 2])
    return Interval(point, float(lo), float(hi), level)


def drift(step_ms: Sequence[float], window: int = 50) -> list[float]:
    """Mean step time of each run of ``window`` consecutive steps (a trailing partial window is dropped), in float64.

    Example:
        >>> drift([1.0, 3.0, 2.0, 2.0, 9.0], window=2)
        [2.0, 2.0]
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an int >= 1, got {window!r}.")
    if len(step_ms) < window:
        raise ValueError(f"step_ms has {len(step_ms)} steps, fewer than one window of {window}: pass more steps "
                         f"or a smaller window.")
    n = len(step_ms) // window * window
    return [float(m) for m in np.asarray(step_ms[:n], dtype=float).reshape(-1, window).mean(axis=1)]


def _short(name: str, width: int) -> str:
    """``name`` cut to ``width`` characters, the last one an ellipsis when it was longer (tables, figure labels)."""
    return name if len(name) <= width else name[:width - 1] + "…"
