"""Syncs per metric update under two torchmetrics releases, each counted in its own Python process.

One process can import one torchmetrics. :func:`release_syncs` starts ``python -m mentor.lab.releases``
with a directory put first on ``PYTHONPATH`` (a ``pip install --target DIR torchmetrics==1.6.1``), so that
the child imports the release found there; ``None`` means the release installed in this environment. The
child builds every case of :data:`mentor.lab.updates.UPDATES` that the release can build, counts the syncs of its update with
:func:`mentor.syncs.count_syncs` and writes them as JSON, with the version and file it imported.

A case the release cannot build (an option it lacks, say) is recorded with the error, not skipped in
silence. Syncs are counted only where CUDA is: without it :func:`mentor.syncs.sync_guard` sees explicit
calls only, and the counts are recorded as ``None``.

Example:
    >>> list(UPDATES)[:3]
    ['MeanMetric(loss)', 'MeanMetric, w=1.0', 'MeanMetric, w=tensor']
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mentor.lab.updates import UPDATES, Update, update_inputs

OLD_RELEASE = "1.6.1"
"""The torchmetrics release the article measured."""

REPO = Path(__file__).resolve().parents[2]
"""The repository root: it holds the mentor package and, after ``make old-torchmetrics``, the old release."""

SITE_VARIABLE = "MENTOR_OLD_TORCHMETRICS"
"""Environment variable naming a directory that holds torchmetrics :data:`OLD_RELEASE`."""


def old_release_site() -> Path | None:
    """Where torchmetrics :data:`OLD_RELEASE` is installed: ``$MENTOR_OLD_TORCHMETRICS``, else
    ``.venv/torchmetrics-1.6.1`` in the repository (``make old-torchmetrics`` puts it there); None if neither holds it.

    Example:
        >>> site = old_release_site()
        >>> site is None or (site / "torchmetrics").is_dir()
        True
    """
    named = os.environ.get(SITE_VARIABLE)
    site = Path(named) if named else REPO / ".venv" / f"torchmetrics-{OLD_RELEASE}"
    return site if (site / "torchmetrics" / "__init__.py").is_file() else None


@dataclass
class ReleaseSyncs:
    """What one release measured: its version, where it was imported from, and syncs per update by case.

    ``syncs[name]`` is ``None`` when no CUDA device counted it; ``errors[name]`` holds why a case could not be
    built or updated on this release; ``sites[name]`` the ``file:line`` of each sync, with its count.
    ``stream_syncs[name]`` counts the other probe, the article's: ``cudaStreamSynchronize`` calls in a
    ``torch.profiler`` trace of the same updates, per update.
    """

    version: str
    location: str
    device: str
    calls: int
    syncs: dict[str, int | None] = field(default_factory=dict)
    sites: dict[str, dict[str, int]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    stream_syncs: dict[str, int | None] = field(default_factory=dict)


def measure(device: torch.device | str = "cpu", batch_size: int = 32, num_classes: int = 1000, calls: int = 3,
            seed: int = 0) -> ReleaseSyncs:
    """Count the syncs of every case of :data:`mentor.lab.updates.UPDATES` with the torchmetrics imported here, per update.

    Each update runs once unwatched (lazy initialisation), then ``calls`` times under
    :func:`mentor.syncs.count_syncs`; the count must divide evenly by ``calls``.

    Example:
        >>> r = measure("cpu", batch_size=4, num_classes=5, calls=1)
        >>> r.syncs["FusedMetrics"], r.errors.get("FusedMetrics")
        (None, None)
    """
    import torchmetrics

    from mentor.syncs import count_syncs

    if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
        raise ValueError(f"calls must be an int >= 1, got {calls!r}.")
    device = torch.device(device)
    counted = device.type == "cuda"
    x = update_inputs(device, batch_size, num_classes, seed)
    result = ReleaseSyncs(torchmetrics.__version__, str(Path(torchmetrics.__file__).parent), str(device), calls)
    for name, build in UPDATES.items():
        try:
            update = build(x, device, num_classes)
            update()
        except Exception as error:  # noqa: BLE001 - what the release lacks is the result
            result.errors[name] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            continue
        if not counted:
            for _ in range(calls):
                update()
            result.syncs[name] = result.stream_syncs[name] = None
            continue
        report = count_syncs(lambda: [update() for _ in range(calls)])
        result.syncs[name] = _per_call(name, report.count, calls)
        result.sites[name] = {_in_package(where): n // calls for where, n in report.by_line().items()}
        result.stream_syncs[name] = _per_call(name, _stream_syncs(update, calls), calls)
    return result


def _in_package(where: str) -> str:
    """``/any/dir/torchmetrics/x.py:9`` -> ``torchmetrics/x.py:9``: a release under ``--target`` is not in site-packages."""
    marker = "/torchmetrics/"
    return where[where.rindex(marker) + 1:] if marker in where else where


def _per_call(name: str, count: int, calls: int) -> int:
    if count % calls:
        raise RuntimeError(f"{name}: {count} syncs over {calls} updates is not the same number per update.")
    return count // calls


def _stream_syncs(update: Update, calls: int) -> int:
    """``cudaStreamSynchronize`` runtime calls in a profiler trace of ``calls`` updates."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            update()
    return sum(1 for e in prof.events() if e.name == "cudaStreamSynchronize")


def release_syncs(site: str | Path | None = None, device: str = "cpu", *, timeout: float = 600.0,
                  **options: Any) -> ReleaseSyncs:
    """Run :func:`measure` in a child process whose ``PYTHONPATH`` starts with ``site`` (None: this environment).

    Example:
        >>> r = release_syncs(None, "cpu", batch_size=4, num_classes=5, calls=1)   # doctest: +SKIP
        >>> r.version                                                              # doctest: +SKIP
        '1.9.0'
    """
    env = dict(os.environ)
    root = str(REPO)
    paths = [root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if site is not None:
        site = Path(site)
        if not (site / "torchmetrics" / "__init__.py").is_file():
            raise FileNotFoundError(f"site={str(site)!r} holds no torchmetrics package: pass the directory given to "
                                    "`pip install --target DIR torchmetrics==VERSION`, or None for this environment.")
        paths.insert(0, str(site.resolve()))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    args = [sys.executable, "-m", "mentor.lab.releases", "--device", device]
    args += [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"python -m mentor.lab.releases failed for site={site!r} (exit {done.returncode}):\n"
                           f"{done.stderr[-3000:]}")
    return ReleaseSyncs(**json.loads(done.stdout.strip().splitlines()[-1]))


def release_table(results: Sequence[ReleaseSyncs], width: int = 80, probe: str = "guard") -> str:
    """Syncs per update, one row per case and one column per release; ``-`` where a release could not build it.

    ``probe="guard"`` shows :func:`mentor.syncs.sync_guard`'s counts, ``probe="trace"`` the
    ``cudaStreamSynchronize`` calls in the profiler trace.

    Example:
        >>> a = ReleaseSyncs("1.6.1", "", "cuda:0", 3, syncs={"x": 2}, errors={"y": "TypeError: no"})
        >>> b = ReleaseSyncs("1.9.0", "", "cuda:0", 3, syncs={"x": 0, "y": 1})
        >>> print(release_table([a, b], width=40))
        update                      1.6.1  1.9.0
        x                               2      0
        y                               -      1
    """
    if not results:
        raise ValueError("release_table needs at least one ReleaseSyncs: pass the results of release_syncs.")
    if probe not in ("guard", "trace"):
        raise ValueError(f"probe must be 'guard' or 'trace', got {probe!r}.")
    counts = [r.syncs if probe == "guard" else r.stream_syncs for r in results]
    seen = {n for r in results for n in [*r.syncs, *r.errors]}
    names = [n for n in UPDATES if n in seen] + sorted(seen - set(UPDATES))
    name_width = max(width - 7 * len(results), max(map(len, names), default=0) + 2)
    lines = [f"{'update':<{name_width}}" + "".join(f"{r.version:>7}" for r in results)]
    for name in names:
        cells = ["-" if name not in r.syncs else "n/a" if c.get(name) is None else str(c[name])
                 for r, c in zip(results, counts)]
        lines.append(f"{name:<{name_width}}" + "".join(f"{c:>7}" for c in cells))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m mentor.lab.releases``: print :func:`measure`'s result as one JSON line."""
    parser = argparse.ArgumentParser(prog="python -m mentor.lab.releases", description=main.__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args(argv)
    r = measure(a.device, a.batch_size, a.num_classes, a.calls, a.seed)
    print(json.dumps(r.__dict__))


if __name__ == "__main__":
    main()
