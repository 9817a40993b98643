"""Issue "Free in the loops readers run"'s targets for the suite, applied to a loop's stored comparison.

A loop meets the target when the suite's overhead (total time, reports included, against the loop without
metrics) is small by one of two tests, chosen by how fine the loop's own A/A comparison is:

- **narrow A/A** (its whole interval within +-:data:`AA_NARROW` points): the suite's point estimate is at most
  :data:`POINT` % and the upper end of its interval at most :data:`HIGH` %;
- **wide A/A**: an interval cannot show :data:`POINT` %, so the lower end of the suite's interval must be at most
  :data:`POINT` (the run does not resolve it above that), and the suite's own host time per step must be at most
  :data:`POINT` % of the step without metrics, reports included.

Chapter 9 times the suite's host time per step at the steps that do not report (``hook_ms``), so its share leaves
the reports out: a share above :data:`POINT` misses the target whatever the reports add, and a share at or below
it does not show that the target is met. Where a loop has no host time per step, the wide test cannot be decided.
"""

from __future__ import annotations

from dataclasses import dataclass

from mentor.lab.stats import Interval

AA_NARROW = 0.5
"""An A/A interval lying within +-this many points counts as narrow."""
POINT = 0.3
"""The largest overhead (%) the target allows: the narrow test's point estimate, the wide test's lower end and
host-time share."""
HIGH = 0.5
"""The narrow test's largest upper end (%) of the suite's interval."""


@dataclass(frozen=True)
class Target:
    """One loop's suite overhead against the target.

    ``aa`` and ``suite`` are intervals in % of the total time over the loop without metrics; ``host_share`` is the
    suite's host time per step in % of the step without metrics, with ``host_share_reports`` saying whether
    report steps are in it (None where the loop has no such measurement).

    Example:
        >>> t = Target("eager fp32 b128", Interval(0.0, -0.01, 0.01), Interval(0.1, 0.04, 0.1), 0.29)
        >>> t.test, t.verdict, t.said()
        ('narrow A/A', 'met', 'met: +0.1 % [0.04, 0.1]: estimate 0.1 <= 0.3 and upper end 0.1 <= 0.5')
    """

    loop: str
    aa: Interval
    suite: Interval
    host_share: float | None = None
    host_share_reports: bool = False

    def __post_init__(self) -> None:
        for label in ("aa", "suite"):
            value = getattr(self, label)
            if not isinstance(value, Interval) or not value.has_interval:
                raise ValueError(f"Target.{label} must be an Interval with its two ends (a run of at least two "
                                 f"rounds), got {value!r}")
        if self.host_share is not None and not self.host_share >= 0:
            raise ValueError(f"Target.host_share must be a share in % (0 or more) or None, got {self.host_share!r}")

    @property
    def test(self) -> str:
        """``"narrow A/A"`` or ``"wide A/A"``: which of the two tests applies."""
        return "narrow A/A" if -AA_NARROW <= self.aa.lo and self.aa.hi <= AA_NARROW else "wide A/A"

    @property
    def verdict(self) -> str:
        """``"met"``, ``"missed"``, or ``"not shown"`` where the wide test needs a host time the loop lacks."""
        if self.test == "narrow A/A":
            return "met" if self.suite.point <= POINT and self.suite.hi <= HIGH else "missed"
        if self.suite.lo > POINT or (self.host_share is not None and self.host_share > POINT):
            return "missed"
        if self.host_share is None or not self.host_share_reports:
            return "not shown"
        return "met"

    def said(self) -> str:
        """The verdict with the numbers it rests on, as a table cell or a sentence ends it."""
        s = self.suite
        if self.test == "narrow A/A":
            because = (f"estimate {s.point:.1f} {'<=' if s.point <= POINT else '>'} {POINT} and upper end "
                       f"{s.hi:.1f} {'<=' if s.hi <= HIGH else '>'} {HIGH}")
        else:
            because = f"lower end {s.lo:.1f} {'<=' if s.lo <= POINT else '>'} {POINT}"
            if self.host_share is None:
                because += "; no host time per step measured"
            else:
                reports = "" if self.host_share_reports else " without reports"
                because += (f"; host time {self.host_share:.2f} % of the step{reports} "
                            f"{'<=' if self.host_share <= POINT else '>'} {POINT}")
        return f"{self.verdict}: {s}: {because}"


def targets_table(targets: list[Target]) -> str:
    """A plain-text table, one loop per row: the A/A interval, which test applies, the suite's interval, its host
    time per step (% of the step; "not timed" where the loop has none) and the verdict (:meth:`Target.said` gives
    the numbers behind a verdict in words).

    Example:
        >>> print(targets_table([Target("a", Interval(0.0, -0.1, 0.1), Interval(0.8, 0.3, 1.3), 0.25)]))
        loop  A/A                 A/A is  suite              host / step  target
        a     +0.0 % [-0.1, 0.1]  narrow  +0.8 % [0.3, 1.3]  0.25 %       missed
    """
    if not targets:
        raise ValueError("targets_table needs at least one Target")
    rows = [("loop", "A/A", "A/A is", "suite", "host / step", "target")]
    rows += [(t.loop, str(t.aa), t.test.split()[0], str(t.suite),
              "not timed" if t.host_share is None else f"{t.host_share:.2f} %", t.verdict) for t in targets]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:5], widths)) + "  " + r[5] for r in rows)
