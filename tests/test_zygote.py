"""Notebook kernels forked from a zygote (scripts/nb/zygote.py): the state a fresh kernel has, the way back to a
fresh kernel, signals and kills, and the zygote's own end."""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook
from nbtools_loader import render as nb_render
from nbtools_loader import runs as nb_runs

from nb import zygote

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.subprocess  # kernels and zygotes: processes mutmut cannot see, and no mentor code

STATE = """\
import json, os, sys
preloaded = "torch" in sys.modules
import matplotlib
print(json.dumps({
    "preloaded": preloaded,
    "cwd": os.getcwd(),
    "mark": os.environ.get("ZYGOTE_MARK"),
    "argv0": os.path.basename(sys.argv[0]),
    "argv": sys.argv[1:],
    "path0": sys.path[0],
    "backend": matplotlib.get_backend(),
    "mplbackend": os.environ.get("MPLBACKEND"),
    "ppid_is_init": os.getppid() == 1,
}))
"""
INDUCTOR_CACHE = """
import torch, torchmetrics  # torchmetrics' import of torch._dynamo sets it
print(os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
"""
NAMES_TORCH = """
if False:  # torch is named, so the notebook asks for a forked kernel (zygote.imports_torch); a fresh one skips it
    import torch
"""


def _state(folder: Path, env: dict[str, str], fork: bool, inductor_cache: bool = True) -> dict:
    """What a kernel prints of STATE; with ``inductor_cache``, the variable that importing torchmetrics sets too
    (the fresh kernel then imports torch and torchmetrics: seconds)."""
    nb = new_notebook(cells=[new_code_cell(STATE + (INDUCTOR_CACHE if inductor_cache else NAMES_TORCH))])
    nb_runs.execute_notebook(nb, folder, "state.ipynb", env=env, fork=fork)
    text = "".join(output.get("text", "") for output in nb.cells[0].outputs).rstrip("\n")
    state, cache = text.rsplit("\n", 1) if inductor_cache else (text, None)
    state = json.loads(state) | {"inductor_cache": cache}
    state["argv"] = [a for a in state["argv"] if not a.endswith(".json")]  # the connection file differs
    return state


CALLER = {**{k: v for k, v in os.environ.items() if k != "MPLBACKEND"}, "ZYGOTE_MARK": "from the caller"}


@pytest.mark.parametrize("backend", [None, "Agg"], ids=["inline", "caller's backend"])
def test_a_forked_kernel_starts_as_a_fresh_one_with_torch_already_imported(tmp_path: Path, backend: str | None) -> None:
    """Folder, environment, argv, sys.path[0], matplotlib's backend (inline, as ipykernel sets it, or the one the
    caller set) and the variable that importing torchmetrics sets are those of a kernel started afresh; only torch
    and what it brings are imported before the first cell. (That variable does not depend on the backend: it is
    compared once, with the inline one, to spare a fresh kernel's import of torch.)"""
    env = CALLER | ({"MPLBACKEND": backend} if backend else {})
    inductor_cache = backend is None
    forked = _state(tmp_path, env, fork=True, inductor_cache=inductor_cache)
    fresh = _state(tmp_path, env, fork=False, inductor_cache=inductor_cache)
    assert forked.pop("preloaded") is True and fresh.pop("preloaded") is False
    assert forked == fresh
    assert fresh["cwd"] == str(tmp_path) and fresh["path0"] == str(REPO) and fresh["mark"] == "from the caller"
    assert fresh["argv0"] == "ipykernel_launcher.py" and not fresh["ppid_is_init"]
    assert fresh["inductor_cache"] not in ("None", "") if inductor_cache else fresh["inductor_cache"] is None
    assert fresh["backend"] == ("module://matplotlib_inline.backend_inline" if backend is None else backend)


def test_a_notebook_that_does_not_import_torch_gets_a_fresh_kernel(tmp_path: Path) -> None:
    """No zygote is started for it (it would cost torch's import for nothing), and torch is not imported."""
    nb = new_notebook(cells=[new_code_cell("%time x = 1\nimport sys\nprint('torch' in sys.modules)")])
    before = dict(zygote._ZYGOTES)
    nb_runs.execute_notebook(nb, tmp_path, "plain.ipynb", env=CALLER | {"ZYGOTE_MARK": "plain"}, fork=True)
    assert "".join(o.get("text", "") for o in nb.cells[0].outputs).split()[-1] == "False"
    assert zygote._ZYGOTES == before


def _manager(env: dict[str, str]):
    """A started kernel manager and its client, kernel env ``env``, from a zygote that imported only json (quick
    to start), with the caller's env."""
    km = zygote.kernel_manager(_kernel_env(CALLER), preload=("json",))(kernel_name="python3")
    km.start_kernel(env=env)
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    return km, kc


def _kernel_env(env: dict[str, str]) -> dict[str, str]:
    kernel = {k: v for k, v in env.items() if k != "MPLBACKEND"}
    kernel["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), kernel.get("PYTHONPATH", "")) if p)
    return kernel


def _run(kc, code: str, timeout: float = 60) -> tuple[str, dict]:
    """Execute ``code``; return its printed text and the reply's content."""
    printed = []
    reply = kc.execute_interactive(code, timeout=timeout,
                                   output_hook=lambda msg: printed.append(msg["content"].get("text", "")))
    return "".join(printed), reply["content"]


def _run_after_error(kc, code: str, tries: int = 5) -> tuple[str, dict]:
    """``_run`` just after a cell that failed. ipykernel 7 aborts the execute requests that reach it before its
    "stop aborting" message (``Kernel._abort_queues``, posted from the shell channel's thread after the error
    reply is sent), so a request sent at once may be answered "aborted" with no output: send it again then."""
    for _ in range(tries):
        printed, reply = _run(kc, code)
        if reply["status"] != "aborted":
            return printed, reply
        time.sleep(0.2)
    return printed, reply


def _gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_a_kernel_whose_environment_differs_from_the_zygotes_starts_afresh() -> None:
    """A variable the zygote was not started with sends the kernel down the usual path (the process nbclient
    started becomes the kernel), and it runs; with the zygote's environment the kernel is another process."""
    for mark, forked in (("another", False), ("from the caller", True)):
        km, kc = _manager(_kernel_env(CALLER) | {"ZYGOTE_MARK": mark})
        try:
            printed, _ = _run(kc, "import os; print(os.getpid(), os.environ['ZYGOTE_MARK'])")
            pid, seen = printed.split(maxsplit=1)
            assert (int(pid) != km.provisioner.process.pid) is forked and seen.strip() == mark
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)


def test_an_interrupt_reaches_the_forked_kernel_and_a_kill_or_a_terminate_ends_it() -> None:
    """nbclient interrupts a cell that runs past its timeout and kills a kernel that does not stop: the signal
    sent to the process it started reaches the forked kernel, and killing that process ends the kernel too; so
    does SIGTERM, which jupyter_client sends before it kills, relayed to the kernel."""
    km, kc = _manager(_kernel_env(CALLER))
    try:
        printed, _ = _run(kc, "import os, sys; print(os.getpid(), 'json' in sys.modules)")
        pid, preloaded = printed.split()
        pid = int(pid)
        assert preloaded == "True" and pid != km.provisioner.process.pid
        msg_id = kc.execute("import time; time.sleep(60)")
        time.sleep(1)
        started = time.monotonic()
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=20)
        assert reply["parent_header"]["msg_id"] == msg_id
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
        assert time.monotonic() - started < 20
        printed, reply = _run_after_error(kc, "print('still here')")
        assert reply["status"] == "ok" and printed.strip() == "still here", (reply, printed)
        os.kill(km.provisioner.process.pid, signal.SIGKILL)  # as nbclient's last resort does
        assert _gone(pid, within=10), "the forked kernel outlived the process nbclient started"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    km, kc = _manager(_kernel_env(CALLER))
    try:
        printed, _ = _run(kc, "import os; print(os.getpid())")
        pid = int(printed)
        os.kill(km.provisioner.process.pid, signal.SIGTERM)  # as jupyter_client's terminate does
        assert _gone(pid, within=10), "SIGTERM did not end the forked kernel"
        km.provisioner.process.wait(timeout=10)  # connect sees the kernel's end and exits (not a zombie: reaped)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_the_zygote_ends_with_the_process_that_started_it(tmp_path: Path) -> None:
    """stop_all (run at exit) stops the zygotes; a starter that dies without it takes its zygote with it; either
    way the socket and its folder go."""
    code = ("import os, sys; sys.path.insert(0, sys.argv[1]); from nb import zygote; "
            "zygote._start(dict(os.environ), ()); print(*[f'{p.pid} {s}' for p, s in zygote._ZYGOTES.values()], "
            "flush=True); zygote.stop_all() if sys.argv[2] == 'stop' else os._exit(0)")
    for how in ("stop", "die"):
        done = subprocess.run([sys.executable, "-c", code, str(REPO / "scripts"), how], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        pid, socket_path = done.stdout.split()
        assert _gone(int(pid), within=10), f"the zygote outlived its starter ({how})"
        assert not Path(socket_path).parent.exists(), f"its socket's folder was left behind ({how})"


def test_smoke_runs_and_renders_fork_their_kernels_and_nothing_else_does(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The smoke run and the render ask for forked kernels; a direct execution (the GPU run's) does not."""
    asked = []
    monkeypatch.setattr(nb_runs, "execute_notebook", lambda *args, **kwargs: asked.append(
        inspect.signature(ORIGINAL).bind(*args, **kwargs).arguments.get("fork", False)) or 1.0)
    book = tmp_path / "book"
    book.mkdir()
    nbformat.write(new_notebook(cells=[new_code_cell("x = 1")]), book / "a.ipynb")
    nb_runs.smoke_each([book / "a.ipynb"], book=book, workdir=tmp_path / "work")
    nb_render._present(new_notebook(cells=[new_code_cell("x = 1")]), tmp_path, "a.ipynb", None)
    assert asked == [True, True]
    for execute in (ORIGINAL, nb_runs.execute_scope):
        assert inspect.signature(execute).parameters["fork"].default is False


ORIGINAL = nb_runs.execute_notebook


def test_the_docstring_examples_hold() -> None:
    import doctest

    result = doctest.testmod(zygote)
    assert result.attempted >= 3 and result.failed == 0
