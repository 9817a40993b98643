"""Notebook kernels forked from a process that has imported torch once, for the CPU smoke runs and the renders.

A fresh kernel spends about 5 s of CPU importing torch and torchmetrics (which imports torchvision and
``torch._dynamo``) before its first cell does anything; ``make test`` starts some forty kernels. Here a *zygote*
process imports those packages once and forks a kernel for each notebook:

- :func:`kernel_manager` gives nbclient a ``KernelManager`` class whose kernel command is this file's ``connect``
  mode, a small process that nbclient starts, signals and kills as it would the kernel;
- ``connect`` hands its standard streams, arguments, folder and environment to the zygote over a Unix socket and
  relays signals to the kernel the zygote forked; the kernel kills itself when ``connect`` goes away;
- the forked kernel takes the environment, folder, ``sys.argv`` and ``sys.path[0]`` that
  ``python -m ipykernel_launcher`` would have had, and then runs ipykernel's own ``launch_new_instance``.

What a forked kernel may differ in, and why that is safe where it is used: it shares the zygote's imported
modules, so a variable read at import time must be the same in both: the zygote is started with the very
environment the kernels get, and a kernel whose environment differs in anything but the variables that
jupyter_client sets (``JPY_*``) is refused and started the usual way. matplotlib is among the imported modules
(torchmetrics imports it): where the environment sets no ``MPLBACKEND``, the fork applies ipykernel's inline backend as
matplotlib would at its import, after ipykernel put it in ``MPLBACKEND``. It shares the zygote's hash seed (a render's
environment fixes ``PYTHONHASHSEED`` anyway). The GPU runs never use it: ``gpu-run`` starts every kernel afresh, so
stored measurements come from processes as a reader's would be.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading

PRELOAD = ("torch", "torchmetrics")  # torchmetrics imports torchvision, torch._dynamo and matplotlib
LAUNCHER = ("-m", "ipykernel_launcher")
TORCH_PACKAGES = {"torch", "torchmetrics", "torchvision", "mentor"}
INLINE = "module://matplotlib_inline.backend_inline"  # what ipykernel's kernelapp puts in MPLBACKEND when unset
_MESSAGE = 1 << 20


def _differs(mine: dict[str, str], theirs: dict[str, str]) -> list[str]:
    """The variables, besides ``JPY_*``, on which two environments differ.

    >>> _differs({"A": "1", "JPY_PARENT_PID": "4"}, {"A": "1", "JPY_PARENT_PID": "5", "JPY_SESSION_NAME": "x"})
    []
    >>> _differs({"A": "1", "B": "2"}, {"A": "3", "MPLBACKEND": "Agg"})
    ['A', 'B', 'MPLBACKEND']
    """
    keys = set(mine) | set(theirs)
    return sorted(k for k in keys if not k.startswith("JPY_") and mine.get(k) != theirs.get(k))


# --- the side that starts kernels (nbtools' process) ---

def imports_torch(sources: list[str]) -> bool:
    """Whether code cells ``sources`` import torch or a package that imports it (torchmetrics, torchvision,
    mentor): only then does a forked kernel save the import. IPython's magic and shell lines are skipped.

    >>> imports_torch(["x = 1", "%matplotlib inline\\nfrom mentor.lab import env"]), imports_torch(["import json"])
    (True, False)
    """
    import ast

    for source in sources:
        try:
            tree = ast.parse(re.sub(r"^\s*[%!].*$", "", source, flags=re.MULTILINE))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(name.split(".")[0] in TORCH_PACKAGES for name in names):
                return True
    return False


_ZYGOTES: dict[tuple, tuple[subprocess.Popen, str]] = {}
_STARTING = threading.Lock()
KEEP = 2  # zygotes kept at once (each holds torch's imports, some 400 MB); the least recently used one goes first


def _start(env: dict[str, str], preload: tuple[str, ...] = PRELOAD) -> str:
    """The socket of a zygote started with ``env`` that has imported ``preload``: one per environment and
    ``preload``, the :data:`KEEP` most recently used kept until this process exits."""
    key = (tuple(sorted(env.items())), preload)
    with _STARTING:  # smoke runs of several notebooks at once share one zygote
        return _start_locked(key, env, preload)


def _start_locked(key: tuple, env: dict[str, str], preload: tuple[str, ...]) -> str:
    if key in _ZYGOTES and _ZYGOTES[key][0].poll() is None:
        _ZYGOTES[key] = _ZYGOTES.pop(key)  # most recently used last
        return _ZYGOTES[key][1]
    while len(_ZYGOTES) >= KEEP:
        _stop(*_ZYGOTES.pop(next(iter(_ZYGOTES))))
    folder = tempfile.mkdtemp(prefix="nbzygote-")
    path = os.path.join(folder, "socket")
    proc = subprocess.Popen([sys.executable, __file__, "serve", path, *preload], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, text=True)
    ready = proc.stdout.readline().strip()
    if ready != "ready":
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the kernel zygote did not start (it said {ready!r}); run the notebook with fork=False")
    _ZYGOTES[key] = (proc, path)
    return path


def _remove_socket(path: str) -> None:
    """Remove a zygote's socket and its folder, if still there."""
    for remove, leftover in ((os.unlink, path), (os.rmdir, os.path.dirname(path))):
        try:
            remove(leftover)
        except OSError:
            pass


def _stop(proc: subprocess.Popen, path: str) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    _remove_socket(path)  # the zygote removes them when it stops, not when it is killed


@atexit.register
def stop_all() -> None:
    """Stop every zygote this process started (the kernels forked from them keep running until nbclient shuts
    them down)."""
    while _ZYGOTES:
        _stop(*_ZYGOTES.popitem()[1])


def kernel_manager(env: dict[str, str], preload: tuple[str, ...] = PRELOAD) -> type:
    """A jupyter_client ``KernelManager`` subclass whose ipykernel kernels are forked from a zygote started with
    ``env`` (the environment the kernels get) that has imported ``preload``; other kernel commands run as usual."""
    from jupyter_client.manager import KernelManager

    path = _start(env, preload)

    class ForkedKernelManager(KernelManager):
        def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
            cmd = super().format_kernel_cmd(extra_arguments)
            if cmd[0] != sys.executable or tuple(cmd[1:3]) != LAUNCHER:
                return cmd
            return [sys.executable, "-S", __file__, "connect", path, *cmd[3:]]

    return ForkedKernelManager


# --- connect: the process nbclient sees as the kernel ---

def _connect(path: str, args: list[str]) -> int:
    """Have the zygote fork a kernel with ``args`` and this process's streams, folder and environment; relay
    signals to it and return its exit status. Where there is no zygote, or it refuses, become the kernel."""
    request = json.dumps({"args": args, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.connect(path)
        socket.send_fds(conn, [request], [0, 1, 2])
        reply = json.loads(conn.recv(_MESSAGE) or b"{}")
    except (OSError, ValueError):
        reply = {}
    if "pid" not in reply:
        if "refused" in reply:
            print(f"nb.zygote: kernel started afresh, its environment differs from the zygote's in "
                  f"{', '.join(reply['refused'])}", file=sys.stderr)
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, *LAUNCHER, *args])
    pid = reply["pid"]
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda signum, frame: os.kill(pid, signum))
    status = 1
    while True:
        data = conn.recv(_MESSAGE)
        if not data:
            return status
        status = int(json.loads(data).get("exit", status))


# --- serve: the zygote, and the kernels it forks ---

def _child(conn: socket.socket, request: dict, fds: list[int], started: dict[str, str]) -> None:
    """In the forked process: become the kernel that ``python -m ipykernel_launcher ARGS`` would have started.

    ``started`` is the zygote's environment before its imports: the request must match it, and what the imports
    set (``torch._dynamo``, which torchmetrics imports, sets ``TORCHINDUCTOR_CACHE_DIR`` to inductor's default) is
    set in the kernel too, as its own import of torchmetrics would (every notebook of the book imports it)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the zygote's own handler is not the kernel's
    os.setsid()
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    differs = _differs(started, request["env"])
    if differs:
        conn.send(json.dumps({"refused": differs}).encode())
        os._exit(0)
    imported = {k: v for k, v in os.environ.items() if started.get(k) != v}
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ.update(imported)
    os.chdir(request["cwd"])
    if "MPLBACKEND" not in os.environ:  # ipykernel would set it, and matplotlib apply it when imported
        os.environ["MPLBACKEND"] = INLINE
        if "matplotlib" in sys.modules:
            sys.modules["matplotlib"].rcParams["backend"] = INLINE
    import ipykernel  # not imported before the fork: its import reads JPY_PARENT_PID

    sys.argv = [os.path.join(os.path.dirname(os.path.dirname(ipykernel.__file__)), "ipykernel_launcher.py"),
                *request["args"]]
    # sys.path: the zygote dropped its script's folder, as ipykernel_launcher drops the folder python -m put first
    conn.send(json.dumps({"pid": os.getpid()}).encode())

    import threading

    def watch() -> None:  # connect is gone (killed by nbclient): so is the kernel
        try:
            conn.recv(1)
        finally:
            os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()
    status = 0
    try:
        from ipykernel import kernelapp

        kernelapp.launch_new_instance()
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        status = 1
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        conn.send(json.dumps({"exit": status}).encode())
    finally:
        os._exit(status)


def _serve(path: str, preload: list[str]) -> None:
    """Import ``preload``, then fork a kernel for each request on ``path`` until the parent goes away."""
    parent = os.getppid()
    started = dict(os.environ)
    del sys.path[0]  # this file's folder: a kernel must not import nbtools' modules by their short names
    for name in preload:
        __import__(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    print("ready", flush=True)
    try:
        _accept(listener, parent, started)
    finally:  # stopped, or its starter died without stopping it: its socket and folder go too
        _remove_socket(path)


def _accept(listener: socket.socket, parent: int, started: dict[str, str]) -> None:
    """Fork a kernel for each request on ``listener`` until the process ``parent`` is no longer this one's parent."""
    while os.getppid() == parent:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        if not select.select([listener], [], [], 0.5)[0]:
            continue
        conn, _ = listener.accept()
        message, fds, _, _ = socket.recv_fds(conn, _MESSAGE, 3)
        if os.fork() == 0:
            listener.close()
            try:
                _child(conn, json.loads(message), fds, started)
            finally:
                os._exit(1)
        conn.close()
        for fd in fds:
            os.close(fd)


if __name__ == "__main__":
    mode, where, *rest = sys.argv[1:]
    if mode == "serve":
        _serve(where, rest)
    elif mode == "connect":
        sys.exit(_connect(where, rest))
    else:
        sys.exit(f"usage: {sys.argv[0]} serve SOCKET [MODULE...] | connect SOCKET KERNEL_ARGS...")
