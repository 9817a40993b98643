"""Device choice, run profiles (``full`` on CUDA, ``smoke`` on CPU) and the environment report."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import platform
import shutil
import subprocess
import textwrap
import time
from dataclasses import asdict, dataclass, replace
from importlib import metadata
from typing import Any

import torch

PROFILE_VARIABLE = "MENTOR_PROFILE"
"""Environment variable that picks the run profile: ``full`` or ``smoke``."""


@dataclass(frozen=True)
class Profile:
    """The sizes one run uses: the model's input, the batch and how long to measure.

    Example:
        >>> p = get_profile("smoke")
        >>> p.name, p.device.type
        ('smoke', 'cpu')
    """

    name: str
    device: torch.device
    image_size: int
    batch_size: int
    num_classes: int
    warmup: int
    """Steps run before timing starts in each measured run."""
    steps: int
    """Timed steps in each measured run."""
    rounds: int
    """Interleaved rounds in a comparison."""
    report_every: int
    """Steps between compute/report/reset of the metrics."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ValueError(f"Profile.name must be a str such as 'smoke', got {self.name!r}.")
        if not isinstance(self.device, torch.device):
            raise ValueError(f"Profile.device must be a torch.device, got {self.device!r}; "
                             "pass e.g. torch.device('cuda') or torch.device('cpu').")
        for field, minimum in _MINIMUMS.items():
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"Profile.{field} must be an int >= {minimum}, got {value!r}; "
                                 f"pass e.g. {field}={_SIZES['smoke'][field]}.")

    @property
    def is_cuda(self) -> bool:
        """True when this profile runs on a CUDA device."""
        return self.device.type == "cuda"

    def __repr__(self) -> str:
        """The dataclass repr, wrapped at 80 columns so that it fits a notebook output.

        Example:
            >>> print(repr(get_profile("smoke")).splitlines()[0])
            Profile(name='smoke', device=device(type='cpu'), image_size=32, batch_size=8,
        """
        fields = [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)]
        lines, indent = ["Profile("], " " * len("Profile(")
        for i, item in enumerate(fields):
            item += ")" if i == len(fields) - 1 else ","
            if len(lines[-1]) + 1 + len(item) > 80 and lines[-1].strip() not in ("", "Profile("):
                lines.append(indent)  # a field never splits, even when it alone is longer than 80
            lines[-1] += ("" if lines[-1].endswith("(") or not lines[-1].strip() else " ") + item
        return "\n".join(lines)

    def with_(self, **changes: Any) -> Profile:
        """A copy with some fields changed, for example ``profile.with_(steps=20)``.

        The int fields are checked: ``warmup`` and ``report_every`` may be 0, ``num_classes`` must be
        at least 2 and the others at least 1; anything else raises ``ValueError`` naming the field.

        Example:
            >>> get_profile("smoke").with_(steps=20).steps
            20
            >>> get_profile("smoke").with_(steps=-1)
            Traceback (most recent call last):
            ...
            ValueError: Profile.steps must be an int >= 1, got -1; pass e.g. steps=3.
        """
        unknown = set(changes) - set(asdict(self))
        if unknown:
            raise TypeError(f"Profile has no field(s) {sorted(unknown)}; fields are {sorted(asdict(self))}.")
        return replace(self, **changes)


_SIZES: dict[str, dict[str, int]] = {
    # The article's setting: ResNet-18 on 224-pixel images, batch 128, 1000 classes.
    "full": dict(image_size=224, batch_size=128, num_classes=1000, warmup=10, steps=60, rounds=5, report_every=50),
    # Small enough that CI executes every notebook on two CPU cores in a few minutes.
    "smoke": dict(image_size=32, batch_size=8, num_classes=1000, warmup=1, steps=3, rounds=2, report_every=2),
}
PROFILES: tuple[str, ...] = tuple(_SIZES)
_MINIMUMS: dict[str, int] = dict(image_size=1, batch_size=1, num_classes=2, warmup=0, steps=1, rounds=1,
                                 report_every=0)
"""The smallest value of each int field: no warm-up and no reports (0) are valid, cross-entropy needs 2 classes."""


def pick_device(prefer: str | None = None) -> torch.device:
    """The device to run on: ``prefer`` if given, else CUDA when available, else the CPU.

    Example:
        >>> pick_device("cpu")
        device(type='cpu')
    """
    if prefer is not None:
        if not isinstance(prefer, str):
            raise TypeError(f"prefer must be a device string such as 'cuda' or 'cpu', not {type(prefer).__name__}.")
        device = torch.device(prefer)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("prefer='cuda' was asked for but torch sees no CUDA device; pass 'cpu' or None.")
        return device
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def get_profile(name: str | None = None) -> Profile:
    """The run profile: ``name``, else ``$MENTOR_PROFILE``, else ``full`` with CUDA and ``smoke`` without.

    ``full`` runs on the GPU and needs CUDA; ``smoke`` always runs on the CPU.

    Example:
        >>> get_profile("smoke").batch_size
        8
    """
    if name is None:
        name = os.environ.get(PROFILE_VARIABLE) or ("full" if torch.cuda.is_available() else "smoke")
    if name not in _SIZES:
        raise ValueError(f"Unknown profile {name!r}: pass one of {list(PROFILES)} (or set {PROFILE_VARIABLE}).")
    if name == "full" and not torch.cuda.is_available():
        raise RuntimeError(
            "The 'full' profile measures on a CUDA GPU and torch sees none here; "
            f"use get_profile('smoke') or set {PROFILE_VARIABLE}=smoke."
        )
    device = torch.device("cuda") if name == "full" else torch.device("cpu")
    return Profile(name=name, device=device, **_SIZES[name])


def _skip_message(profile: Profile, what: str) -> str:
    return (
        f"[{profile.name} profile on {profile.device.type}] {what} need a CUDA device: skipped here. "
        "The stored book shows the GPU run."
    )


def needs_cuda(profile: Profile, what: str) -> bool:
    """Print why a cell is skipped and return True when ``profile`` has no CUDA device.

    Hidden notebook cells whose point needs a GPU (a sync count, a GPU timeline) start with
    ``if not needs_cuda(profile, "..."):`` so that the smoke run says so instead of
    printing zeros that look like results. Visible cells use the comment of
    :data:`NEEDS_CUDA_MARK` instead (:func:`skip_without_cuda`).

    Example:
        >>> needs_cuda(get_profile("smoke"), "sync counts")
        [smoke profile on cpu] sync counts need a CUDA device: skipped here. The stored book shows the GPU run.
        True
    """
    if not isinstance(profile, Profile):
        raise TypeError(f"profile must be a mentor.lab.env.Profile (from get_profile()), not {type(profile).__name__}.")
    if profile.is_cuda:
        return False
    print(_skip_message(profile, what))
    return True


NEEDS_CUDA_MARK = "# needs CUDA:"
"""The first line of a visible cell whose point needs a GPU: ``# needs CUDA: sync counts``."""


def skip_without_cuda(lines: list[str], profile: Profile) -> list[str]:
    """A cell's lines, or, when they start with :data:`NEEDS_CUDA_MARK` and ``profile`` has no CUDA device,
    one line that prints why the cell is skipped.

    :func:`chapter_run` installs this as an IPython input transformer in the smoke run, so a visible cell
    carries a one-line comment that says it needs a GPU instead of an ``if not needs_cuda(...)`` block.
    On a CUDA profile every cell runs as written.

    Example:
        >>> skip_without_cuda(["# needs CUDA: sync counts\\n", "print(1)\\n"], get_profile("smoke"))
        ["print('[smoke profile on cpu] sync counts need a CUDA device: skipped here. The stored book shows the GPU run.')\\n"]
        >>> skip_without_cuda(["print(1)\\n"], get_profile("smoke"))
        ['print(1)\\n']
    """
    if not isinstance(profile, Profile):
        raise TypeError(f"profile must be a mentor.lab.env.Profile (from get_profile()), not {type(profile).__name__}.")
    first = next((line.strip() for line in lines if line.strip()), "")
    if profile.is_cuda or not first.startswith(NEEDS_CUDA_MARK):
        return lines
    what = first[len(NEEDS_CUDA_MARK):].strip()
    if not what:
        raise ValueError(f"A cell's {NEEDS_CUDA_MARK!r} line must say what needs CUDA, e.g. '{NEEDS_CUDA_MARK} sync counts'.")
    return [f"print({_skip_message(profile, what)!r})\n"]


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _driver_version() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


def environment_report() -> dict[str, Any]:
    """Versions and hardware of this run, stored as provenance with each notebook.

    Example:
        >>> sorted(environment_report())[:3]
        ['cpu_count', 'cuda', 'date']
    """
    cuda = torch.cuda.is_available()
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torchvision": _version("torchvision"),
        "torchmetrics": _version("torchmetrics"),
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "driver": _driver_version() if cuda else None,
        "cpu_count": os.cpu_count(),
    }


@dataclass
class ChapterRun:
    """The hardware and wall time of one run of a chapter, for the book's "run this chapter" box.

    Made by :func:`chapter_run` in a chapter's first cell; :meth:`finish` in its last cell.

    Example:
        >>> run = ChapterRun("NVIDIA H200", started=0.0)
        >>> run.seconds(now=125.0)
        125.0
    """

    hardware: str
    started: float
    skipper: Any = None
    """The input transformer :func:`chapter_run` installed in the smoke run (:func:`skip_without_cuda`), or None."""

    def seconds(self, now: float | None = None) -> float:
        """Seconds since the run started (``now`` defaults to ``time.perf_counter()``)."""
        return (time.perf_counter() if now is None else now) - self.started

    def finish(self) -> float:
        """Glue ``run_seconds`` (the wall time of the cells so far) for the box; returns it."""
        from myst_nb import glue

        seconds = self.seconds()
        glue("run_seconds", round(seconds), display=False)
        shell = _ipython()
        if self.skipper is not None and shell is not None and self.skipper in shell.input_transformers_post:
            shell.input_transformers_post.remove(self.skipper)
        return seconds


def _ipython() -> Any:
    """The running IPython shell, or None outside one."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def chapter_run() -> ChapterRun:
    """Start timing a chapter's run and glue ``run_hardware``: the GPU's name, or the CPU smoke run.

    The chapter's box cites both values of its stored run: ``run_hardware`` here and
    ``run_seconds`` from :meth:`ChapterRun.finish`. The time covers the cells between
    the two calls, not the kernel's start. Without CUDA, it also installs
    :func:`skip_without_cuda` in the running IPython shell, so that cells marked
    ``# needs CUDA: ...`` print why they are skipped; :meth:`ChapterRun.finish` removes it.
    """
    from myst_nb import glue

    profile = get_profile()
    if profile.device.type == "cuda":
        hardware = f"one {torch.cuda.get_device_name(profile.device)} ({profile.name} profile)"
    else:
        hardware = f"the CPU ({profile.name} profile, not a measurement)"
    glue("run_hardware", hardware, display=False)
    skipper = None
    shell = _ipython()
    if shell is not None and not profile.is_cuda:
        def skipper(lines: list[str]) -> list[str]:
            return skip_without_cuda(lines, profile)

        shell.input_transformers_post.append(skipper)
    return ChapterRun(hardware, time.perf_counter(), skipper)


@dataclass(frozen=True)
class StoredRun:
    """What ``make gpu-run`` stored in one notebook's metadata (``metadata["mentor"]``)."""

    notebook: str
    executed: str | None
    """ISO date and time (UTC) of the run, or None when the notebook has no stored run."""
    seconds: float | None
    mentor_sha256: str | None
    provenance: dict[str, Any]
    """:func:`environment_report` of the machine that ran it."""
    pending: bool = False
    """Whether the run is kept, pending a rerun, across a later change of ``mentor`` (its metadata carries a waiver:
    ``python scripts/nbtools.py waive``)."""


def stored_runs(folder: str | os.PathLike[str] = ".", skip: tuple[str, ...] = ()) -> list[StoredRun]:
    """The stored run of every notebook in ``folder`` (sorted by name), without the names in ``skip``.

    Example:
        >>> stored_runs("no-such-folder")
        Traceback (most recent call last):
        ...
        FileNotFoundError: stored_runs reads the notebooks of a folder, and no-such-folder is not one; pass the book's folder.
    """
    import json
    from pathlib import Path

    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"stored_runs reads the notebooks of a folder, and {folder} is not one; "
                                "pass the book's folder.")
    runs = []
    for path in sorted(root.glob("*.ipynb")):
        if path.name in skip:
            continue
        try:
            meta = json.loads(path.read_text(encoding="utf-8")).get("metadata", {}).get("mentor")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as err:
            raise ValueError(f"{path} is not a notebook (JSON with a metadata object): {err}") from None
        if meta is None:
            runs.append(StoredRun(path.name, None, None, None, {}))
        else:
            runs.append(StoredRun(path.name, meta.get("executed"), meta.get("duration_s"), meta.get("mentor_sha256"),
                                  meta.get("provenance") or {}, bool(meta.get("waiver"))))
    return runs


_NOTEBOOK_COLUMN = 27
"""The narrowest notebook column of :func:`stored_runs_table` (the width it had for the book's short names)."""
_TABLE_WIDTH = 80


def stored_runs_table(runs: list[StoredRun]) -> str:
    """The runs as a table of at most 80 columns, then one line per machine and software they ran on, and one that
    names the runs kept pending a rerun (:attr:`StoredRun.pending`), when there are any.

    The notebook column is as wide as the longest name and two spaces, at least 27 columns; a name too long for
    the table to stay within 80 columns (more than 39 characters) is cut, ending in "…". The machines' lines
    name the notebooks whole.

    Example:
        >>> env = {"gpu": "NVIDIA H200", "torch": "2.11.0", "torchmetrics": "1.9.0"}
        >>> print(stored_runs_table([StoredRun("a.ipynb", "2026-11-30T23:37:04+00:00", 70.46, "dfec03ca303d99", env,
        ...                                    pending=True),
        ...                          StoredRun("b.ipynb", None, None, None, {})]))
        notebook                   executed (UTC)    seconds  mentor
        a.ipynb                    2026-11-30 23:37     70.5  dfec03ca303d
        b.ipynb                    not executed by make gpu-run
        a.ipynb: NVIDIA H200, torch 2.11.0, torchmetrics 1.9.0
        pending a rerun (measured with an earlier mentor): a.ipynb
    """
    # the columns after the notebook's take 17 + 8 + 2 + 12 = 39 of the 80
    width = min(max([_NOTEBOOK_COLUMN] + [len(run.notebook) + 2 for run in runs]), _TABLE_WIDTH - 39)

    def name(notebook: str) -> str:
        return notebook if len(notebook) <= width - 2 else notebook[:width - 3] + "…"

    lines = [f"{'notebook':<{width}}{'executed (UTC)':<17}{'seconds':>8}  mentor"]
    machines: dict[str, list[str]] = {}
    for run in runs:
        if run.executed is None:
            lines.append(f"{name(run.notebook):<{width}}not executed by make gpu-run")
            continue
        when = run.executed[:16].replace("T", " ")
        seconds = "-" if run.seconds is None else f"{run.seconds:.1f}"
        lines.append(f"{name(run.notebook):<{width}}{when:<17}{seconds:>8}  {(run.mentor_sha256 or '-')[:12]}")
        env = run.provenance
        machine = f"{env.get('gpu') or 'CPU'}, torch {env.get('torch')}, torchmetrics {env.get('torchmetrics')}"
        machines.setdefault(machine, []).append(run.notebook)
    for machine, names in machines.items():
        who = "every run above" if len(names) == len(runs) and len(runs) > 1 else ", ".join(names)
        lines.append(f"{who}: {machine}")
    pending = [run.notebook for run in runs if run.pending]
    if pending:
        lines.append(textwrap.fill(f"pending a rerun (measured with an earlier mentor): {', '.join(pending)}",
                                   _TABLE_WIDTH, subsequent_indent="  "))
    return "\n".join(lines)
