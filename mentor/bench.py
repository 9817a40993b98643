"""Comparing training configurations in interleaved rounds: median, spread, ratio and syncs per step.

Run ``python -m mentor.bench`` to reproduce the article's comparison (no metrics, naive,
optimized) on your GPU; ``--help`` lists the options.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from mentor.env import Profile, environment_report, get_profile
from mentor.metrics import METRIC_SETS, metric_set
from mentor.train import ReportHook, Setup, StepHook, build_setup, train

Hooks = tuple[StepHook | None, ReportHook | None]


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


def metrics_config(variant: str, num_classes: int, device: torch.device | str, name: str | None = None) -> Config:
    """A :class:`Config` that updates one of ``mentor.metrics.METRIC_SETS`` every step and reports periodically.

    Example:
        >>> cfg = metrics_config("naive", num_classes=10, device="cpu")
        >>> on_step, on_report = cfg.make()
        >>> callable(on_step), callable(on_report)
        (True, True)
    """
    if variant not in METRIC_SETS:
        raise ValueError(f"Unknown metric set {variant!r}: pass one of {list(METRIC_SETS)}.")

    def make() -> Hooks:
        ms = metric_set(variant, num_classes=num_classes, device=device)
        return (lambda s: ms.update(s.loss, s.output, s.labels)), ms.report

    return Config(name or variant, make, METRIC_SETS[variant])


@dataclass
class Result:
    """Timings of one configuration over all rounds."""

    name: str
    description: str
    round_medians_ms: list[float]
    step_ms: list[float]
    syncs_per_step: float | None

    @property
    def median_ms(self) -> float:
        """Median over every timed step of every round."""
        return statistics.median(self.step_ms)

    @property
    def spread_ms(self) -> tuple[float, float]:
        """Lowest and highest per-round median."""
        return min(self.round_medians_ms), max(self.round_medians_ms)


@dataclass
class Comparison:
    """The results of :func:`compare`, with a table, a chart and JSON."""

    results: list[Result]
    baseline: str
    batch_size: int
    settings: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Result:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(f"no configuration {name!r}; have {[r.name for r in self.results]}")

    def ratio(self, name: str) -> float:
        """Median step time of ``name`` over the baseline's."""
        return self[name].median_ms / self[self.baseline].median_ms

    def beyond_spread(self, name: str) -> bool:
        """True when the per-round medians of ``name`` and of the baseline do not overlap."""
        lo, hi = self[name].spread_ms
        blo, bhi = self[self.baseline].spread_ms
        return lo > bhi or hi < blo

    def rows(self) -> list[dict[str, Any]]:
        """One dict per configuration, as shown by :meth:`table`."""
        out = []
        for r in self.results:
            lo, hi = r.spread_ms
            out.append({
                "config": r.name, "median_ms": r.median_ms, "min_ms": lo, "max_ms": hi,
                "ratio": self.ratio(r.name), "images_per_s": self.batch_size * 1000 / r.median_ms,
                "syncs_per_step": r.syncs_per_step,
                "beyond_spread": None if r.name == self.baseline else self.beyond_spread(r.name),
            })
        return out

    def table(self) -> str:
        """A plain-text table: median step time, spread over rounds, ratio, throughput, syncs per step."""
        w = max(16, 2 + max(len(r.name) for r in self.results))
        head = f"{'config':<{w}}{'median ms':>10}{'round min-max':>16}{'ratio':>8}{'img/s':>9}{'syncs/step':>12}  vs baseline"
        lines = [head, "-" * len(head)]
        for row in self.rows():
            syncs = "n/a (CPU)" if row["syncs_per_step"] is None else f"{row['syncs_per_step']:g}"
            verdict = ("baseline" if row["beyond_spread"] is None
                       else "beyond spread" if row["beyond_spread"] else "within spread")
            lines.append(f"{row['config']:<{w}}{row['median_ms']:>10.2f}"
                         f"{row['min_ms']:>8.2f}-{row['max_ms']:<7.2f}{row['ratio']:>8.3f}"
                         f"{row['images_per_s']:>9.0f}{syncs:>12}  {verdict}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Everything, JSON-ready."""
        return {"baseline": self.baseline, "batch_size": self.batch_size, "settings": self.settings,
                "environment": self.environment, "rows": self.rows(),
                "results": [asdict(r) for r in self.results]}

    def save_json(self, path: str | Path) -> Path:
        """Write :meth:`to_dict` to ``path``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

    def plot(self, ax: Any = None) -> Any:
        """A bar chart of median step times with the round spread as error bars; returns the Axes."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(max(5, 1.3 * len(self.results)), 3.4))
        names = [r.name for r in self.results]
        med = [r.median_ms for r in self.results]
        err = [[m - r.spread_ms[0] for m, r in zip(med, self.results)],
               [r.spread_ms[1] - m for m, r in zip(med, self.results)]]
        colors = ["#7f7f7f" if n == self.baseline else "#1f77b4" for n in names]
        ax.bar(names, med, yerr=err, capsize=4, color=colors)
        for i, r in enumerate(self.results):
            label = f"{self.ratio(r.name):.3f}x"
            if r.syncs_per_step is not None:
                label += f"\n{r.syncs_per_step:g} syncs"
            ax.text(i, med[i] * 0.5, label, ha="center", va="center", color="white", fontsize=8)
        ax.set_ylabel("median step time (ms)")
        ax.tick_params(axis="x", labelrotation=20)
        return ax


def _syncs_per_step(setup: Setup, batches: Iterable, make: Callable[[], Hooks], steps: int) -> float:
    from mentor.profiling import sync_guard

    on_step, _ = make()
    train(setup, batches, steps=2, on_step=on_step)  # first updates allocate state: not counted
    with sync_guard() as report:
        train(setup, batches, steps=steps, on_step=on_step)
    return report.count / steps


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
) -> Comparison:
    """Time each configuration in interleaved rounds (A B C, A B C, ...) on one model and one machine.

    Each run does ``warmup`` untimed then ``steps`` timed steps with fresh hooks. The first
    configuration is the baseline of the ratios. Syncs per step are counted in a separate,
    untimed pass under :func:`mentor.profiling.sync_guard` (CUDA only; ``None`` elsewhere),
    without the periodic report, whose one read-back comes every ``report_every`` steps.

    Example:
        >>> from mentor.data import device_batches
        >>> setup = build_setup(num_classes=10)
        >>> cmp = compare([Config("none")], setup, device_batches(2, 32, 10), steps=2, warmup=1,
        ...               rounds=1, progress=False)
        >>> cmp.results[0].name
        'none'
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
    per_round: dict[str, list[float]] = {c.name: [] for c in configs}
    steps_all: dict[str, list[float]] = {c.name: [] for c in configs}
    for k in range(rounds):
        for c in configs:
            on_step, on_report = c.make()
            every = report_every if on_report is not None else 0
            stats = train(setup, c.batches if c.batches is not None else batches, steps=steps, warmup=warmup, on_step=on_step,
                          on_report=on_report if every else None, report_every=every)
            per_round[c.name].append(stats.median_ms)
            steps_all[c.name].extend(stats.step_ms)
        if progress:
            print(f"round {k + 1}/{rounds}: " + ", ".join(f"{c.name} {per_round[c.name][-1]:.2f} ms" for c in configs),
                  flush=True)
    cuda = setup.device.type == "cuda"
    results = [
        Result(c.name, c.description, per_round[c.name], steps_all[c.name],
               _syncs_per_step(setup, c.batches if c.batches is not None else batches, c.make, sync_steps)
               if (count_syncs and cuda) else None)
        for c in configs
    ]
    images, _ = next(iter(batches))
    settings = dict(steps=steps, warmup=warmup, rounds=rounds, report_every=report_every, sync_steps=sync_steps)
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
    """Every configuration the book measures, by name; chapters pick from it and the summary runs them all.

    Example:
        >>> from mentor.env import get_profile
        >>> list(catalogue(get_profile("smoke")))[:3]
        ['no metrics', 'naive', 'float weight']
    """
    device = profile.device
    configs = [Config("no metrics", description="the training step alone")]
    configs += [metrics_config(v, profile.num_classes, device) for v in METRIC_SETS]
    configs += [
        step_time_config("step time: CPU", "cpu", "float"),
        step_time_config("step time: GPU float", str(device), "float"),
        step_time_config("step time: GPU tensor", str(device), "tensor"),
    ]
    return {c.name: c for c in configs}


def article_configs(profile: Profile) -> list[Config]:
    """The article's comparison: no metrics, the naive set and the optimized set."""
    cat = catalogue(profile)
    return [cat["no metrics"], cat["naive"], cat["optimized"]]


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m mentor.bench [--profile full|smoke] [--rounds N] [--json out.json]``."""
    parser = argparse.ArgumentParser(prog="python -m mentor.bench", description=(
        "Time ResNet-18 training steps with no metrics, the article's naive TorchMetrics set and "
        "the optimized set, in interleaved rounds, and count syncs per step."))
    parser.add_argument("--profile", choices=["full", "smoke"], default=None,
                        help="run profile (default: full with CUDA, smoke without)")
    parser.add_argument("--steps", type=int, help="timed steps per run (default: the profile's)")
    parser.add_argument("--warmup", type=int, help="untimed steps per run (default: the profile's)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default: the profile's)")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    from mentor.data import device_batches

    for flag, value, low in (("--steps", args.steps, 1), ("--warmup", args.warmup, 0), ("--rounds", args.rounds, 1)):
        if value is not None and value < low:
            parser.error(f"{flag} must be at least {low}, got {value}")
    profile = get_profile(args.profile)
    steps = args.steps if args.steps is not None else profile.steps
    warmup = args.warmup if args.warmup is not None else profile.warmup
    rounds = args.rounds if args.rounds is not None else profile.rounds
    print(f"profile {profile.name} on {profile.device}: batch {profile.batch_size}, "
          f"{profile.image_size} px, {rounds} rounds of {warmup}+{steps} steps", flush=True)
    setup = build_setup(profile.num_classes, profile.device)
    batches = device_batches(profile.batch_size, profile.image_size, profile.num_classes, profile.device)
    cmp = compare(article_configs(profile), setup, batches, steps=steps, warmup=warmup, rounds=rounds,
                  report_every=profile.report_every)
    print(cmp.table())
    if args.json:
        print(f"wrote {cmp.save_json(args.json)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
