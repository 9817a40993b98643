"""Comparing training configurations in rounds run in a seeded random order, with bootstrap intervals.

:func:`compare` times every configuration once per round, in an order shuffled anew each
round, and keeps every timed step of every round. :class:`Comparison` turns that into
overheads against the baseline (the first configuration) with paired bootstrap intervals
over rounds (:meth:`Comparison.overhead`), a verdict, a table, a chart and JSON.

Run ``python -m mentor.bench`` to reproduce the article's comparison (no metrics, naive,
optimized) on your GPU; ``--help`` lists the options.

Example:
    >>> base = Result("none", "", [[10.0, 10.0], [12.0, 12.0], [11.0, 11.0]])
    >>> slow = Result("metrics", "", [[11.0, 11.0], [13.2, 13.2], [12.1, 12.1]])
    >>> cmp = Comparison([base, slow], baseline="none", batch_size=4)
    >>> print(cmp.overhead("metrics"))
    +10.0 % [10.0, 10.0]
    >>> cmp.verdict("metrics")
    'slower'
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from numbers import Real
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mentor.env import Profile, environment_report, get_profile
from mentor.metrics import ARTICLE_SETS, METRIC_SETS, metric_set
from mentor.train import ReportHook, Setup, StepHook, build_setup, train

Hooks = tuple[StepHook | None, ReportHook | None]

KINDS = ("median", "throughput")
"""What :meth:`Comparison.overhead` can compare: the median step time, or the total time of all timed steps."""

RESAMPLES = 4000
"""Bootstrap resamples per interval."""

NAME_WIDTH = 22
"""Configuration names longer than this are truncated in :meth:`Comparison.table`."""

TABLE_WIDTH = 80
"""The widest line of :meth:`Comparison.table`: it fits a book page at desktop width without scrolling."""

NOT_COUNTED = "not counted"
CPU_NOTE = "n/a (CPU)"


@dataclass
class Config:
    """A named way of running the training loop: ``make()`` returns fresh ``(on_step, on_report)`` hooks.

    Example:
        >>> Config("no metrics").make()
        (None, None)
    """

    name: str
    make: Callable[[], Hooks] = lambda: (None, None)
    description: str = ""
    batches: Iterable | None = None
    """Data for this configuration only; ``None`` uses the batches given to :func:`compare`."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Config name must be a non-empty string, got {self.name!r}.")
        if not callable(self.make):
            raise TypeError(f"Config.make must be a function returning (on_step, on_report), not {self.make!r}.")


def metrics_config(variant: str, num_classes: int, device: torch.device | str, name: str | None = None,
                   **options: Any) -> Config:
    """A :class:`Config` that updates one of ``mentor.metrics.METRIC_SETS`` every step and reports periodically.

    ``options`` (``compute_groups``, ``forward``) go to :func:`mentor.metrics.metric_set`.

    Example:
        >>> cfg = metrics_config("naive", num_classes=10, device="cpu")
        >>> on_step, on_report = cfg.make()
        >>> callable(on_step), callable(on_report)
        (True, True)
    """
    if variant not in METRIC_SETS:
        raise ValueError(f"Unknown metric set {variant!r}: pass one of {list(METRIC_SETS)}.")
    unknown = set(options) - {"compute_groups", "forward"}
    if unknown:
        raise TypeError(f"metrics_config got unknown option(s) {sorted(unknown)}; it takes compute_groups and forward.")
    metric_set(variant, num_classes=2, **options)  # check the options now, not in the first run

    def make() -> Hooks:
        ms = metric_set(variant, num_classes=num_classes, device=device, **options)
        return (lambda s: ms.update(s.loss, s.output, s.labels)), ms.report

    return Config(name or variant, make, METRIC_SETS[variant])


def suite_config(num_classes: int, device: torch.device | str, name: str = "fused suite") -> Config:
    """A :class:`Config` that updates one :class:`mentor.suite.FusedMetrics` every step and, at each report,
    computes every value, reads them back in one copy and resets.

    Example:
        >>> on_step, on_report = suite_config(10, "cpu").make()
        >>> callable(on_step), callable(on_report)
        (True, True)
    """
    from mentor.suite import FusedMetrics

    def make() -> Hooks:
        suite = FusedMetrics(num_classes).to(device)

        def on_report(_: int) -> None:
            torch.stack(list(suite.compute().values())).tolist()  # one read-back for the whole report
            suite.reset()

        return (lambda s: suite.update(s.loss, s.output, s.labels)), on_report

    return Config(name, make, "mentor.suite.FusedMetrics: the loss mean and every score in one update per step")


def report_positions(warmup: int, steps: int, report_every: int) -> list[int]:
    """0-based positions, among a run's ``steps`` timed steps, of the steps that call ``on_report``.

    :func:`mentor.train.train` reports after global step ``i`` when ``(i + 1) % report_every == 0``,
    inside the timed step; the timed steps are global steps ``warmup .. warmup + steps - 1``.

    Example:
        >>> report_positions(warmup=1, steps=4, report_every=2)
        [0, 2]
        >>> report_positions(warmup=10, steps=60, report_every=50), report_positions(0, 5, 0)
        ([39], [])
    """
    for label, value, low in (("warmup", warmup, 0), ("steps", steps, 1), ("report_every", report_every, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{label} must be an int >= {low}, got {value!r}.")
    if not report_every:
        return []
    return [i - warmup for i in range(warmup, warmup + steps) if (i + 1) % report_every == 0]


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
        """``+7.0 % [6.1, 8.0]`` with ``digits`` decimals; the point always carries its sign."""
        if isinstance(digits, bool) or not isinstance(digits, int) or digits < 0:
            raise ValueError(f"digits must be an int >= 0, got {digits!r}.")
        point = f"{self.point:+.{digits}f} %"
        if not self.has_interval:
            return f"{point} [one round: no interval]"
        return f"{point} [{self.lo:.{digits}f}, {self.hi:.{digits}f}]"

    def __str__(self) -> str:
        return self.fmt(1)


def _check_count_or_none(owner: str, label: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{owner}: {label} must be a number >= 0 or None (not counted), got {value!r}.")


@dataclass
class Result:
    """Timings of one configuration: every timed step of every round, in milliseconds.

    ``report_steps`` are the positions within a round whose step also ran ``on_report``
    (see :func:`report_positions`). ``syncs_per_step`` and ``report_syncs`` (syncs of one
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


def _short(name: str, width: int) -> str:
    return name if len(name) <= width else name[:width - 1] + "…"


@dataclass
class Comparison:
    """The results of :func:`compare`: overheads with bootstrap intervals, a table, a chart and JSON.

    ``settings`` holds how the runs were made, including ``seed`` and ``orders`` (the order
    the configurations ran in, round by round).
    """

    results: list[Result]
    baseline: str
    batch_size: int
    settings: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.results or not all(isinstance(r, Result) for r in self.results):
            raise TypeError("Comparison.results must be a non-empty list of mentor.bench.Result.")
        names = [r.name for r in self.results]
        if len(set(names)) != len(names):
            raise ValueError(f"Comparison result names must be unique, got {names}.")
        if self.baseline not in names:
            raise KeyError(f"baseline {self.baseline!r} is not among the results {names}; pass one of them.")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1 (images per step), got {self.batch_size!r}.")
        counts = {r.name: r.rounds for r in self.results}
        if len(set(counts.values())) != 1:
            raise ValueError(f"every result needs the same number of rounds (the bootstrap pairs rounds), "
                             f"got {counts}.")
        seed = self.settings.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"settings['seed'] must be an int, got {seed!r}.")

    @property
    def rounds(self) -> int:
        """Number of rounds (the same for every configuration)."""
        return self.results[0].rounds

    @property
    def seed(self) -> int:
        """The seed of the run order, also used for the bootstrap (0 when not recorded)."""
        return int(self.settings.get("seed", 0))

    def __getitem__(self, name: str) -> Result:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(f"no configuration {name!r}; have {[r.name for r in self.results]}")

    def ratio(self, name: str) -> float:
        """Median step time of ``name`` over the baseline's (pooled over rounds)."""
        return self[name].median_ms / self[self.baseline].median_ms

    def overhead(self, name: str, kind: str = "median", level: float = 0.95, against: str | None = None) -> Interval:
        """Overhead of ``name`` over the baseline in percent, ``(ratio - 1) * 100``, with a bootstrap interval.

        ``against`` names another configuration of the same rounds to compare with instead of
        the baseline (for example the float weight against the plain update).

        ``kind="median"``: ratio of the median step times, each pooled over all rounds.
        ``kind="throughput"``: ratio of the total times of all timed steps, report steps
        included, i.e. the loss of throughput.

        The interval is a paired percentile bootstrap over rounds: :data:`RESAMPLES` times,
        draw as many round indices as there are rounds, with replacement, take the same
        rounds of ``name`` and of the baseline (they ran interleaved, so a round's drift
        hits both) and recompute the statistic from those rounds' steps; ``lo`` and ``hi``
        are the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles. The draws come from
        ``numpy.random.default_rng(settings["seed"])``, so the interval is reproducible.

        What it means and its limit: the interval says how much the estimate moves when
        the rounds of this one session are redrawn. It captures round-to-round drift on
        one machine in one process, not the variation between processes, machines or
        driver versions. With few rounds (5) the bootstrap is coarse (only so many distinct
        resamples) and tends to be too narrow. With one round there is no interval: ``lo``
        and ``hi`` are NaN.

        Example:
            >>> cmp = Comparison([Result("a", "", [[10.0], [20.0]]), Result("b", "", [[11.0], [22.0]])], "a", 1)
            >>> cmp.overhead("b").fmt(3), cmp.overhead("a").fmt(3)
            ('+10.000 % [10.000, 10.000]', '+0.000 % [0.000, 0.000]')
        """
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}: pass one of {list(KINDS)}.")
        if isinstance(level, bool) or not isinstance(level, Real) or not 0 < level < 1:
            raise ValueError(f"level must be a number between 0 and 1 (0.95 for 95 %), got {level!r}.")
        base = self.baseline if against is None else self[against].name
        a, b = self[name].round_step_ms, self[base].round_step_ms
        if kind == "median":
            point = statistics.median(self[name].step_ms) / statistics.median(self[base].step_ms)
        else:
            point = math.fsum(self[name].total_ms) / math.fsum(self[base].total_ms)
        point = (point - 1.0) * 100.0
        if len(a) < 2:
            return Interval(point, math.nan, math.nan, level)
        rng = np.random.default_rng(self.seed)
        idx = rng.integers(0, len(a), size=(RESAMPLES, len(a)))
        if kind == "median":
            ratios = _pooled_medians(a, idx) / _pooled_medians(b, idx)
        else:
            ta, tb = np.asarray(self[name].total_ms), np.asarray(self[base].total_ms)
            ratios = ta[idx].sum(axis=1) / tb[idx].sum(axis=1)
        lo, hi = np.quantile((ratios - 1.0) * 100.0, [(1 - level) / 2, (1 + level) / 2])
        return Interval(point, float(lo), float(hi), level)

    def verdict(self, name: str, kind: str = "median", against: str | None = None) -> str:
        """``"slower"`` when the interval lies above 0, ``"faster"`` below, ``"no difference resolved"`` otherwise.

        ``"baseline"`` for the baseline, ``"no interval (1 round)"`` with one round.

        Example:
            >>> cmp = Comparison([Result("a", "", [[10.0], [20.0]]), Result("b", "", [[9.0], [18.0]])], "a", 1)
            >>> cmp.verdict("a"), cmp.verdict("b")
            ('baseline', 'faster')
        """
        return self._judge(name, self.overhead(name, kind, against=against), against)

    def _judge(self, name: str, interval: Interval, against: str | None = None) -> str:
        if name == (self.baseline if against is None else against):
            return "baseline"
        if not interval.has_interval:
            return "no interval (1 round)"
        if interval.lo > 0:
            return "slower"
        if interval.hi < 0:
            return "faster"
        return "no difference resolved"

    def images_per_s(self, name: str) -> float:
        """Images per second over all timed steps, report steps included: batch x steps / total time."""
        r = self[name]
        return self.batch_size * len(r.step_ms) / (math.fsum(r.total_ms) / 1000.0)

    def report_ms(self, name: str) -> float | None:
        """Median time of the steps that ran ``on_report`` (``None`` when no step did)."""
        times = self[name].report_step_ms
        return statistics.median(times) if times else None

    def facts(self, name: str) -> dict[str, Any]:
        """The numbers the book's prose quotes about ``name`` (for ``glue``): formatted intervals, plain numbers.

        ``overhead`` and ``tput_overhead`` are ``str(Interval)``; ``syncs`` and ``report_syncs``
        are NaN when not counted, so that number formats still apply (``syncs_note`` says why).

        Example:
            >>> cmp = Comparison([Result("a", "", [[10.0], [20.0]]), Result("b", "", [[11.0], [22.0]])], "a", 4)
            >>> f = cmp.facts("b")
            >>> f["overhead"], f["verdict"], f["median_ms"], round(f["images_per_s"], 1)
            ('+10.0 % [10.0, 10.0]', 'slower', 16.5, 242.4)
        """
        r = self[name]
        median, tput = self.overhead(name, "median"), self.overhead(name, "throughput")
        report = self.report_ms(name)
        return {
            "median_ms": r.median_ms, "images_per_s": self.images_per_s(name),
            "overhead": str(median), "tput_overhead": str(tput),
            "verdict": self._judge(name, median), "tput_verdict": self._judge(name, tput),
            "report_ms": math.nan if report is None else report,
            "syncs": math.nan if r.syncs_per_step is None else r.syncs_per_step,
            "report_syncs": math.nan if r.report_syncs is None else r.report_syncs,
            "syncs_note": r.syncs_note or "",
        }

    def rows(self) -> list[dict[str, Any]]:
        """One dict per configuration with every value of :meth:`table` as numbers (``None`` when undefined)."""
        out = []
        for r in self.results:
            row: dict[str, Any] = {"config": r.name, "description": r.description, "median_ms": r.median_ms,
                                   "ratio": self.ratio(r.name)}
            verdicts = {}
            for kind, prefix in (("median", "overhead"), ("throughput", "throughput_overhead")):
                iv = self.overhead(r.name, kind)
                row[f"{prefix}_pct"] = iv.point
                row[f"{prefix}_lo"] = iv.lo if iv.has_interval else None
                row[f"{prefix}_hi"] = iv.hi if iv.has_interval else None
                verdicts[kind] = self._judge(r.name, iv)
            row.update({
                "images_per_s": self.images_per_s(r.name), "total_ms": math.fsum(r.total_ms),
                "report_ms": self.report_ms(r.name), "syncs_per_step": r.syncs_per_step,
                "report_syncs": r.report_syncs, "syncs_note": r.syncs_note,
                "verdict": verdicts["median"], "throughput_verdict": verdicts["throughput"],
            })
            out.append(row)
        return out

    def table(self) -> str:
        """A plain-text table, at most 80 characters wide: one row per configuration, then a legend.

        Columns: configuration (truncated to fit, at most 22 characters), median step time,
        the overhead of the median step time and of the total time (report steps included),
        each in % with its interval, syncs per step and syncs of one report call. Images per
        second and verdicts are in :meth:`rows` and :meth:`facts`.

        Example:
            >>> cmp = Comparison([Result("base", "", [[10.0], [20.0]]), Result("cfg", "", [[11.0], [22.0]])], "base", 8)
            >>> print(cmp.table().splitlines()[4])
            cfg      16.50  +10.0 [10.0, 10.0]  +10.0 [10.0, 10.0]      -      -
        """
        body = []
        for r in self.results:
            cells: list[str | None] = [r.name, f"{r.median_ms:.2f}"]
            for kind in KINDS:
                iv = self.overhead(r.name, kind)
                cells.append(f"{iv.point:+.1f} [{iv.lo:.1f}, {iv.hi:.1f}]" if iv.has_interval else f"{iv.point:+.1f}")
            if r.syncs_per_step is None and r.syncs_note:  # the note spans both sync columns
                cells += [r.syncs_note, None]
            else:
                cells += ["-" if r.syncs_per_step is None else f"{r.syncs_per_step:g}",
                          "-" if r.report_syncs is None else f"{r.report_syncs:g}"]
            body.append(cells)
        head = [("config", ""), ("median", "ms"), ("overhead %", "median step"), ("overhead %", "total time"),
                ("syncs", "/step"), ("syncs", "/rep")]
        gap = [0, 2, 2, 2, 2, 2]  # spaces before each column
        right = {1, 4, 5}
        widths = [max([len(h1), len(h2)] + [len(c[i] or "") for c in body if c[5] is not None or i != 4])
                  for i, (h1, h2) in enumerate(head)]
        span = max([widths[4] + gap[5] + widths[5]] + [len(c[4] or "") for c in body if c[5] is None])
        widths[5] = span - widths[4] - gap[5]
        rest = sum(widths[1:]) + sum(gap)
        widths[0] = max(len("config"), min(NAME_WIDTH, max(len(c[0] or "") for c in body), TABLE_WIDTH - rest))
        for c in body:
            c[0] = _short(c[0] or "", widths[0])

        def line(cells: Sequence[str | None]) -> str:
            out = ""
            for i, cell in enumerate(cells):
                if cell is None:
                    continue
                if i == 4 and cells[5] is None:
                    text = cell.rjust(span)
                else:
                    text = cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
                out += " " * gap[i] + text
            return out.rstrip()

        lines = [line([h[0] for h in head]), line([h[1] for h in head])]
        lines.append("-" * max(len(s) for s in lines + [line(c) for c in body]))
        lines += [line(c) for c in body]
        n = self.rounds
        lines.append(f"overhead vs {_short(self.baseline, 20)} [95 % bootstrap interval, {n} rounds]"
                     if n > 1 else f"overhead vs {_short(self.baseline, 20)}, one round: no interval")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Everything, JSON-ready: settings (seed, orders), every step of every round, and :meth:`rows`."""
        results = []
        for r in self.results:
            d = asdict(r)
            d.update(round_medians_ms=r.round_medians_ms, total_ms=r.total_ms, step_ms=r.step_ms)
            results.append(d)
        return {"baseline": self.baseline, "batch_size": self.batch_size, "settings": self.settings,
                "environment": self.environment, "rows": self.rows(), "results": results}

    def save_json(self, path: str | Path) -> Path:
        """Write :meth:`to_dict` to ``path``; :meth:`load_json` reads it back."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

    @classmethod
    def load_json(cls, path: str | Path) -> Comparison:
        """Rebuild a :class:`Comparison` from a file written by :meth:`save_json`.

        Example:
            >>> import os, tempfile
            >>> cmp = Comparison([Result("a", "", [[10.0], [20.0]]), Result("b", "", [[11.0], [22.0]])], "a", 1)
            >>> path = cmp.save_json(os.path.join(tempfile.mkdtemp(), "cmp.json"))
            >>> str(Comparison.load_json(path).overhead("b"))
            '+10.0 % [10.0, 10.0]'
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no comparison file at {path}; write one with Comparison.save_json(path).")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not JSON ({err}); pass a file written by Comparison.save_json.") from None
        missing = [k for k in ("baseline", "batch_size", "results") if not isinstance(data, dict) or k not in data]
        if missing:
            raise ValueError(f"{path} lacks {missing}; pass a file written by Comparison.save_json.")
        names = {f.name for f in fields(Result)}
        results = []
        for d in data["results"]:
            if "round_step_ms" not in d:
                raise ValueError(f"{path}: result {d.get('name')!r} has no round_step_ms; it was saved by an older "
                                 "mentor.bench; re-run the comparison.")
            results.append(Result(**{k: v for k, v in d.items() if k in names}))
        return cls(results, baseline=data["baseline"], batch_size=data["batch_size"],
                   settings=data.get("settings", {}), environment=data.get("environment", {}))

    def plot(self, ax: Any = None, kind: str = "median") -> Any:
        """Horizontal bars of each configuration's overhead over the baseline, with its interval; returns the Axes.

        The baseline gets no bar (its overhead is 0 by definition: the vertical line). Syncs per
        step are written next to each bar when they were counted.
        """
        import matplotlib.pyplot as plt

        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}: pass one of {list(KINDS)}.")
        others = [r for r in self.results if r.name != self.baseline]
        if ax is None:
            _, ax = plt.subplots(figsize=(5.6, 1.5 + 0.5 * max(1, len(others))), layout="constrained")
        colors = {"slower": "#d62728", "faster": "#2ca02c"}
        intervals = [self.overhead(r.name, kind) for r in others]
        points = [iv.point for iv in intervals]
        err = [[max(0.0, iv.point - iv.lo) if iv.has_interval else 0.0 for iv in intervals],
               [max(0.0, iv.hi - iv.point) if iv.has_interval else 0.0 for iv in intervals]]
        y = list(range(len(others)))
        ax.barh(y, points, xerr=err, capsize=4, height=0.6, error_kw={"linewidth": 1.2},
                color=[colors.get(self.verdict(r.name, kind), "#7f7f7f") for r in others])
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_yticks(y, [_short(r.name, 24) for r in others], fontsize=12)
        ax.invert_yaxis()
        ax.tick_params(axis="x", labelsize=11)
        reach = [max(abs(p), abs(iv.hi) if iv.has_interval else 0, abs(iv.lo) if iv.has_interval else 0)
                 for p, iv in zip(points, intervals)] or [1.0]
        pad = 0.03 * (max(reach) or 1.0)
        for yi, r, iv in zip(y, others, intervals):
            if r.syncs_per_step is None:
                continue
            end = max(iv.point, iv.hi) if iv.has_interval else iv.point
            ax.text(max(end, 0.0) + pad, yi, f"{r.syncs_per_step:g} syncs/step", va="center", fontsize=11)
        if any(r.syncs_per_step is not None for r in others):
            ax.set_xlim(right=ax.get_xlim()[1] + 0.5 * (max(reach) or 1.0))
        what = "median step time" if kind == "median" else "total time, reports included"
        level = (f"bars: 95 % interval over {self.rounds} rounds" if self.rounds > 1 else "one round: no interval")
        ax.set_xlabel(f"overhead of the {what} (%)\nvs {_short(self.baseline, 22)}; {level}", fontsize=12)
        return ax

    def figure(self, kind: str = "throughput") -> Any:
        """:meth:`plot` in a figure of its own, sized for a book page, detached from pyplot.

        The figure is closed in pyplot, so that a notebook shows it only where it is
        glued or displayed, not a second time at the end of the cell.

        Example:
            >>> cmp = Comparison([Result("a", "", [[10.0], [20.0]]), Result("b", "", [[11.0], [22.0]])], "a", 1)
            >>> cmp.figure().axes[0].get_yticklabels()[0].get_text()
            'b'
        """
        import matplotlib.pyplot as plt

        ax = self.plot(kind=kind)
        plt.close(ax.figure)
        return ax.figure


def _is_cuda(setup: Setup) -> bool:
    """Whether the setup trains on a CUDA device (syncs can only be counted there)."""
    return setup.device.type == "cuda"


def _syncs_per_step(setup: Setup, batches: Iterable, make: Callable[[], Hooks],
                    steps: int) -> tuple[float, int | None]:
    """Syncs per training step with fresh hooks, then syncs of one ``on_report`` call (``None`` without one)."""
    from mentor.profiling import sync_guard

    on_step, on_report = make()
    train(setup, batches, steps=2, on_step=on_step)  # first updates allocate state: not counted
    with sync_guard() as report:
        train(setup, batches, steps=steps, on_step=on_step)
    per_step = report.count / steps
    if on_report is None:
        return per_step, None
    with sync_guard() as report:
        on_report(2 + steps)
    return per_step, report.count


def compare(
    configs: Sequence[Config],
    setup: Setup,
    batches: Iterable,
    *,
    steps: int,
    warmup: int,
    rounds: int,
    report_every: int = 0,
    count_syncs: bool = True,
    sync_steps: int = 5,
    progress: bool = True,
    seed: int = 0,
) -> Comparison:
    """Time each configuration once per round, in an order shuffled anew every round, on one model.

    Each round runs the configurations in ``random.Random(seed)``'s next shuffle of the
    list (``order = list(configs); rng.shuffle(order)``), so that no configuration always
    runs first or after the same neighbour; ``settings["orders"]`` records the orders.
    Each run does ``warmup`` untimed then ``steps`` timed steps with fresh hooks; with
    ``report_every`` the step that calls ``on_report`` is timed with its report. The first
    configuration is the baseline of :meth:`Comparison.overhead`. Syncs per step, and the
    syncs of one report call, are counted in a separate, untimed pass under
    :func:`mentor.profiling.sync_guard` (CUDA only; ``count_syncs=False`` skips it).

    Example:
        >>> from mentor.data import device_batches
        >>> setup = build_setup(num_classes=10)
        >>> cmp = compare([Config("none"), Config("again")], setup, device_batches(2, 32, 10), steps=2,
        ...               warmup=1, rounds=2, progress=False, seed=4)
        >>> cmp.settings["orders"], cmp["none"].syncs_note
        ([['again', 'none'], ['none', 'again']], 'n/a (CPU)')
    """
    if not configs or not all(isinstance(c, Config) for c in configs):
        raise TypeError("configs must be a non-empty sequence of mentor.bench.Config.")
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise ValueError(f"configuration names must be unique, got {names}.")
    for label, value, low in (("steps", steps, 1), ("warmup", warmup, 0), ("rounds", rounds, 1),
                              ("sync_steps", sync_steps, 1), ("report_every", report_every, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{label} must be an int >= {low}, got {value!r}.")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int (it seeds random.Random for the run order), got {seed!r}.")
    rng = random.Random(seed)
    per_round: dict[str, list[list[float]]] = {c.name: [] for c in configs}
    reports: dict[str, list[int]] = {}
    orders: list[list[str]] = []
    for k in range(rounds):
        started = time.perf_counter()
        order = list(configs)
        rng.shuffle(order)
        orders.append([c.name for c in order])
        for c in order:
            on_step, on_report = c.make()
            every = report_every if on_report is not None else 0
            stats = train(setup, c.batches if c.batches is not None else batches, steps=steps, warmup=warmup,
                          on_step=on_step, on_report=on_report if every else None, report_every=every)
            per_round[c.name].append(list(stats.step_ms))
            reports[c.name] = report_positions(warmup, steps, every)
        if progress:
            print(f"round {k + 1}/{rounds}: {len(order)} runs in {time.perf_counter() - started:.1f} s", flush=True)
    cuda = _is_cuda(setup)
    results = []
    for c in configs:
        syncs: float | None = None
        report_syncs: int | None = None
        note: str | None = None
        if not count_syncs:
            note = NOT_COUNTED
        elif not cuda:
            note = CPU_NOTE
        else:
            syncs, report_syncs = _syncs_per_step(setup, c.batches if c.batches is not None else batches, c.make,
                                                  sync_steps)
        results.append(Result(c.name, c.description, per_round[c.name], reports[c.name], syncs, report_syncs, note))
    images, _ = next(iter(batches))
    settings = dict(steps=steps, warmup=warmup, rounds=rounds, report_every=report_every, sync_steps=sync_steps,
                    seed=seed, orders=orders)
    return Comparison(results, baseline=configs[0].name, batch_size=int(images.shape[0]), settings=settings,
                      environment=environment_report())


def step_time_config(name: str, device: str, update: str, sync_on_compute: bool = True) -> Config:
    """A :class:`Config` that averages the host-measured step time in a ``MeanMetric`` on ``device``.

    ``update`` is ``"float"`` (``metric.update(seconds)``) or ``"tensor"`` (a 0-dim CPU tensor,
    :func:`mentor.metrics.host_scalar`).

    Example:
        >>> step_time_config("cpu", "cpu", "float").make()[0] is not None
        True
    """
    from torchmetrics import MeanMetric

    from mentor.metrics import host_scalar

    if update not in ("float", "tensor"):
        raise ValueError(f"update must be 'float' or 'tensor', got {update!r}.")

    def make() -> Hooks:
        metric = MeanMetric(sync_on_compute=sync_on_compute).to(device)
        convert = host_scalar if update == "tensor" else float

        def on_step(step: Any) -> None:
            metric.update(convert(step.host_seconds))

        def on_report(_: int) -> None:
            metric.compute()
            metric.reset()

        return on_step, on_report

    where = "GPU" if str(device).startswith("cuda") else "CPU"
    return Config(name, make, f"MeanMetric of the step time on the {where}, updated with a {update}")


def catalogue(profile: Profile) -> dict[str, Config]:
    """Every configuration part I of the book measures, by name; its chapters pick from it and its summary runs
    them all.

    Example:
        >>> from mentor.env import get_profile
        >>> list(catalogue(get_profile("smoke")))[:3]
        ['no metrics', 'naive', 'float weight']
    """
    device = profile.device
    configs = [Config("no metrics", description="the training step alone")]
    configs += [metrics_config(v, profile.num_classes, device) for v in ARTICLE_SETS]
    configs += [
        step_time_config("step time: CPU", "cpu", "float"),
        step_time_config("step time: GPU float", str(device), "float"),
        step_time_config("step time: GPU tensor", str(device), "tensor"),
    ]
    return {c.name: c for c in configs}


DEFAULT_CONFIGS = ("no metrics", "naive", "optimized")
"""The article's comparison, and what ``python -m mentor.bench`` runs without ``--configs``."""


def article_configs(profile: Profile) -> list[Config]:
    """The article's comparison (``DEFAULT_CONFIGS``): no metrics, the naive set and the optimized set.

    Example:
        >>> from mentor.env import get_profile
        >>> [c.name for c in article_configs(get_profile("smoke"))]
        ['no metrics', 'naive', 'optimized']
    """
    cat = catalogue(profile)
    return [cat[name] for name in DEFAULT_CONFIGS]


def available_configs(profile: Profile) -> dict[str, Config]:
    """What ``python -m mentor.bench --configs`` can run: :func:`catalogue`, the macro sets and the fused suite.

    Example:
        >>> from mentor.env import get_profile
        >>> list(available_configs(get_profile("smoke")))[-3:]
        ['macro', 'macro sync-free', 'fused suite']
    """
    extra = [metrics_config(v, profile.num_classes, profile.device) for v in METRIC_SETS if v not in ARTICLE_SETS]
    extra.append(suite_config(profile.num_classes, profile.device))
    return {**catalogue(profile), **{c.name: c for c in extra}}


SWEEP_CONFIGS = ("no metrics", "naive", "optimized", "macro", "macro sync-free", "fused suite")
"""The configurations part II compares at every operating point."""


@dataclass(frozen=True)
class OperatingPoint:
    """One training regime: batch size, image size, precision and memory format of the ResNet-18 step.

    Example:
        >>> OperatingPoint("bf16 b32", 32, precision="bf16", channels_last=True).label
        'bf16 b32: batch 32, 224 px, bf16, channels-last'
    """

    name: str
    batch_size: int
    image_size: int = 224
    precision: str = "fp32"
    channels_last: bool = False

    def __post_init__(self) -> None:
        for label in ("batch_size", "image_size"):
            value = getattr(self, label)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"OperatingPoint.{label} must be an int >= 1, got {value!r}.")
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(f"OperatingPoint.precision must be 'fp32' or 'bf16', got {self.precision!r}.")

    @property
    def label(self) -> str:
        """The name and every setting, for tables and legends."""
        layout = ", channels-last" if self.channels_last else ""
        return f"{self.name}: batch {self.batch_size}, {self.image_size} px, {self.precision}{layout}"


OPERATING_POINTS = (
    OperatingPoint("fp32 b128", 128),
    OperatingPoint("fp32 b64", 64),
    OperatingPoint("fp32 b32", 32),
    OperatingPoint("bf16 b128", 128, precision="bf16", channels_last=True),
    OperatingPoint("bf16 b32", 32, precision="bf16", channels_last=True),
    OperatingPoint("bf16 b32 96px", 32, 96, precision="bf16", channels_last=True),
)
"""Part II's operating points: the article's step, then shorter ones (smaller batches, bf16 with channels-last,
smaller images)."""


def operating_points(profile: Profile) -> tuple[OperatingPoint, ...]:
    """``OPERATING_POINTS`` on a CUDA profile; on the CPU smoke profile the same points shrunk to its sizes
    (batch at most the profile's, the profile's image size), so that the code runs in seconds.

    Example:
        >>> from mentor.env import get_profile
        >>> [(p.batch_size, p.image_size) for p in operating_points(get_profile("smoke"))][:2]
        [(8, 32), (8, 32)]
    """
    if profile.is_cuda:
        return OPERATING_POINTS
    return tuple(OperatingPoint(p.name, min(p.batch_size, profile.batch_size), profile.image_size, p.precision,
                                p.channels_last) for p in OPERATING_POINTS)


def sweep(points: Sequence[OperatingPoint], profile: Profile, configs: Sequence[str] = SWEEP_CONFIGS, *,
          steps: int, warmup: int, rounds: int, seed: int = 0, progress: bool = True) -> dict[str, Comparison]:
    """One :func:`compare` of ``configs`` (names from :func:`available_configs`) at each operating point.

    Each point gets its own model, built with the point's precision and memory format, and its
    own data; the first configuration is every comparison's baseline. Returns the comparisons by
    point name, in the order of ``points``.

    Example:
        >>> from mentor.env import get_profile
        >>> p = get_profile("smoke")
        >>> out = sweep(operating_points(p)[:1], p, ["no metrics", "fused suite"], steps=1, warmup=0, rounds=1,
        ...             progress=False)
        >>> list(out), out["fp32 b128"].batch_size
        (['fp32 b128'], 8)
    """
    from mentor.data import device_batches

    if not points or not all(isinstance(p, OperatingPoint) for p in points):
        raise TypeError("points must be a non-empty sequence of mentor.bench.OperatingPoint, e.g. OPERATING_POINTS.")
    available = available_configs(profile)
    unknown = [name for name in configs if name not in available]
    if unknown:
        raise ValueError(f"unknown configuration(s) {unknown}: pass names from available_configs(), "
                         f"e.g. {list(SWEEP_CONFIGS)}.")
    out: dict[str, Comparison] = {}
    for point in points:
        if progress:
            print(point.label, flush=True)
        setup = build_setup(profile.num_classes, profile.device, precision=point.precision,
                            channels_last=point.channels_last)
        batches = device_batches(point.batch_size, point.image_size, profile.num_classes, profile.device)
        out[point.name] = compare([available[name] for name in configs], setup, batches, steps=steps, warmup=warmup,
                                  rounds=rounds, report_every=profile.report_every, seed=seed, progress=False)
        out[point.name].settings["point"] = asdict(point)
    return out


def record_point(point: OperatingPoint, profile: Profile, config: str, trace_path: str | Path, *,
                 active: int = 5, range_name: str = "metrics update") -> Path:
    """Profile ``active`` training steps of ``config`` at ``point``, each metric update inside a
    ``record_function(range_name)``, and write the trace (see :func:`mentor.trace.host_time`).

    Example:
        >>> import tempfile, os
        >>> from mentor.env import get_profile
        >>> from mentor.trace import host_time, load_trace
        >>> p = get_profile("smoke").with_(num_classes=10)
        >>> path = record_point(OperatingPoint("tiny", 2, 32), p, "fused suite",
        ...                     os.path.join(tempfile.mkdtemp(), "t.json.gz"), active=2)
        >>> host_time(load_trace(path), "metrics update").ranges
        2
    """
    from mentor.data import device_batches
    from mentor.profiling import record_steps

    available = available_configs(profile)
    if config not in available:
        raise ValueError(f"unknown configuration {config!r}: pass a name from available_configs(), "
                         f"e.g. {list(SWEEP_CONFIGS)}.")
    on_step, _ = available[config].make()
    if on_step is None:
        raise ValueError(f"{config!r} updates no metric: pick a configuration with metrics.")
    setup = build_setup(profile.num_classes, profile.device, precision=point.precision,
                        channels_last=point.channels_last)
    batches = device_batches(point.batch_size, point.image_size, profile.num_classes, profile.device)

    def ranged(step: Any) -> None:
        with torch.profiler.record_function(range_name):
            on_step(step)

    return record_steps(setup, batches, trace_path, ranged, warmup=2, active=active)


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)


def save_sweep(results: dict[str, Comparison], folder: str | Path) -> list[Path]:
    """Write each comparison of :func:`sweep` to ``folder/NN_<point>.json``; :func:`load_sweep` reads them back.

    Example:
        >>> import tempfile
        >>> cmp = Comparison([Result("a", "", [[10.0]]), Result("b", "", [[11.0]])], "a", 1)
        >>> [p.name for p in save_sweep({"fp32 b128": cmp}, tempfile.mkdtemp())]
        ['00_fp32_b128.json']
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("[0-9][0-9]_*.json"):
        old.unlink()
    return [cmp.save_json(folder / f"{k:02d}_{_slug(name)}.json") for k, (name, cmp) in enumerate(results.items())]


def load_sweep(folder: str | Path) -> dict[str, Comparison]:
    """The comparisons that :func:`save_sweep` wrote, by point name, in their order.

    Example:
        >>> import tempfile
        >>> cmp = Comparison([Result("a", "", [[10.0]]), Result("b", "", [[11.0]])], "a", 1,
        ...                  settings={"point": {"name": "fp32 b128"}})
        >>> folder = tempfile.mkdtemp(); _ = save_sweep({"fp32 b128": cmp}, folder)
        >>> list(load_sweep(folder))
        ['fp32 b128']
    """
    paths = sorted(Path(folder).glob("[0-9][0-9]_*.json"))
    if not paths:
        raise FileNotFoundError(f"no sweep files (NN_<point>.json) in {folder}; write them with save_sweep().")
    out = {}
    for path in paths:
        cmp = Comparison.load_json(path)
        name = cmp.settings.get("point", {}).get("name", path.stem[3:])
        out[name] = cmp
    return out


def sweep_table(results: dict[str, Comparison], kind: str = "throughput") -> str:
    """Baseline step time and each configuration's overhead with its interval, one line per point.

    Example:
        >>> base = Result("none", "", [[10.0], [12.0]]); slow = Result("m", "", [[11.0], [13.2]])
        >>> print(sweep_table({"p": Comparison([base, slow], "none", 4)}))
        point           base ms  m
        p                 11.00  +10.0 [10.0, 10.0]
    """
    if not results:
        raise ValueError("results is empty: pass the dict that sweep() returns.")
    first = next(iter(results.values()))
    names = [r.name for r in first.results if r.name != first.baseline]
    width = 20
    lines = [f"{'point':<14}{'base ms':>9}  " + "".join(f"{_short(n, width):<{width}}" for n in names).rstrip()]
    for point, cmp in results.items():
        cells = "".join(f"{str(cmp.overhead(n, kind=kind)).replace(' %', ''):<{width}}" for n in names)
        lines.append(f"{_short(point, 14):<14}{cmp[cmp.baseline].median_ms:>9.2f}  {cells}".rstrip())
    return "\n".join(lines)


def plot_sweep(results: dict[str, Comparison], kind: str = "throughput", ax: Any = None) -> Any:
    """Overhead (%) with its interval against the baseline's median step time, one line per configuration.

    The figure is closed in pyplot (glue or display it). Returns the figure.

    Example:
        >>> base = Result("none", "", [[10.0], [12.0]]); slow = Result("m", "", [[11.0], [13.2]])
        >>> fig = plot_sweep({"p": Comparison([base, slow], "none", 4)})
        >>> fig.axes[0].get_xlabel()
        'step time without metrics (ms, median)'
    """
    import matplotlib.pyplot as plt

    if not results:
        raise ValueError("results is empty: pass the dict that sweep() returns.")
    first = next(iter(results.values()))
    names = [r.name for r in first.results if r.name != first.baseline]
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
    points = list(results.items())
    base_ms = [cmp[cmp.baseline].median_ms for _, cmp in points]
    for k, name in enumerate(names):
        ivs = [cmp.overhead(name, kind=kind) for _, cmp in points]
        y = np.array([i.point for i in ivs])
        err = np.array([[i.point - i.lo for i in ivs], [i.hi - i.point for i in ivs]])
        ax.errorbar(np.array(base_ms) * (1 + 0.012 * (k - len(names) / 2)), y, yerr=err, marker="o", ms=4,
                    capsize=2, lw=1, label=name)
    ax.axhline(0, color="0.5", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("step time without metrics (ms, median)")
    ax.set_ylabel("overhead over no metrics (%)")
    for (point, _), x in zip(points, base_ms):
        ax.annotate(point, (x, 0), xytext=(0, -14), textcoords="offset points", ha="center", fontsize=7, color="0.3")
    ax.legend(fontsize=8, frameon=False)
    plt.close(ax.figure)
    return ax.figure


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m mentor.bench [--list] [--configs A,B] [--batch N] [--image-size PX]
    [--precision fp32|bf16] [--channels-last] [--profile full|smoke] [--steps N] [--warmup N] [--rounds N]
    [--seed S] [--json out.json]``."""
    parser = argparse.ArgumentParser(prog="python -m mentor.bench", description=(
        "Time ResNet-18 training steps under metric configurations (by default: no metrics, the article's "
        "naive TorchMetrics set and its optimized set), in rounds run in a seeded random order, and count "
        "syncs per step; overheads over the first configuration come with paired bootstrap intervals over "
        "rounds."))
    parser.add_argument("--list", action="store_true", help="list the configurations and exit")
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                        help="comma-separated configuration names, the first is the baseline "
                             f"(default: {','.join(DEFAULT_CONFIGS)})")
    parser.add_argument("--profile", choices=["full", "smoke"], default=None,
                        help="run profile (default: full with CUDA, smoke without)")
    parser.add_argument("--batch", type=int, help="images per step (default: the profile's)")
    parser.add_argument("--image-size", type=int, help="image height and width in pixels (default: the profile's)")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="fp32, or bf16 autocast around the forward pass and the loss (default: fp32)")
    parser.add_argument("--channels-last", action="store_true", help="channels-last weights and images")
    parser.add_argument("--steps", type=int, help="timed steps per run (default: the profile's)")
    parser.add_argument("--warmup", type=int, help="untimed steps per run (default: the profile's)")
    parser.add_argument("--rounds", type=int,
                        help="rounds, each running every configuration once in a seeded random order "
                             "(default: the profile's)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the per-round random order of the configurations (default: 0)")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    from mentor.data import device_batches

    for flag, value, low in (("--steps", args.steps, 1), ("--warmup", args.warmup, 0), ("--rounds", args.rounds, 1),
                             ("--batch", args.batch, 1), ("--image-size", args.image_size, 32)):
        if value is not None and value < low:
            parser.error(f"{flag} must be at least {low}, got {value}")
    if args.list:
        for name, config in available_configs(get_profile(args.profile)).items():
            print(f"{name:<24}{config.description}")
        return 0
    profile = get_profile(args.profile)
    profile = profile.with_(**{key: value for key, value in (("batch_size", args.batch),
                                                              ("image_size", args.image_size)) if value is not None})
    available = available_configs(profile)
    names = [name.strip() for name in args.configs.split(",") if name.strip()]
    unknown = [name for name in names if name not in available]
    if unknown or len(names) < 2 or len(set(names)) != len(names):
        parser.error(f"--configs takes two or more different names from --list, got {args.configs!r}"
                     + (f" (unknown: {', '.join(unknown)})" if unknown else ""))
    steps = args.steps if args.steps is not None else profile.steps
    warmup = args.warmup if args.warmup is not None else profile.warmup
    rounds = args.rounds if args.rounds is not None else profile.rounds
    layout = ", channels-last" if args.channels_last else ""
    print(f"profile {profile.name} on {profile.device}: batch {profile.batch_size}, "
          f"{profile.image_size} px, {args.precision}{layout}, {rounds} rounds of {warmup}+{steps} steps", flush=True)
    setup = build_setup(profile.num_classes, profile.device, precision=args.precision,
                        channels_last=args.channels_last)
    batches = device_batches(profile.batch_size, profile.image_size, profile.num_classes, profile.device)
    cmp = compare([available[name] for name in names], setup, batches, steps=steps, warmup=warmup, rounds=rounds,
                  report_every=profile.report_every, seed=args.seed)
    print(cmp.table())
    if args.json:
        print(f"wrote {cmp.save_json(args.json)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
