"""Logging computed metric values to TensorBoard and reading them back (chapter 2; drawn by
:func:`mentor.lab.plots.plot_scalars`).

Example:
    >>> import tempfile
    >>> from torch.utils.tensorboard import SummaryWriter
    >>> with tempfile.TemporaryDirectory() as d:
    ...     w = SummaryWriter(d); log_to_tensorboard(w, {"accuracy": 0.5}, step=1); w.close()
    ...     read_tensorboard(d)
    {'train/accuracy': [(1, 0.5)]}
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def log_to_tensorboard(writer: Any, values: Mapping[str, float], step: int, prefix: str = "train/") -> None:
    """Write computed metric values as scalars to a ``torch.utils.tensorboard.SummaryWriter``.

    Example:
        >>> import tempfile
        >>> from torch.utils.tensorboard import SummaryWriter
        >>> with tempfile.TemporaryDirectory() as d:
        ...     w = SummaryWriter(d); log_to_tensorboard(w, {"accuracy": 0.5}, step=1); w.close()
    """
    if not hasattr(writer, "add_scalar"):
        raise TypeError(f"writer must be a SummaryWriter (with add_scalar), not {type(writer).__name__}.")
    for name, value in values.items():
        if name == "step":
            continue
        writer.add_scalar(prefix + name, float(value), global_step=int(step))


def read_tensorboard(logdir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Read the scalars back from the event files under ``logdir``: ``{tag: [(step, value), ...]}``.

    Example:
        >>> read_tensorboard("no-such-dir")
        Traceback (most recent call last):
        ...
        FileNotFoundError: no TensorBoard event files under 'no-such-dir'; pass the logdir given to SummaryWriter.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = Path(logdir)
    files = sorted(logdir.rglob("events.out.tfevents.*")) if logdir.is_dir() else []
    if not files:
        raise FileNotFoundError(
            f"no TensorBoard event files under '{logdir}'; pass the logdir given to SummaryWriter."
        )
    out: dict[str, list[tuple[int, float]]] = {}
    for directory in sorted({f.parent for f in files}):
        acc = EventAccumulator(str(directory), size_guidance={"scalars": 0})
        try:
            acc.Reload()
        except Exception as err:  # tensorboard raises its own DataLossError and others on corrupt files
            raise ValueError(f"the event files under '{directory}' cannot be read ({type(err).__name__}: {err}); "
                             "pass a logdir written by torch.utils.tensorboard.SummaryWriter.") from None
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    if not out:
        raise ValueError(f"the event files under '{logdir}' hold no scalars ({len(files)} file(s) read): "
                         "log some with log_to_tensorboard (SummaryWriter.add_scalar) first.")
    return {tag: sorted(points) for tag, points in out.items()}
