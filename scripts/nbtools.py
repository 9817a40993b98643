#!/usr/bin/env python3
"""Run, render and check the book's notebooks: a CPU smoke run, the GPU run, renders from stored measurements,
and a staleness check.

    python scripts/nbtools.py smoke [-j N] [NB ...]  # execute copies with MENTOR_PROFILE=smoke; the repo is untouched
    python scripts/nbtools.py gpu-run [NB ...]  # execute in place with MENTOR_PROFILE=full and store provenance
                                                # (a split notebook: its measuring cells, then a render)
    python scripts/nbtools.py render [NB ...]   # re-execute the presenting cells of split notebooks from their stored
                                                # measurements, on any machine (the CPU too), and store the outputs
    python scripts/nbtools.py check [--render] [NB ...]  # fail if a stored run, measurement or render is not current
                                                # (--render: also render a copy and compare every output)
    python scripts/nbtools.py convert NB [--results PATH ...]  # split NB's current stored run: the cells tagged
                                                # 'measure' and the files they wrote become its measurement
    python scripts/nbtools.py waive NB --reason "needs two GPUs; none available" [--rename OLD=NEW ...]
                                                # accept the mentor change since NB's stored run, for a reason
                                                # (--rename: a module that moved, imported under its new name);
                                                # of a split notebook, the change of its measuring cells and modules

Without NB, every book/*.ipynb is used, sorted; gpu-run executes book/intro.ipynb, then
book/reproducibility.ipynb, last. The work is done by the modules of scripts/nb/, one per job: book.py (which
notebooks, in which order), hashes.py, outputs.py, runs.py (executing), gpu.py (the GPU run), render.py,
convert.py, check.py and waivers.py.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from nb.book import BOOK, default_notebooks, display_path, run_order  # noqa: E402
from nb.check import stale  # noqa: E402
from nb.convert import ConversionRefused, convert  # noqa: E402
from nb.gpu import gpu_run  # noqa: E402
from nb.hashes import is_split  # noqa: E402
from nb.render import render, render_differences  # noqa: E402
from nb.runs import NotebookFailed, smoke, smoke_each  # noqa: E402
from nb.waivers import WaiverRefused, waive, waived  # noqa: E402


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for command, text in [
        ("smoke", "execute copies on the CPU (MENTOR_PROFILE=smoke); fail on any error"),
        ("gpu-run", "execute in place (MENTOR_PROFILE=full) and store outputs and provenance"),
        ("render", "re-execute the presenting cells of split notebooks from their stored measurements (any machine)"),
        ("check", "fail if a notebook's stored GPU run, measurement or render is not current (code, mentor source, "
                  "outputs, tags)"),
    ]:
        sub = commands.add_parser(command, help=text, description=text)
        sub.add_argument("notebooks", nargs="*", type=Path, metavar="NB",
                         help="default: every book/*.ipynb" + (" that is split" if command == "render" else ""))
        if command == "check":
            sub.add_argument("--render", action="store_true",
                             help="also render each split notebook in a copy and compare its outputs with the stored ones")
        if command == "smoke":
            sub.add_argument("-j", "--jobs", type=int, default=1,
                             help="notebooks run at once, each in a copy of its own (default: 1, one copy in turn)")
            sub.add_argument("--json", type=Path, metavar="FILE",
                             help="write each notebook's outcome to FILE ({NB: {seconds} or {error}}) and run every "
                                  "notebook, also after a failure")
    text = ("split NB's current stored run into a measurement (its cells tagged 'measure' and the files they wrote) "
            "and presenting cells, which any machine then renders")
    sub = commands.add_parser("convert", help=text, description=text)
    sub.add_argument("notebook", type=Path, metavar="NB")
    sub.add_argument("--results", action="append", default=[], metavar="PATH",
                     help="a file or folder beside NB that its measuring cells wrote, e.g. results/ch12_sync_cost "
                          "(repeat for each)")
    text = ("accept the change of the mentor modules NB imports since its stored run, for a reason the "
            "rendered page shows (a rerun that needs hardware that is not available)")
    sub = commands.add_parser("waive", help=text, description=text)
    sub.add_argument("notebook", type=Path, metavar="NB")
    sub.add_argument("--reason", required=True, help='e.g. "needs two GPUs; none available"')
    sub.add_argument("--rename", action="append", default=[], metavar="OLD=NEW",
                     help="a module that moved, e.g. mentor.env=mentor.lab.env: accept code cells that differ from "
                          "the stored run's only by importing it under its new name (repeat for each module)")
    args = parser.parse_args(argv)
    if args.command == "convert":
        try:
            record = convert(args.notebook, args.results)
        except (ConversionRefused, FileNotFoundError) as error:
            print(error, file=sys.stderr)
            return 1
        measured = record.get("executed") or "none: every cell presents"
        print(f"{display_path(args.notebook)}: split; its measurement ({measured}) keeps "
              f"{len(record.get('results', {}))} result file(s); now render it: "
              f"python scripts/nbtools.py render {display_path(args.notebook)}")
        return 0
    if args.command == "waive":
        pairs = [r.partition("=") for r in args.rename]
        bad = [r for r, (_, eq, _) in zip(args.rename, pairs) if not eq]
        if bad:
            parser.error(f"--rename takes OLD=NEW, e.g. mentor.env=mentor.lab.env; got {bad[0]!r}")
        try:
            waiver = waive(args.notebook, args.reason, {old: new for old, _, new in pairs})
        except (WaiverRefused, FileNotFoundError) as error:
            print(error, file=sys.stderr)
            return 1
        renames = ", ".join(f"{old} -> {new}" for old, new in waiver.get("renames", {}).items())
        print(f"{display_path(args.notebook)}: waived the change of {', '.join('mentor/' + m for m in waiver['modules'])}"
              + (f"; code cells accepted with the renames {renames}" if renames else ""))
        return 0
    notebooks = args.notebooks or default_notebooks()
    if args.command == "render" and not args.notebooks:
        notebooks = [p for p in notebooks if is_split(_read(p))]
    if not notebooks:
        print(f"no notebooks given and none in {display_path(BOOK)}/", file=sys.stderr)
        return 1
    try:
        if args.command == "smoke" and args.json:
            import json

            # each notebook in a copy of its own, so that one failure does not stop the others
            outcomes = (smoke_each(notebooks, jobs=args.jobs) if args.jobs > 1
                        else {nb: smoke_each([nb])[nb] for nb in notebooks})
            record = {str(nb): {"error": str(o)} if isinstance(o, NotebookFailed) else {"seconds": o}
                      for nb, o in outcomes.items()}
            args.json.write_text(json.dumps(record, indent=1))
            failed = [nb for nb, o in record.items() if "error" in o]
            print(f"{len(record) - len(failed)} of {len(record)} notebook(s) ran; wrote {args.json}")
            return 1 if failed else 0
        if args.command == "smoke":
            for name, seconds in smoke(notebooks, jobs=args.jobs):
                print(f"{name}: ok ({seconds:.1f} s)")
        elif args.command == "gpu-run":
            gpu_run(notebooks)
        elif args.command == "render":
            for nb_path in run_order([Path(p) for p in notebooks]):
                print(f"{display_path(nb_path)}: rendered ({render(nb_path):.1f} s)", flush=True)
        else:
            messages = stale(notebooks)
            if args.render:
                for nb_path in notebooks:
                    if is_split(_read(nb_path)):
                        messages += render_differences(nb_path)
            for message in messages:
                print(message)
            if messages:
                return 1
            notes = waived(notebooks)
            split = sum(is_split(_read(nb_path)) for nb_path in notebooks)
            print(f"ok: {len(notebooks)} notebook(s) match their stored GPU run"
                  + (f" ({split} split: by {'their' if split > 1 else 'its'} measurement"
                     + (", and a fresh render" if args.render else "") + ")" if split else "")
                  + (f", {len(notes)} of them under a waiver:" if notes else ""))
            for note in notes:
                print(f"  {note}")
    except NotebookFailed as error:
        print(error, file=sys.stderr)
        return 1
    return 0


def _read(path: Path):
    import nbformat

    return nbformat.read(path, as_version=4)


if __name__ == "__main__":
    sys.exit(main())
