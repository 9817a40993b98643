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
    python scripts/nbtools.py waive NB ... --reason "the report no longer reads back" [--details TEXT]
    python scripts/nbtools.py waive --stale --reason "..."  # every stale run a waiver can accept
                                                # keep each run, pending a rerun, across the mentor change since
                                                # it (the page says so at its top, with the reason); of a split
                                                # notebook, the change of its measuring cells and modules too
                                                # (--rename OLD=NEW, one notebook: a module that moved)
    python scripts/nbtools.py pending [--readme]  # list the pending reruns (--readme: write them into README.md)
    python scripts/nbtools.py plan [NB ...]     # the stale and pending runs packed into GPU calls under 9 minutes

Without NB, every book/*.ipynb is used, sorted; gpu-run executes book/intro.ipynb, then
book/reproducibility.ipynb, last. The work is done by the modules of scripts/nb/, one per job: book.py (which
notebooks, in which order), hashes.py, outputs.py, runs.py (executing), gpu.py (the GPU run), render.py,
convert.py, check.py, waivers.py, plan.py and symbols.py (what of mentor a notebook's code can run).
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
from nb.plan import main as plan_main  # noqa: E402
from nb.waivers import (WaiverRefused, pending_markdown, waive, waive_many, waived,  # noqa: E402
                        write_readme_pending)


def _compare_renders(notebooks: Sequence[Path], out: Path) -> int:
    """``render --compare-json``: each notebook rendered in a copy and compared with its stored outputs, in turn;
    the outcomes go to ``out`` (written whole at the end, through a temporary file). Returns 1 if any differs or
    fails to render."""
    import json
    import time

    record: dict[str, dict] = {}
    for nb_path in notebooks:
        start = time.perf_counter()
        try:
            # rendered in a copy of the notebook's own folder (book/ for the book's chapters)
            record[str(nb_path)] = {"differences": render_differences(Path(nb_path), book=Path(nb_path).resolve().parent),
                                    "seconds": time.perf_counter() - start}
        except Exception as error:  # noqa: BLE001 - recorded, so that the other notebooks are still compared
            record[str(nb_path)] = {"error": f"{type(error).__name__}: {error}"}
    partial = out.with_name(out.name + ".partial")
    partial.write_text(json.dumps(record, indent=1))
    partial.replace(out)
    bad = [nb for nb, o in record.items() if o.get("error") or o.get("differences")]
    print(f"{len(record) - len(bad)} of {len(record)} notebook(s) render as stored; wrote {out}")
    return 1 if bad else 0


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
        if command == "render":
            sub.add_argument("--compare-json", type=Path, metavar="FILE",
                             help="write nothing to the notebooks: render each in a copy, compare its outputs with the "
                                  "stored ones and write FILE ({NB: {differences, seconds} or {error}})")
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
    text = ("keep each NB's stored run, pending a rerun, across the change of the mentor code it can run since "
            "then, for a reason the top of its page shows (a library change whose rerun waits for GPU time, or a run "
            "that needs hardware that is not available)")
    sub = commands.add_parser("waive", help=text, description=text)
    sub.add_argument("notebooks", nargs="*", type=Path, metavar="NB")
    sub.add_argument("--stale", action="store_true",
                     help="every book/*.ipynb whose stored run or measurement is stale (those a waiver cannot "
                          "accept are named, and the command then fails)")
    sub.add_argument("--reason", required=True,
                     help='at most 90 characters, in a reader\'s words: what changed and how it may move the '
                          'numbers, e.g. "the suite\'s report no longer reads back; these overheads include that read"')
    sub.add_argument("--details", help="a longer account, shown folded under the reason")
    sub.add_argument("--rename", action="append", default=[], metavar="OLD=NEW",
                     help="(one NB) a module that moved, e.g. mentor.env=mentor.lab.env: accept code cells that differ "
                          "from the stored run's only by importing it under its new name (repeat for each module)")
    text = "list the pending reruns: the stored runs kept under a waiver"
    sub = commands.add_parser("pending", help=text, description=text)
    sub.add_argument("--readme", action="store_true", help="write the list into README.md's stored-runs section")
    text = "list the notebooks that need the GPU machine, packed into calls of at most 9 minutes"
    sub = commands.add_parser("plan", help=text, description=text)
    sub.add_argument("notebooks", nargs="*", type=Path, metavar="NB", help="default: every book/*.ipynb")
    args = parser.parse_args(argv)
    if args.command == "plan":
        return plan_main([str(p) for p in args.notebooks])
    if args.command == "pending":
        if args.readme:
            print(f"{write_readme_pending(default_notebooks())}: pending reruns listed")
        else:
            print(pending_markdown(default_notebooks()))
        return 0
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
        if args.stale == bool(args.notebooks):
            parser.error("name the notebooks to waive, or pass --stale for every stale one (not both)")
        if args.rename and (args.stale or len(args.notebooks) != 1):
            parser.error("--rename applies to one notebook: name it alone")
        renames = {old: new for old, _, new in pairs}
        try:
            done, refused = waive_many(args.notebooks or None, args.reason, renames=renames, details=args.details)
        except WaiverRefused as error:  # the reason itself: one message, before any notebook
            print(error, file=sys.stderr)
            return 1
        for nb_path, waiver in done.items():
            moved = ", ".join(f"{old} -> {new}" for old, new in waiver.get("renames", {}).items())
            changed = ", ".join("mentor/" + m for m in waiver["modules"]) or "no module"
            print(f"{display_path(nb_path)}: pending a rerun; waived the change of {changed}"
                  + (" and of its measuring cells" if waiver.get("cells_changed") else "")
                  + (f"; code cells accepted with the renames {moved}" if moved else ""))
        for message in refused.values():
            print(message, file=sys.stderr)
        if args.stale and not done and not refused:
            print("no stale run: nothing to waive")
        return 1 if refused else 0
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
            partial = args.json.with_name(args.json.name + ".partial")  # whole or absent, for a reader that polls
            partial.write_text(json.dumps(record, indent=1))
            partial.replace(args.json)
            failed = [nb for nb, o in record.items() if "error" in o]
            print(f"{len(record) - len(failed)} of {len(record)} notebook(s) ran; wrote {args.json}")
            return 1 if failed else 0
        if args.command == "smoke":
            for name, seconds in smoke(notebooks, jobs=args.jobs):
                print(f"{name}: ok ({seconds:.1f} s)")
        elif args.command == "gpu-run":
            gpu_run(notebooks)
        elif args.command == "render" and args.compare_json:
            return _compare_renders(notebooks, args.compare_json)
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
                  + (f"; {len(notes)} pending rerun(s), kept under a waiver:" if notes else ""))
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
