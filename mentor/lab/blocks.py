"""Comparing configurations in short alternating blocks, for host-bound steps whose speed drifts within seconds.

When the host limits the training step, its step time can drift by tens of percent within a second
or two (chapter 9 shows one run on the GPU machine), and :func:`mentor.lab.compare.compare`'s rounds, one long
run per configuration, pair a configuration with a baseline measured seconds apart. Here every
round runs each configuration for a short block of steps (a few untimed ones first, to settle
the GPU's queue after the switch), so the blocks that are compared ran back to back, within one
round of a few seconds, not a whole run apart. Each configuration keeps one set of metrics for the
whole comparison, as a training loop does, and reports every ``report_every`` timed steps inside a
timed step that is not the last of its block, so the total time includes the reports at their real rate and the step after each.

The result is a :class:`mentor.lab.comparison.Comparison` (a round is one block per configuration), so its
paired bootstrap over rounds, table, figure and JSON apply unchanged.

Example:
    >>> from mentor.lab.configs import Config
    >>> from mentor.lab.data import device_batches
    >>> from mentor.lab.train import build_setup
    >>> setup = build_setup(num_classes=10)
    >>> cmp = compare_blocks([Config("none"), Config("again")], setup, device_batches(2, 32, 10), rounds=3,
    ...                      block=3, settle=1, report_every=0)
    >>> cmp.rounds, [len(steps) for steps in cmp["again"].round_step_ms]
    (3, [2, 2, 2])
"""
from __future__ import annotations

import random
import statistics
import time
from collections.abc import Iterable, Sequence
from typing import Any


from mentor.lab.compare import _is_cuda, _syncs_per_step, at_each_point
from mentor.lab.comparison import Comparison
from mentor.lab.configs import Config, OperatingPoint
from mentor.lab.env import Profile, environment_report
from mentor.lab.stats import CPU_NOTE, NOT_COUNTED, Result
from mentor.lab.train import Setup, Step, train


def _int_at_least(label: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{label} must be an int >= {low}, got {value!r}.")
    return value


class ReportSchedule:
    """When a report runs in a loop of blocks, given whether each timed step is its block's last.

    A report is due at the timed step that completes each ``every`` timed steps (``0``: never). It runs there
    unless that is the last timed step of its block: the wait that a report's read leaves on the GPU falls in the
    step after it, and after a block's last timed step that is an untimed settle step of the next block. Such a
    report runs at the next block's first timed step instead; reports due together run once.
    :func:`compare_blocks` and :func:`mentor.lab.compiled_loop.inside_costs` both use it.

    Example:
        >>> schedule = ReportSchedule(every=3)  # 3 timed steps a block: due at each block's last, run at the next's first
        >>> [schedule.after_timed_step(last_in_block=p == 2) for _ in range(2) for p in range(3)]
        [False, False, False, True, False, False]
    """

    def __init__(self, every: int) -> None:
        self.every = every
        self.timed = 0  # timed steps so far
        self.due = False

    def after_timed_step(self, last_in_block: bool) -> bool:
        """Count one timed step; True when the report runs in it."""
        self.timed += 1
        self.due = self.due or bool(self.every and self.timed % self.every == 0)
        if self.due and not last_in_block:
            self.due = False
            return True
        return False


class _Counted:
    """One configuration's hooks for a whole comparison: reports as its :class:`ReportSchedule` says, inside a
    timed step, and times the host span of each timed step's hook (``host_ms``, report steps apart)."""

    def __init__(self, config: Config, every: int, warmup: int, steps: int) -> None:
        self.on_step, self.on_report = config.make()
        self.schedule = ReportSchedule(every if self.on_report is not None else 0)
        self.warmup = warmup  # the untimed steps at the start of each block
        self.steps = steps  # the timed steps of each block
        self.host_ms: list[float] = []
        self.report_at: list[int] = []  # position of each report step within its block

    def __call__(self, step: Step) -> None:
        if step.index < self.warmup:
            if self.on_step is not None:
                self.on_step(step)
            return
        start = time.perf_counter()
        if self.on_step is not None:
            self.on_step(step)
        position = step.index - self.warmup
        if self.schedule.after_timed_step(last_in_block=position == self.steps - 1):
            self.on_report(self.schedule.timed)  # type: ignore[misc]
            self.report_at.append(position)
            return
        self.host_ms.append((time.perf_counter() - start) * 1000.0)


def compare_blocks(
    configs: Sequence[Config],
    setup: Setup,
    batches: Iterable,
    *,
    rounds: int,
    block: int = 10,
    settle: int = 2,
    report_every: int = 50,
    count_syncs: bool = True,
    sync_steps: int = 5,
    seed: int = 0,
    warmup_rounds: int = 0,
) -> Comparison:
    """Time ``configs`` in ``rounds`` rounds of one short block each, in an order shuffled anew every round.

    A block is ``block`` training steps of one configuration: ``settle`` untimed, then
    ``block - settle`` timed. Each configuration's hooks are made once and kept for every block;
    its report runs inside the timed step that completes each ``report_every`` timed steps
    (``0``: never), or, when that step is the last timed step of its block, inside the next block's first timed
    step, so that the step after every report is timed too (a report's read leaves the GPU idle while the host
    queues the next step). The step times are read at the end of each round, after all its blocks are
    queued, so the GPU's queue drains once per round, not at every switch of configuration.
    ``settings`` records ``orders``, ``report_steps`` (per configuration, ``[round, position]``
    of each report step) and ``hook_ms``: per configuration, the median host time of one
    non-report step's hook in the loop, from ``time.perf_counter`` around it (no sync). It includes
    any wait at a sync inside the hook; how much of it lengthens the step depends on whether the host
    or the GPU limits the step, so compare it with the measured overhead rather than read it as one.
    Syncs per step are counted as in :func:`mentor.lab.compare.compare`, in a separate untimed pass.
    ``warmup_rounds`` rounds run first with the same hooks and are not recorded (their step times, reports and
    host times are dropped, and the count of timed steps starts again after them): the place for compiles and
    recompiles that the first updates of a compiled configuration trigger.

    Example:
        >>> from mentor.lab.data import device_batches
        >>> from mentor.lab.train import build_setup
        >>> cmp = compare_blocks([Config("none"), Config("again")], build_setup(num_classes=10),
        ...                      device_batches(2, 32, 10), rounds=2, block=2, settle=0, report_every=0, seed=4)
        >>> cmp.settings["orders"], cmp.settings["block"]
        ([['again', 'none'], ['none', 'again']], 2)
    """
    if not configs or not all(isinstance(c, Config) for c in configs):
        raise TypeError("configs must be a non-empty sequence of mentor.lab.configs.Config.")
    if not isinstance(setup, Setup):
        raise TypeError(f"setup must be a mentor.lab.train.Setup from build_setup(), not {type(setup).__name__}.")
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise ValueError(f"configuration names must be unique, got {names}.")
    _int_at_least("rounds", rounds, 1)
    _int_at_least("block", block, 1)
    _int_at_least("settle", settle, 0)
    _int_at_least("report_every", report_every, 0)
    _int_at_least("sync_steps", sync_steps, 1)
    _int_at_least("warmup_rounds", warmup_rounds, 0)
    if settle >= block:
        raise ValueError(f"settle ({settle}) must be smaller than block ({block}): a block needs a timed step; "
                         f"e.g. block=10, settle=2.")
    if report_every and block - settle < 2:
        raise ValueError(f"block - settle is {block - settle} timed step with report_every={report_every}: a report "
                         "needs a timed step after it in its block; pass a block at least settle + 2 long, "
                         "e.g. block=10, settle=2, or report_every=0.")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int (it seeds random.Random for the run order), got {seed!r}.")
    if any(c.batches is not None for c in configs):
        raise ValueError("compare_blocks runs every configuration on the same batches; configs with their own "
                         "batches need mentor.lab.compare.compare.")
    rng = random.Random(seed)
    hooks = {c.name: _Counted(c, report_every, settle, block - settle) for c in configs}
    per_round: dict[str, list[list[float]]] = {c.name: [] for c in configs}
    report_steps: dict[str, list[list[int]]] = {c.name: [] for c in configs}
    orders: list[list[str]] = []
    for k in range(-warmup_rounds, rounds):
        if k == 0 and warmup_rounds:  # the warm-up is over: count and time afresh, with the same metrics
            for hook in hooks.values():
                hook.schedule, hook.host_ms, hook.report_at = ReportSchedule(hook.schedule.every), [], []
        order = list(configs)
        rng.shuffle(order)
        pending = []
        for c in order:
            hook = hooks[c.name]
            before = len(hook.report_at)
            stats = train(setup, batches, steps=block - settle, warmup=settle, on_step=hook)
            pending.append((c.name, stats))
            if k >= 0:
                report_steps[c.name] += [[k, p] for p in hook.report_at[before:]]
        for name, stats in pending:  # reading the first waits for this round's GPU work once
            durations = list(stats.step_ms)
            if k >= 0:
                per_round[name].append(durations)
        if k >= 0:
            orders.append([c.name for c in order])
    cuda = _is_cuda(setup)
    results = []
    for c in configs:
        syncs, report_syncs, note = None, None, None
        if not count_syncs:
            note = NOT_COUNTED
        elif not cuda:
            note = CPU_NOTE
        else:
            syncs, report_syncs = _syncs_per_step(setup, batches, c.make, sync_steps)
        results.append(Result(c.name, c.description, per_round[c.name], [], syncs, report_syncs, note))
    images, _ = next(iter(batches))
    hook_ms = {name: statistics.median(h.host_ms) if h.host_ms else None for name, h in hooks.items()}
    settings = dict(design="blocks", block=block, settle=settle, steps=block - settle, warmup=settle,
                    rounds=rounds, report_every=report_every, sync_steps=sync_steps, seed=seed, orders=orders,
                    report_steps=report_steps, hook_ms=hook_ms, warmup_rounds=warmup_rounds)
    return Comparison(results, baseline=configs[0].name, batch_size=int(images.shape[0]), settings=settings,
                      environment=environment_report())


def sweep_blocks(points: Sequence[OperatingPoint], profile: Profile, configs: Sequence[Config], *, rounds: int,
                 block: int = 10, settle: int = 2, seed: int = 0, progress: bool = True) -> dict[str, Comparison]:
    """One :func:`compare_blocks` of ``configs`` at each operating point, each with its own model and data.

    The first configuration is the baseline; reports come every ``profile.report_every`` timed steps.
    Returns the comparisons by point name, in the order of ``points`` (``mentor.lab.comparison.sweep_table``,
    ``plot_sweep`` and ``save_sweep`` take it).

    Example:
        >>> from mentor.lab.configs import available_configs, operating_points
        >>> from mentor.lab.env import get_profile
        >>> p = get_profile("smoke")
        >>> cfg = available_configs(p)
        >>> out = sweep_blocks(operating_points(p)[:1], p, [cfg["no metrics"], cfg["fused suite"]], rounds=2,
        ...                    block=3, settle=1, progress=False)
        >>> list(out), out["fp32 b128"].settings["point"]["batch_size"]
        (['fp32 b128'], 8)
    """
    return at_each_point(points, profile, lambda setup, batches: compare_blocks(
        configs, setup, batches, rounds=rounds, block=block, settle=settle, report_every=profile.report_every,
        seed=seed), progress)
