"""Words for what a run resolved, computed from its intervals, so that a chapter's sentences stay true at a rerun.

A sentence such as "two of the suite's eight intervals lie above 0" is a measurement: typed into the prose, it
is right for the run it was written against and silently wrong after the next one. The chapters glue these
instead. :func:`side` says where one interval lies, :func:`tally` counts a set of them and names those that
resolve a difference, :func:`overlap` says whether two intervals share a point, and :func:`moved` lists the
configurations whose intervals in two runs do not.

Example:
    >>> from mentor.lab.stats import Interval
    >>> costs = {"a": Interval(2.0, 1.0, 3.0), "b": Interval(0.5, -1.0, 2.0)}
    >>> side(costs["a"]), tally(costs)
    ('above 0', '1 above 0 (a: +2.0 % [1.0, 3.0]); 1 containing 0')
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from mentor.lab.stats import Interval

SIDES = ("above 0", "below 0", "containing 0", "without an interval")
"""What :func:`side` returns, in the order :func:`tally` lists its groups."""


def _interval(label: str, value: object) -> Interval:
    if not isinstance(value, Interval):
        raise TypeError(f"{label} must be a mentor.lab.stats.Interval (Comparison.overhead returns one), "
                        f"got {type(value).__name__}")
    return value


def side(interval: Interval) -> str:
    """Where ``interval`` lies against 0: ``"above 0"``, ``"below 0"``, ``"containing 0"``, or, for a one-round
    estimate, ``"without an interval"``. An end exactly at 0 counts as containing it, as in
    :meth:`mentor.lab.comparison.Comparison.verdict`.

    Example:
        >>> side(Interval(0.4, 0.1, 0.8)), side(Interval(0.0, -0.1, 0.0))
        ('above 0', 'containing 0')
    """
    interval = _interval("interval", interval)
    if not interval.has_interval:
        return "without an interval"
    if interval.lo > 0:
        return "above 0"
    if interval.hi < 0:
        return "below 0"
    return "containing 0"


RESOLUTION = 0.5
"""The book's resolution rule (:func:`resolved`): a difference smaller than this share of the width of the same
run's repeated-baseline (A/A) interval is below what one run resolves, whatever side of 0 its interval lies on."""
RULE = (f"a difference counts as resolved when its interval lies clear of 0 and its estimate is at least "
        f"{'half' if RESOLUTION == 0.5 else f'{RESOLUTION:g} times'} the width of the same run's A/A interval away "
        "from 0; where that A/A interval itself misses 0, a difference whose interval overlaps it is not ranked")
"""The rule in words, as the chapters that state it glue it."""


def resolved(interval: Interval, aa: Interval | None = None) -> str:
    """The book's one rule for what a run resolves: ``"above 0"`` or ``"below 0"`` when it resolves a difference,
    ``"not resolved"`` when it does not, ``"without an interval"`` for a one-round estimate.

    A difference is resolved when its interval lies clear of 0 (:func:`side`) and, given ``aa``, the interval of the
    same run's repeated baseline (the loop compared with itself, which measures no difference):

    - its estimate is at least :data:`RESOLUTION` times the width of ``aa`` away from 0: the A/A shows how widely
      one run spreads where there is nothing to find, and a smaller difference is within that spread;
    - and, when ``aa`` itself misses 0 (a run biased where there is nothing to find), its interval does not overlap
      ``aa``'s: such a difference cannot be told from that bias, so it is not ranked.

    Without ``aa`` (a comparison with no repeated baseline) only the side of 0 decides; a page that uses it so says
    that its run had no A/A.

    Example:
        >>> aa = Interval(1.6, -1.6, 5.1)  # 6.7 points wide: half is 3.35
        >>> resolved(Interval(3.0, 0.3, 5.8), aa), resolved(Interval(4.0, 1.0, 7.0), aa)
        ('not resolved', 'above 0')
        >>> resolved(Interval(-6.2, -8.6, -3.7), Interval(-4.1, -6.4, -1.6))  # overlaps an A/A that missed 0
        'not resolved'
        >>> resolved(Interval(3.0, 0.3, 5.8))
        'above 0'
    """
    interval = _interval("interval", interval)
    where = side(interval)
    if where not in ("above 0", "below 0") or aa is None:
        return "not resolved" if where == "containing 0" else where
    aa = _interval("aa", aa)
    if not aa.has_interval:
        raise ValueError(f"aa must be the A/A's interval over at least two rounds, got {aa}: pass aa=None for a run "
                         "without one")
    if abs(interval.point) < RESOLUTION * (aa.hi - aa.lo):
        return "not resolved"
    if side(aa) != "containing 0" and overlap(interval, aa):
        return "not resolved"
    return where


def tally(intervals: Mapping[str, Interval], name: Iterable[str] = ("above 0", "below 0")) -> str:
    """How many of ``intervals`` lie on each side of 0 (:func:`side`), in the order of :data:`SIDES`; the groups
    in ``name`` also list their labels, each with its interval.

    Name the groups a sentence is about: by default those that resolve a difference; pass
    ``name=("containing 0",)`` to list the exceptions where almost every interval lies above 0.

    Example:
        >>> costs = {"x": Interval(3.0, 2.0, 4.0), "y": Interval(1.0, -1.0, 3.0), "z": Interval(2.0, 1.0, 3.0)}
        >>> tally(costs)
        '2 above 0 (x: +3.0 % [2.0, 4.0]; z: +2.0 % [1.0, 3.0]); 1 containing 0'
        >>> tally(costs, name=("containing 0",))
        '2 above 0; 1 containing 0 (y: +1.0 % [-1.0, 3.0])'
    """
    if not intervals:
        raise ValueError("tally needs at least one interval: pass {label: Interval, ...}")
    named = set(name if not isinstance(name, str) else [name])
    unknown = named - set(SIDES)
    if unknown:
        raise ValueError(f"name takes sides from {SIDES}, not {sorted(unknown)}")
    groups: dict[str, list[str]] = {s: [] for s in SIDES}
    for label, interval in intervals.items():
        groups[side(_interval(f"intervals[{label!r}]", interval))].append(label)
    parts = []
    for s, labels in groups.items():
        if not labels:
            continue
        listed = f" ({'; '.join(f'{label}: {intervals[label]}' for label in labels)})" if s in named else ""
        parts.append(f"{len(labels)} {s}{listed}")
    return "; ".join(parts)


def overlap(a: Interval, b: Interval) -> bool:
    """Whether the intervals ``a`` and ``b`` share a point (touching ends count).

    Example:
        >>> overlap(Interval(1.0, 0.0, 2.0), Interval(3.0, 2.0, 4.0)), overlap(Interval(1.0, 0.0, 2.0),
        ...                                                                   Interval(5.0, 4.0, 6.0))
        (True, False)
    """
    a, b = _interval("a", a), _interval("b", b)
    if not (a.has_interval and b.has_interval):
        raise ValueError(f"overlap needs two intervals; {a if not a.has_interval else b} is a one-round estimate "
                         "without one: compare runs of at least two rounds")
    return a.lo <= b.hi and b.lo <= a.hi


def moved(before: Mapping[str, Interval], after: Mapping[str, Interval]) -> list[str]:
    """The labels, in ``after``'s order, whose intervals in the two runs do not overlap (:func:`overlap`).

    Both runs must hold the same labels; a label in one only is refused by name.

    Example:
        >>> moved({"a": Interval(1.0, 0.0, 2.0), "b": Interval(9.0, 8.0, 10.0)},
        ...       {"a": Interval(1.5, 0.5, 2.5), "b": Interval(4.0, 3.0, 5.0)})
        ['b']
    """
    if set(before) != set(after):
        only = sorted(set(before) ^ set(after))
        raise ValueError(f"moved compares the same configurations in two runs; {only} appear in one run only")
    return [label for label in after if not overlap(before[label], after[label])]


def withdrawn(interval: Interval, aa: Interval) -> bool:
    """Whether the same run's missed A/A withdraws the ranking that ``interval`` would give.

    True when ``interval`` lies clear of 0 (:func:`side`) while ``aa``, the interval of the run's repeated baseline,
    misses 0 too and the two overlap: by the book's rule (:func:`resolved`) such a difference cannot be told from the
    run's bias where there was nothing to find, so the page does not rank it. A difference that contains 0 was never
    ranked, and an A/A that contains 0 withdraws nothing.

    Example:
        >>> aa = Interval(-4.1, -6.4, -1.6)  # the repeated loop missed 0
        >>> withdrawn(Interval(-6.2, -8.6, -3.7), aa), withdrawn(Interval(-9.0, -11.0, -7.0), aa)
        (True, False)
        >>> withdrawn(Interval(-6.2, -8.6, -3.7), Interval(0.1, -0.5, 0.7))  # an A/A that contains 0
        False
    """
    interval, aa = _interval("interval", interval), _interval("aa", aa)
    if not (interval.has_interval and aa.has_interval):
        raise ValueError("withdrawn needs intervals of at least two rounds, got "
                         f"{interval if not interval.has_interval else aa}: a one-round run ranks nothing")
    return side(interval) != "containing 0" and side(aa) != "containing 0" and overlap(interval, aa)


def by_verdict(verdicts: Mapping[str, str], unranked: Iterable[str] = (),
               said: Mapping[str, str] | None = None) -> str:
    """Points grouped by their verdict, in words: ``"cheaper at a, b; not resolved from it at c"``.

    ``verdicts`` maps each point to what :meth:`mentor.lab.comparison.Comparison.verdict` said there; ``said`` turns
    a verdict into words (by default "faster" is "cheaper", "slower" "dearer", and no difference "not resolved from
    it"). A point in ``unranked`` (one where the run's missed A/A withdraws the pair, :func:`withdrawn`) is listed
    last as "not ranked in that run", whatever its verdict, so that a page quoting the list keeps the withdrawal.
    Groups come in the order their first point appears.

    Example:
        >>> by_verdict({"fp32 b64": "faster", "fp32 b32": "no difference resolved", "bf16 b32": "faster"},
        ...            unranked=["fp32 b32"])
        'cheaper at fp32 b64, bf16 b32; not ranked in that run (its repeated loop missed 0 there) at fp32 b32'
    """
    said = {"faster": "cheaper", "slower": "dearer", "no difference resolved": "not resolved from it",
            **(said or {})}
    unranked = list(unranked)
    unknown = [p for p in unranked if p not in verdicts]
    if unknown:
        raise ValueError(f"unranked names points that verdicts does not hold: {unknown}; pass points of {list(verdicts)}")
    groups: dict[str, list[str]] = {}
    for point, verdict in verdicts.items():
        if point not in unranked:
            groups.setdefault(said.get(verdict, verdict), []).append(point)
    if unranked:
        groups["not ranked in that run (its repeated loop missed 0 there)"] = unranked
    if not groups:
        raise ValueError("by_verdict needs at least one point: pass {point: verdict, ...}")
    return "; ".join(f"{words} at {', '.join(points)}" for words, points in groups.items())
