"""The measuring loop: configurations timed in interleaved rounds on one model, and sweeps over operating points.

:func:`compare` times every configuration once per round, in an order shuffled anew each round,
and keeps every timed step of every round; the :class:`mentor.lab.comparison.Comparison` it returns
gives each overhead against the baseline (the first configuration) with a paired bootstrap interval
over rounds. :func:`sweep` runs one comparison per operating point.

Example:
    >>> from mentor.lab.configs import Config
    >>> from mentor.lab.data import device_batches
    >>> from mentor.lab.train import build_setup
    >>> cmp = compare([Config("none"), Config("again")], build_setup(num_classes=10), device_batches(2, 32, 10),
    ...               steps=2, warmup=1, rounds=2, progress=False)
    >>> cmp.rounds, cmp["again"].syncs_note
    (2, 'n/a (CPU)')
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from mentor.lab.comparison import Comparison
from mentor.lab.configs import SWEEP_CONFIGS, Config, Hooks, OperatingPoint, available_configs, point_setup
from mentor.lab.env import Profile, environment_report
from mentor.lab.stats import CPU_NOTE, NOT_COUNTED, Result
from mentor.lab.train import Setup, train


def report_positions(warmup: int, steps: int, report_every: int) -> list[int]:
    """0-based positions, among a run's ``steps`` timed steps, of the steps that call ``on_report``.

    :func:`mentor.lab.train.train` reports after global step ``i`` when ``(i + 1) % report_every == 0``,
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


def _is_cuda(setup: Setup) -> bool:
    """Whether the setup trains on a CUDA device (syncs can only be counted there)."""
    return setup.device.type == "cuda"


def _syncs_per_step(setup: Setup, batches: Iterable, make: Callable[[], Hooks],
                    steps: int) -> tuple[float, int | None]:
    """Syncs per training step with fresh hooks, then syncs of one ``on_report`` call (``None`` without one)."""
    from mentor.syncs import sync_guard

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
    ``report_every`` the step that calls ``on_report`` is timed with its report; the step after it, in which a
    report's read leaves the GPU idle while the host queues the next work, is timed unless the report falls on the
    last timed step (``warmup + steps`` a multiple of ``report_every``; the full profile's one report falls on
    timed step 40 of 60). :func:`mentor.lab.blocks.compare_blocks` never times a report there. The first
    configuration is the baseline of :meth:`mentor.lab.comparison.Comparison.overhead`. Syncs per step, and the
    syncs of one report call, are counted in a separate, untimed pass under
    :func:`mentor.syncs.sync_guard` (CUDA only; ``count_syncs=False`` skips it).

    Example:
        >>> from mentor.lab.data import device_batches
        >>> from mentor.lab.train import build_setup
        >>> setup = build_setup(num_classes=10)
        >>> cmp = compare([Config("none"), Config("again")], setup, device_batches(2, 32, 10), steps=2,
        ...               warmup=1, rounds=2, progress=False, seed=4)
        >>> cmp.settings["orders"], cmp["none"].syncs_note
        ([['again', 'none'], ['none', 'again']], 'n/a (CPU)')
    """
    if not configs or not all(isinstance(c, Config) for c in configs):
        raise TypeError("configs must be a non-empty sequence of mentor.lab.configs.Config.")
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


def at_each_point(points: Sequence[OperatingPoint], profile: Profile,
                  run: Callable[[Setup, Iterable], Comparison], progress: bool = True) -> dict[str, Comparison]:
    """``run(setup, batches)`` at each operating point, each with its own model and data (:func:`mentor.lab.configs.point_setup`).

    Each comparison records its point in ``settings["point"]``. Returns the comparisons by point
    name, in the order of ``points``; :func:`sweep` and :func:`mentor.lab.blocks.sweep_blocks` use it.

    Example:
        >>> from mentor.lab.configs import operating_points
        >>> from mentor.lab.env import get_profile
        >>> p = get_profile("smoke")
        >>> run = lambda setup, batches: compare([Config("a"), Config("b")], setup, batches, steps=1, warmup=0,
        ...                                      rounds=1, progress=False)
        >>> out = at_each_point(operating_points(p)[:1], p, run, progress=False)
        >>> out["fp32 b128"].settings["point"]["batch_size"]
        8
    """
    if not points or not all(isinstance(p, OperatingPoint) for p in points):
        raise TypeError("points must be a non-empty sequence of mentor.lab.configs.OperatingPoint, "
                        "e.g. OPERATING_POINTS.")
    out: dict[str, Comparison] = {}
    for point in points:
        if progress:
            print(point.label, flush=True)
        setup, batches = point_setup(point, profile)
        out[point.name] = run(setup, batches)
        out[point.name].settings["point"] = asdict(point)
    return out


def sweep(points: Sequence[OperatingPoint], profile: Profile, configs: Sequence[str] = SWEEP_CONFIGS, *,
          steps: int, warmup: int, rounds: int, seed: int = 0, progress: bool = True) -> dict[str, Comparison]:
    """One :func:`compare` of ``configs`` (names from :func:`mentor.lab.configs.available_configs`) at each
    operating point.

    Each point gets its own model, built with the point's precision and memory format, and its
    own data; the first configuration is every comparison's baseline. Returns the comparisons by
    point name, in the order of ``points``.

    Example:
        >>> from mentor.lab.configs import operating_points
        >>> from mentor.lab.env import get_profile
        >>> p = get_profile("smoke")
        >>> out = sweep(operating_points(p)[:1], p, ["no metrics", "fused suite"], steps=1, warmup=0, rounds=1,
        ...             progress=False)
        >>> list(out), out["fp32 b128"].batch_size
        (['fp32 b128'], 8)
    """
    available = available_configs(profile)
    unknown = [name for name in configs if name not in available]
    if unknown:
        raise ValueError(f"unknown configuration(s) {unknown}: pass names from available_configs(), "
                         f"e.g. {list(SWEEP_CONFIGS)}.")
    chosen = [available[name] for name in configs]
    return at_each_point(points, profile, lambda setup, batches: compare(
        chosen, setup, batches, steps=steps, warmup=warmup, rounds=rounds, report_every=profile.report_every,
        seed=seed, progress=False), progress)


def record_point(point: OperatingPoint, profile: Profile, config: str, trace_path: str | Path, *,
                 active: int = 5, range_name: str = "metrics update") -> Path:
    """Profile ``active`` training steps of ``config`` at ``point``, each metric update inside a
    ``record_function(range_name)``, and write the trace (see :func:`mentor.lab.trace.host_time`).

    Example:
        >>> import tempfile, os
        >>> from mentor.lab.env import get_profile
        >>> from mentor.lab.trace import host_time, load_trace
        >>> p = get_profile("smoke").with_(num_classes=10)
        >>> path = record_point(OperatingPoint("tiny", 2, 32), p, "fused suite",
        ...                     os.path.join(tempfile.mkdtemp(), "t.json.gz"), active=2)
        >>> host_time(load_trace(path), "metrics update").ranges
        2
    """
    from mentor.lab.profiling import record_steps

    available = available_configs(profile)
    if config not in available:
        raise ValueError(f"unknown configuration {config!r}: pass a name from available_configs(), "
                         f"e.g. {list(SWEEP_CONFIGS)}.")
    on_step, _ = available[config].make()
    if on_step is None:
        raise ValueError(f"{config!r} updates no metric: pick a configuration with metrics.")
    setup, batches = point_setup(point, profile)

    def ranged(step: Any) -> None:
        with torch.profiler.record_function(range_name):
            on_step(step)

    return record_steps(setup, batches, trace_path, ranged, warmup=2, active=active)
