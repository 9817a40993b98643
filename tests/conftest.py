"""Shared test settings: a non-interactive matplotlib backend and one OpenMP thread for every test (and its
subprocesses), and the background lane: once the tests are collected, one process of its own builds the book,
renders the split chapters and smoke-runs the notebooks, as far as the selected tests need them, while the other
tests run; the tests that read its results run last."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import background

# Must be set before anything imports matplotlib.pyplot; subprocesses inherit it.
os.environ["MPLBACKEND"] = "Agg"
# Before torch is imported: on 2 cores shared with the notebooks' smoke run, torch's default of one thread per
# core makes a tiny CPU training step many times slower (each thread waits for the other's core).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# glibc's malloc gives a freed block above its mmap threshold back to the operating system, and trims the heap's
# free top, so a CPU training step that frees and takes its buffers again page-faults them in anew at every step.
# Keeping them (blocks up to 32 MB from the heap, up to 256 MB of free heap kept) took about a tenth off the smoke
# runs of chapters 9, 12 and 14 on a 2-core machine, with a half to a third of the minor page faults. The variables reach every process the
# tests start (notebook kernels, spawned ranks, torchrun); mallopt sets the same for this process, which started
# before they were set. Other C libraries ignore both.
MALLOC_SETTINGS = {"MALLOC_MMAP_THRESHOLD_": 32 * 2**20, "MALLOC_TRIM_THRESHOLD_": 256 * 2**20,
                   "MALLOC_TOP_PAD_": 16 * 2**20}
for _name, _value in MALLOC_SETTINGS.items():
    os.environ.setdefault(_name, str(_value))


def _mallopt() -> bool:
    """Apply MALLOC_SETTINGS to this process through glibc's mallopt; False where there is no glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    # M_TRIM_THRESHOLD, M_TOP_PAD and M_MMAP_THRESHOLD in glibc's malloc.h; mallopt returns 1 on success
    codes = {"MALLOC_TRIM_THRESHOLD_": -1, "MALLOC_TOP_PAD_": -2, "MALLOC_MMAP_THRESHOLD_": -3}
    return all(mallopt(codes[name], int(os.environ[name])) == 1 for name in codes)


_mallopt()

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _prepare_book_build(root: Path) -> str | None:
    """Copy the book into ``root`` for ``jupyter-book build``: only the entries of _toc.yml that exist, with mentor's
    source beside it (the chapters include code from it: {literalinclude} ../mentor/...), as the real build has it.
    Returns None, or why there is nothing to build."""
    from nbtools_loader import book as nb_book
    from test_book import prune_toc

    present = [entry for entry in nb_book.toc_files() if nb_book.toc_source(entry) is not None]
    if not present:
        return "no entry of _toc.yml exists yet"
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    if toc["root"] not in present:
        return f"the toc's root {toc['root']} is missing"
    (root / "_toc.yml").write_text(yaml.safe_dump(prune_toc(toc, set(present)), sort_keys=False))
    shutil.copy(REPO / "_config.yml", root)
    shutil.copytree(REPO / "book", root / "book", ignore=nb_book.COPY_IGNORE)
    shutil.copytree(REPO / "mentor", root / "mentor", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (root / "present.json").write_text(json.dumps(present))
    return None


# --- the background lane: the book's build, the renders and the smoke run, beside the other tests ---
#
# On two cores, the tests that execute notebooks or build the book take about as long as all the others. So, once the
# tests are collected, one process of its own builds the book (if a selected test reads the site), renders the split
# chapters (if test_split_chapters_render_as_stored is selected) and smoke-runs the notebooks (if test_notebook_smoke
# is), in that order, while the other tests run; the tests that read its results run last, so that they wait for it
# as little as possible.

LANE = pytest.StashKey[dict]()


def _reads_the_lane(item: pytest.Item) -> bool:
    return (getattr(item, "originalname", "") in ("test_notebook_smoke", "test_split_chapters_render_as_stored")
            or "built_book" in getattr(item, "fixturenames", ()))


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests that read the background lane's results run after every other test, in their collected order."""
    items[:] = [item for item in items if not _reads_the_lane(item)] + [item for item in items if _reads_the_lane(item)]


def _selected(session: pytest.Session, name: str) -> list[Path]:
    return [item.callspec.params["notebook"] for item in session.items
            if getattr(item, "originalname", "") == name and item.callspec.params.get("notebook")]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the background jobs that the selected tests use (tests/background.py), and the
    background lane for what this session's tests select (nothing if they select none of it)."""
    if session.config.option.collectonly:
        return
    background.start(session.items)
    _start_lane(session)


def _start_lane(session: pytest.Session) -> None:
    import shlex
    import tempfile

    smoke = _selected(session, "test_notebook_smoke")
    renders = _selected(session, "test_split_chapters_render_as_stored")
    build = any("built_book" in getattr(item, "fixturenames", ()) for item in session.items)
    if not (smoke or renders or build):
        return
    folder = Path(tempfile.mkdtemp(prefix="mentor-lane-"))
    nbtools = shlex.quote(str(REPO / "scripts" / "nbtools.py"))
    python = shlex.quote(sys.executable)
    steps, lane = [], {"folder": folder, "log": folder / "lane.log", "smoke_before": {nb: nb.read_bytes() for nb in smoke},
                       "timing": folder / "timing.txt", "started": time.time(), "waited": 0.0}
    if build:
        root = folder / "book"
        root.mkdir()
        lane["build_root"], lane["build_rc"] = root, root / "build.rc"
        lane["build_refused"] = _prepare_book_build(root)
        jupyter_book = shutil.which("jupyter-book", path=str(BIN)) or shutil.which("jupyter-book")
        lane["build_missing"] = None if jupyter_book else f"jupyter-book is not installed next to {sys.executable}"
        if lane["build_refused"] is None and jupyter_book:
            steps.append(("build", f"(cd {shlex.quote(str(root))} && {shlex.quote(jupyter_book)} build . -W -n "
                                   f"--keep-going > build.out 2> build.err; echo $? > build.rc.partial; "
                                   f"mv build.rc.partial build.rc)"))
    if renders:
        lane["renders"] = folder / "renders.json"
        steps.append(("renders", f"{python} {nbtools} render --compare-json {shlex.quote(str(lane['renders']))} "
                      + " ".join(shlex.quote(str(nb)) for nb in renders)))
    if smoke:
        lane["smoke"] = folder / "smoke.json"
        steps.append(("smoke run", f"{python} {nbtools} smoke --json {shlex.quote(str(lane['smoke']))} "
                      + " ".join(shlex.quote(str(nb)) for nb in smoke)))
    lane["log_file"] = open(lane["log"], "w")
    timing = shlex.quote(str(lane["timing"]))  # each step's seconds, then the time the lane ended
    script = "; ".join(f"s=$SECONDS; {command}; echo \"{name}: $((SECONDS - s))\" >> {timing}" for name, command in steps)
    script += f"; echo \"end: $(date +%s.%N)\" >> {timing}"
    lane["process"] = subprocess.Popen(["bash", "-c", script], stdout=lane["log_file"],
                                       stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    session.config.stash[LANE] = lane


def lane_summary(lane: dict) -> str:
    """One line on the background lane for the end of the session: each finished step's seconds, when the lane
    ended (seconds after it started) and how long the tests that read it waited for it."""
    parts, end = [], None
    text = lane["timing"].read_text() if lane["timing"].is_file() else ""
    for line in text.splitlines():
        name, _, value = line.partition(": ")
        if name == "end":
            end = float(value) - lane["started"]
        else:
            parts.append(f"{name} {value} s")
    ended = f"ended {end:.0f} s after it started" if end is not None else "had not ended"
    return (f"background lane: {', '.join(parts) or 'no step finished'}; {ended}; the tests that read it waited "
            f"{lane['waited']:.0f} s for it")


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Say how long the background lane's steps took, so that a slow `make test` shows where its time went."""
    lane = config.stash.get(LANE, None)
    if lane is not None:
        terminalreporter.write_line(lane_summary(lane))
    if background.summary():
        terminalreporter.write_line(background.summary())


def pytest_unconfigure(config: pytest.Config) -> None:
    """A session that ends early (-x, Ctrl-C) does not leave the lane behind; its folder is removed. Background
    jobs not started yet are cancelled."""
    background.shutdown()
    lane = config.stash.get(LANE, None)
    if lane is None:
        return
    if lane["process"].poll() is None:
        os.killpg(lane["process"].pid, signal.SIGKILL)  # the lane's shell and the notebooks' kernels under it
        lane["process"].wait()
    lane["log_file"].close()
    shutil.rmtree(lane["folder"], ignore_errors=True)


def _lane(request: pytest.FixtureRequest, what: str, path_key: str) -> Path:
    """The file at the lane's ``path_key`` once it exists (``what`` names it in the failure if the lane ends
    without it). The wait adds to the lane's ``waited``."""
    lane = request.config.stash.get(LANE, None)
    assert lane is not None and path_key in lane, f"the {what} was not started (pytest_collection_finish in tests/conftest.py)"
    path = lane[path_key]
    began = time.monotonic()
    while not path.is_file():
        if lane["process"].poll() is not None and not path.is_file():
            pytest.fail(f"the {what} wrote nothing:\n{lane['log'].read_text()[-4000:]}", pytrace=False)
        time.sleep(0.5)
    lane["waited"] += time.monotonic() - began
    return path


@pytest.fixture(scope="session")
def built_book(request: pytest.FixtureRequest):
    """The book built with ``jupyter-book build -W -n`` in the background lane: (the finished process, the html
    folder, the toc entries built). Only the entries of _toc.yml that exist are built."""
    lane = request.config.stash.get(LANE, None)
    assert lane is not None and "build_root" in lane, "the book's build was not started (tests/conftest.py)"
    assert lane["build_refused"] is None, lane["build_refused"]
    assert lane["build_missing"] is None, lane["build_missing"]
    root = lane["build_root"]
    code = int(_lane(request, "book's build", "build_rc").read_text())
    build = subprocess.CompletedProcess(["jupyter-book", "build", str(root), "-W", "-n", "--keep-going"], code,
                                        (root / "build.out").read_text(), (root / "build.err").read_text())
    return build, root / "_build" / "html", json.loads((root / "present.json").read_text())


@pytest.fixture(scope="session")
def smoke_runs(request: pytest.FixtureRequest) -> dict:
    """{notebook: (its bytes before the run, its seconds or the NotebookFailed)}, from the lane's smoke run."""
    from nbtools_loader import runs as nb_runs

    lane = request.config.stash.get(LANE, {})
    out = _lane(request, "smoke run", "smoke")
    record = {Path(k): v for k, v in json.loads(out.read_text()).items()}
    return {nb: (lane["smoke_before"][nb], nb_runs.NotebookFailed(record[nb]["error"]) if "error" in record[nb]
                 else record[nb]["seconds"]) for nb in lane["smoke_before"]}


@pytest.fixture(scope="session")
def render_outcomes(request: pytest.FixtureRequest) -> dict:
    """{notebook: its differences from a fresh render (a list of messages) or the error that stopped it}, from the
    lane's renders."""
    out = _lane(request, "renders", "renders")
    return {Path(k): v["differences"] if "differences" in v else v["error"]
            for k, v in json.loads(out.read_text()).items()}


@pytest.fixture(scope="module")
def setup():
    """The toy ResNet-18 on the CPU with 10 classes, shared by a test file's tests that only train it."""
    from mentor.lab.train import build_setup

    return build_setup(num_classes=10)


@pytest.fixture
def batches():
    """Endless batches of two 32-pixel images with labels of 10 classes, on the CPU."""
    from mentor.lab.data import device_batches

    return device_batches(2, 32, 10)


@pytest.fixture
def loss():
    """A CUDA loss of one step (for the tests marked @gpu)."""
    import torch

    return torch.rand((), device="cuda") + 1.0
