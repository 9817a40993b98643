"""The rerun planner: which notebooks need the GPU machine, packed into the calls that machine is reached by.

Which notebooks (:func:`gather`). A notebook is in the plan when its stored GPU run is *stale* (:func:`nb.check.stale`
gives a message for it that asks for ``make gpu-run``) or, failing that, when it carries a waiver
(``metadata.mentor.waiver``): a *pending* rerun, a run kept across a library change that is still to be redone.
Messages that only ask for a render (``python scripts/nbtools.py render``) need no GPU: any machine renders. A split
page whose code cells include no measuring cell (book/intro.ipynb, say) only renders, so it is never in a plan.

How long each takes. Each run is estimated by the ``duration_s`` of its last stored GPU run, nothing more: the
library change that made it stale can make the rerun slower or faster, the run's render is not counted, and a
notebook with no stored duration is *unknown*. Read the plan as an estimate, and leave room.

How they are packed (:func:`pack`). The GPU machine is reached by calls of at most 10 minutes each; a call runs up
to :data:`CALL_LIMIT_S`, of which :data:`CALL_OVERHEAD_S` install the carried wheels and ``mentor``. Runs are taken
in the order of :data:`PRIORITY`, except that a notebook that reads another's results (:data:`nb.book.READS`) is
moved to just after the last of those in the plan (as :func:`nb.book.run_order` orders a ``gpu-run``). Each run then
goes into the first call that still has room for it and that is not earlier than the calls of the notebooks it
reads (first-fit). A run longer than one call can hold gets a call of its own, started in the background with
scripts/device_job.sh, which waits on it over several calls; a run of unknown duration gets a call of its own too,
counted as a full call. Chapter 12 needs two GPUs (:data:`TWO_GPUS`): it gets a call of its own on the two-GPU
kind, after the one-GPU calls.

What fits in a stretch. GPU time comes in stretches of :data:`STRETCH_S` a session, and a fresh machine first takes
:data:`MACHINE_START_S` to start. Walking the one-GPU calls in order, a call is in the first stretch while the start
plus every call so far, itself included, stays within the stretch. Two-GPU calls are never counted in it.

For each call, :func:`command` is the shell command to run on the GPU machine (it packs the notebooks and results
into ``$OUT/results.tgz``, also when the run failed part way) and :func:`carry` the ignored folders it needs.
``python scripts/nbtools.py plan [NB ...]`` prints the plan (:func:`main`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import nbformat

from nb.book import BOOK, READS, default_notebooks, run_order
from nb.check import stale
from nb.hashes import code_cells, is_split

NEXT = "next"
"""The folder of book/ that holds chapters prepared for their next GPU run (book/next/README.md)."""
CALL_LIMIT_S = 540.0
"""Seconds one call may take, wheels installed and notebooks run: 9 minutes, under the 10 a call is allowed."""
CALL_OVERHEAD_S = 40.0
"""Seconds each call spends before its first notebook: installing the carried wheels (.whl/install.sh) and mentor."""
MACHINE_START_S = 120.0
"""Seconds a fresh machine takes to start, counted against the stretch."""
STRETCH_S = 1500.0
"""Seconds of GPU time in one stretch of a session: 25 minutes."""
PRIORITY = ("09_when_it_matters.ipynb", "11_reading_values.ipynb", "14_compile.ipynb", "16_frameworks.ipynb",
            "10_macro_and_collections.ipynb", "08_summary.ipynb",
            "01_baseline.ipynb", "02_naive_metrics.ipynb", "03_profiler.ipynb", "04_record_function.ipynb",
            "05_weight.ipynb", "06_nan_check.ipynb", "07_device_and_ddp.ipynb", "13_since_1_6_1.ipynb")
"""The order in which reruns are taken: the chapters whose measurements the book's argument rests on first, then
chapter 10 and the summary, then part I and chapter 13; a notebook not listed comes after, by name."""
TWO_GPUS = ("12_two_gpus.ipynb",)
"""Notebooks that need two GPUs. (Their stored ``provenance.gpu_count`` says 2, but that counts the machine's GPUs,
not what the notebook needs: a one-GPU chapter run on a two-GPU machine records 2 as well.)"""
OLD_RELEASE = "13_since_1_6_1.ipynb"
"""The notebook that needs torchmetrics 1.6.1 beside the installed release (from the carried .whl-old/)."""
TOO_LONG = "too long for one call"
UNKNOWN = "unknown duration"
GPU_RUN = "make gpu-run"
"""What a message of :func:`nb.check.stale` says when only a GPU run (or a waiver) renews the notebook."""
OLD_SITE = ".venv/torchmetrics-1.6.1"
INSTALL = ("bash .whl/install.sh && export PYTHONPATH=/tmp/site:$PYTHONPATH && "
           "python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . && ")
INSTALL_OLD = (f"mkdir -p {OLD_SITE} && python3 -m pip install -q --no-index --no-deps --target {OLD_SITE} "
               f".whl-old/*.whl && touch {OLD_SITE}/.installed && ")
PACK = "; tar -czf $OUT/results.tgz book/*.ipynb book/results book/traces"
COMMAND_LIMIT = 2000
"""Characters a command on the GPU machine may have."""


@dataclass(frozen=True)
class PlannedRun:
    """A notebook to run again: its file name, the seconds of its last stored GPU run (None when it has none),
    why (``"stale"`` or ``"pending"``, a waived run) and how many GPUs it needs."""
    name: str
    seconds: float | None
    why: str
    gpus: int = 1


@dataclass(frozen=True)
class Call:
    """The runs of one call to the GPU machine, its estimated seconds (the install included), whether it is in the
    first stretch, the GPUs it needs and its flag: "", :data:`TOO_LONG` or :data:`UNKNOWN`."""
    runs: tuple[PlannedRun, ...]
    seconds: float
    in_stretch: bool
    gpus: int
    flag: str = ""


def gather(notebooks: Sequence[Path]) -> list[PlannedRun]:
    """The notebooks of ``notebooks`` that need a GPU run: stale ones (a :func:`nb.check.stale` message of theirs
    asks for ``make gpu-run``), then, of the rest, those carrying a waiver; in the order given. A split page with no
    measuring cell, and a notebook that cannot be read (``check`` reports it), are left out."""
    runs = []
    for path in map(Path, notebooks):
        try:
            nb = nbformat.read(path, as_version=4)
        except Exception:  # noqa: BLE001 - nbformat raises several types; stale() names the problem
            continue
        if is_split(nb) and not code_cells(nb, "measure"):
            continue  # a page whose cells all present: it only renders
        meta = nb.metadata.get("mentor", {})
        if any(GPU_RUN in message for message in stale([path])):
            why = "stale"
        elif meta.get("waiver"):
            why = "pending"
        else:
            continue
        seconds = meta.get("duration_s")
        runs.append(PlannedRun(path.name, None if seconds is None else float(seconds), why,
                               2 if path.name in TWO_GPUS else 1))
    return runs


def ordered(runs: Sequence[PlannedRun], priority: Sequence[str] = PRIORITY) -> list[PlannedRun]:
    """``runs`` by ``priority`` (names not in it after, sorted), each reader moved to just after the last of the
    runs whose results it reads (:func:`nb.book.run_order`)."""
    rank = {name: i for i, name in enumerate(priority)}
    by_rank = sorted(runs, key=lambda r: (rank.get(r.name, len(rank)), r.name))
    by_name = {r.name: r for r in runs}
    return [by_name[p.name] for p in run_order([Path(r.name) for r in by_rank])]


def pack(runs: Sequence[PlannedRun], call_limit_s: float = CALL_LIMIT_S, overhead_s: float = CALL_OVERHEAD_S,
         start_s: float = MACHINE_START_S, stretch_s: float = STRETCH_S,
         priority: Sequence[str] = PRIORITY) -> list[Call]:
    """``runs`` packed into calls (see the module's docstring): the one-GPU calls in the order they are to be
    made, then a call of its own for each run that needs two GPUs."""
    groups: list[tuple[list[PlannedRun], str]] = []  # one-GPU calls: runs, flag
    two: list[tuple[list[PlannedRun], str]] = []
    where: dict[str, int] = {}  # name -> index of its one-GPU call
    for run in ordered(runs, priority):
        flag = (UNKNOWN if run.seconds is None
                else TOO_LONG if run.seconds > call_limit_s - overhead_s else "")
        if run.gpus > 1:
            two.append(([run], flag))
            continue
        first = max((where[name] for name in READS.get(run.name, ()) if name in where), default=0)
        slot = None if flag else next(
            (i for i in range(first, len(groups)) if not groups[i][1]
             and overhead_s + sum(r.seconds for r in groups[i][0]) + run.seconds <= call_limit_s), None)
        if slot is None:
            groups.append(([], flag))
            slot = len(groups) - 1
        groups[slot][0].append(run)
        where[run.name] = slot

    def seconds(group: list[PlannedRun], flag: str) -> float:
        return call_limit_s if flag == UNKNOWN else overhead_s + sum(r.seconds for r in group)

    calls, total = [], start_s
    for group, flag in groups:
        total += seconds(group, flag)
        calls.append(Call(tuple(group), seconds(group, flag), total <= stretch_s, 1, flag))
    calls += [Call(tuple(group), seconds(group, flag), False, max(r.gpus for r in group), flag) for group, flag in two]
    return calls


def command(call: Call) -> str:
    """The shell command that runs ``call`` on the GPU machine, from the repository root: install, ``gpu-run`` its
    notebooks (in :func:`nb.book.run_order`), then pack the notebooks and results into ``$OUT/results.tgz`` (also
    when the run failed, so that the notebooks it finished come back). A call :data:`TOO_LONG` instead starts the
    run in the background with scripts/device_job.sh, which installs, waits and packs by itself."""
    notebooks = " ".join(f"book/{p.name}" for p in run_order([Path(r.name) for r in call.runs]))
    gpu_run = f"python3 scripts/nbtools.py gpu-run {notebooks}"
    if call.flag == TOO_LONG:
        text = f"MODE=start JOB='{gpu_run}' bash scripts/device_job.sh"
    else:
        text = INSTALL + (INSTALL_OLD if _needs_old(call) else "") + gpu_run + PACK
    if len(text) > COMMAND_LIMIT:
        raise ValueError(f"the command of a call of {len(call.runs)} notebooks has {len(text)} characters, over "
                         f"{COMMAND_LIMIT}: split the call")
    return text


def carry(call: Call) -> list[str]:
    """The ignored folders that ``call``'s command needs on the GPU machine."""
    return [".whl", ".whl-old"] if _needs_old(call) else [".whl"]


def _needs_old(call: Call) -> bool:
    return any(r.name == OLD_RELEASE for r in call.runs)


def _secs(seconds: float | None) -> str:
    return "unknown" if seconds is None else f"{seconds:.0f} s"


def format_plan(calls: Sequence[Call], start_s: float = MACHINE_START_S, stretch_s: float = STRETCH_S,
                call_limit_s: float = CALL_LIMIT_S) -> str:
    """``calls`` as text: a table of the runs, each call with its runs, seconds, stretch, flags, carry and command,
    and a last line saying how much of the one-GPU work fits in one stretch."""
    runs = [r for call in calls for r in call.runs]
    width = max([len("notebook")] + [len(r.name) for r in runs])
    minutes = f"{stretch_s / 60:g}-minute"
    lines = [f"{'notebook':<{width}}  {'why':<7}  last GPU run",
             *(f"{r.name:<{width}}  {r.why:<7}  {_secs(r.seconds)}" for r in runs), ""]
    for number, call in enumerate(calls, 1):
        where = ("two GPUs: run it on the two-GPU kind, apart from the one-GPU stretch" if call.gpus > 1
                 else f"in the first {minutes} stretch" if call.in_stretch else "in a later stretch")
        lines.append(f"Call {number}: ~{call.seconds:.0f} s, {where}")
        lines += [f"  {r.name} ({_secs(r.seconds)}, {r.why})" for r in call.runs]
        lines += [f"  {r.name}: its next version waits in book/{NEXT}/{r.name}: copy it into book/ first, as "
                  f"book/{NEXT}/README.md says" for r in call.runs if (BOOK / NEXT / r.name).is_file()]
        if call.flag == TOO_LONG:
            lines += ["  too long for one call: start it in the background with scripts/device_job.sh (the command",
                      "  below), which waits on it over several calls: then run `bash scripts/device_job.sh` in each",
                      "  later call, on the same machine, until it says 'job done'"]
        elif call.flag == UNKNOWN:
            lines.append(f"  unknown duration: no stored GPU run to time it by; counted as a full call "
                         f"({call_limit_s:.0f} s)")
        lines += [f"  carry: {', '.join(carry(call))}", "  command:", f"    {command(call)}", ""]
    one = [c for c in calls if c.gpus == 1]
    fit = [c for c in one if c.in_stretch]
    lines.append(f"{len(fit)} of {len(one)} one-GPU calls ({start_s + sum(c.seconds for c in fit):.0f} s of "
                 f"{start_s + sum(c.seconds for c in one):.0f} s) fit in one {minutes} stretch, machine start included")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python scripts/nbtools.py plan [NB ...]``: print the plan for ``argv`` (default: every book/*.ipynb)."""
    notebooks = [Path(a) for a in argv] if argv else default_notebooks()
    calls = pack(gather(notebooks))
    print(format_plan(calls) if calls else "nothing to rerun")
    return 0
