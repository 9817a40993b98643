#!/usr/bin/env python3
"""Run and check the book's notebooks: a CPU smoke run, the in-place GPU run, and a staleness check.

    python scripts/nbtools.py smoke [-j N] [NB ...]  # execute copies with MENTOR_PROFILE=smoke; the repo is untouched
    python scripts/nbtools.py gpu-run [NB ...]  # execute in place with MENTOR_PROFILE=full and store provenance
    python scripts/nbtools.py check [NB ...]    # fail if a notebook's stored GPU run is not current
    python scripts/nbtools.py waive NB --reason "needs two GPUs; none available" [--rename OLD=NEW ...]
                                                # accept the mentor change since NB's stored run, for a reason
                                                # (--rename: a module that moved, imported under its new name)

Without NB, every book/*.ipynb is used, sorted; gpu-run executes book/intro.ipynb, then
book/reproducibility.ipynb, last.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime as dt
import hashlib
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import nbformat
from nbformat import NotebookNode

REPO = Path(__file__).resolve().parent.parent
BOOK = REPO / "book"
LAST = ("intro.ipynb", "reproducibility.ipynb")
"""Run after the chapters, in this order: the intro reads chapter 8's results file, and
reproducibility.ipynb reads every notebook's stored metadata (the intro's included)."""
CELL_SEPARATOR = "\n# ---- next code cell ----\n"
KERNEL = "python3"
TIMEOUT_S = 600
COPY_IGNORE = shutil.ignore_patterns(".ipynb_checkpoints", "_out", "__pycache__")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class NotebookFailed(RuntimeError):
    """A notebook raised an error (or timed out) in one of its cells."""


def display_path(path: Path) -> str:
    """``path`` relative to the repository when inside it, else as given."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def default_notebooks(book: Path = BOOK) -> list[Path]:
    """Every notebook directly in ``book``, sorted by name."""
    return sorted(book.glob("*.ipynb"))


def toc_files(toc: Path = REPO / "_toc.yml") -> list[str]:
    """Every file entry of a jb-book ``_toc.yml`` (root first), as written there: no suffix."""
    import yaml

    def walk(node: object) -> Iterator[str]:
        if isinstance(node, dict):
            if "file" in node:
                yield str(node["file"])
            for value in node.values():
                yield from walk(value)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)

    data = yaml.safe_load(toc.read_text())
    return [str(data["root"]), *walk({k: v for k, v in data.items() if k != "root"})]


def toc_source(entry: str, root: Path = REPO) -> Path | None:
    """The .ipynb or .md file a toc entry names, or None when neither exists."""
    for suffix in (".ipynb", ".md"):
        path = root / (entry + suffix)
        if path.is_file():
            return path
    return None


def run_order(notebooks: Sequence[Path]) -> list[Path]:
    """``notebooks`` in the given order, except that a notebook runs after those of the list whose results it reads
    (:data:`READS`), and intro.ipynb then reproducibility.ipynb run last.

    Example:
        >>> [p.name for p in run_order([Path("08_summary.ipynb"), Path("intro.ipynb"), Path("02_naive_metrics.ipynb")])]
        ['02_naive_metrics.ipynb', '08_summary.ipynb', 'intro.ipynb']
    """
    chapters = [p for p in notebooks if p.name not in LAST]
    listed = {p.name for p in chapters}
    ordered: list[Path] = []
    while len(ordered) < len(chapters):
        done = {p.name for p in ordered}
        ready = next(p for p in chapters if p not in ordered
                     and all(other in done or other not in listed for other in READS.get(p.name, ())))
        ordered.append(ready)
    return ordered + sorted((p for p in notebooks if p.name in LAST), key=lambda p: LAST.index(p.name))


READS: dict[str, tuple[str, ...]] = {
    "08_summary.ipynb": ("02_naive_metrics.ipynb", "05_weight.ipynb", "06_nan_check.ipynb"),
    "intro.ipynb": ("08_summary.ipynb",),
}
"""Notebooks that read the results files other notebooks write (``results/...``): the stored run of each must be
newer than the stored runs of those it reads. ``reproducibility.ipynb`` reads every notebook's metadata, so its run
must be newer than all of them."""
EVERY = "reproducibility.ipynb"
GLUE_PREFIX = "application/papermill.record/"
FIGURE_REPR = re.compile(r"^<Figure size [\d.]+x[\d.]+ with \d+ Axes>$")
"""matplotlib's text repr of a figure: stored without an image beside it, the figure was not drawn (a kernel whose
MPLBACKEND was a non-inline backend such as Agg displays only this)."""

MENTOR = REPO / "mentor"
FORBIDDEN_TAGS = ("skip-execution", "raises-exception")
"""Cell tags that skip a cell or hide its error: a stored run with them proves nothing."""
FORBIDDEN_LINE = re.compile(r"^\s*(%%capture|!)", re.MULTILINE)
"""Cell magics whose failure a notebook run does not see: a captured error, a failing shell command."""


def mentor_hash(package: Path | None = None) -> str:
    """SHA-256 of the ``mentor`` package's source: every ``.py`` file, by relative path and content."""
    package = MENTOR if package is None else package
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


MAGIC_LINE = re.compile(r"^\s*[%!].*$", re.MULTILINE)
MENTOR_NAME = re.compile(r"\bmentor((?:\.\w+)*)")


def _is_doc(node: ast.AST) -> bool:
    """A bare string statement: a docstring or a comment-like string, which imports nothing."""
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


HASH_SCHEME = "ast-1"
"""How ``gpu-run`` hashes code now, stored as ``metadata.mentor.hash_scheme``. ``ast-1`` hashes each cell's and
each module's syntax tree, so that comments, line breaks and the layout of code (and, in ``mentor`` modules,
docstrings and other bare strings, which run no code) do not make a stored run stale; a cell's magic lines and
whether it ends in ``;`` (which hides its value) still count. A run stored without ``hash_scheme`` was hashed
as text (``raw``): it is checked that way until it is run again. Line numbers do not count either, so a
warning or traceback stored in an output may quote a line number that has since moved."""


def _tree_text(node: Any) -> str:
    """A syntax tree as text, with no line numbers and no empty fields (so Python 3.11 to 3.13 agree)."""
    if isinstance(node, ast.JoinedStr):  # f-string pieces: Python 3.12 keeps empty ones and splits some
        values: list[Any] = []
        for value in node.values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                if values and isinstance(values[-1], str):
                    values[-1] += value.value
                elif value.value:
                    values.append(value.value)
            else:
                values.append(value)
        return "JoinedStr(" + ", ".join(repr(v) if isinstance(v, str) else _tree_text(v) for v in values if v != "") + ")"
    if isinstance(node, ast.AST):
        fields = []
        for name in node._fields:
            value = getattr(node, name, None)
            if value is None or value == []:
                continue
            fields.append(f"{name}={_tree_text(value)}")
        return f"{type(node).__name__}({', '.join(fields)})"
    if isinstance(node, list):
        return "[" + ", ".join(_tree_text(item) for item in node) + "]"
    return repr(node)


def _without_bare_strings(tree: ast.AST) -> ast.AST:
    """``tree`` with every bare string statement (docstrings too) dropped; a body left empty gets ``pass``."""
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            body = getattr(node, name, None)
            if isinstance(body, list) and any(_is_doc(item) for item in body):
                kept = [item for item in body if not _is_doc(item)]
                setattr(node, name, kept or ([ast.Pass()] if name == "body" else []))
    return tree


def cell_fingerprint(source: str) -> str:
    r"""What of a code cell's ``source`` can change what it does: its syntax tree, magic lines and a final ``;``.

    >>> cell_fingerprint("x = f(1,  2)  # a comment") == cell_fingerprint("x = f(\n    1, 2\n)")
    True
    >>> cell_fingerprint("x") == cell_fingerprint("x;")
    False
    """
    magics = MAGIC_LINE.findall(source)
    code = MAGIC_LINE.sub("", source)
    try:
        tree = _tree_text(ast.parse(code))
    except SyntaxError:
        return "text:" + "\n".join(line.rstrip() for line in source.splitlines())
    return "\n".join(magics) + "\n" + tree + ("\n;" if _ends_in_semicolon(code) else "")


def _ends_in_semicolon(code: str) -> bool:
    """Whether the last token of ``code`` (comments and line ends aside) is ``;``, which hides the cell's value."""
    import io
    import tokenize

    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type not in skip]
    except (tokenize.TokenError, SyntaxError):
        return code.rstrip().endswith(";")
    return bool(tokens) and tokens[-1].string == ";"


def module_fingerprint(text: str) -> str:
    r"""What of a ``mentor`` module's ``text`` can change what it does: its syntax tree without bare strings.

    >>> module_fingerprint("def f():\n    'Doc.'\n    return 1  # one") == module_fingerprint("def f():\n    return 1")
    True
    """
    try:
        return _tree_text(_without_bare_strings(ast.parse(text)))
    except SyntaxError:
        return "text:" + text


def imported_modules(source: str, module: str = "") -> set[str]:
    """Dotted names of the ``mentor`` modules that Python ``source`` may import.

    Counts ``import mentor.x``, ``from mentor import x``, relative imports inside the package
    (``module`` is the dotted name of the file being read) and, to catch ``python -m mentor.x``
    launches, any string constant that names ``mentor.x`` (docstrings excepted). IPython magic and
    shell lines are skipped. It over-counts rather than misses: a name that is not a module of the
    package is dropped later by :func:`mentor_sources`.

    >>> sorted(imported_modules("from mentor.lab.compare import compare\\nimport mentor.lab.trace as t"))
    ['mentor.lab.compare', 'mentor.lab.compare.compare', 'mentor.lab.trace']
    """
    tree = ast.parse(MAGIC_LINE.sub("", source))
    docs = {id(node.value) for node in ast.walk(tree) if _is_doc(node)}
    package = module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            names.update("mentor" + match for match in MENTOR_NAME.findall(node.value))
    return {name for name in names if name == "mentor" or name.startswith("mentor.")}


def _module_file(name: str, package: Path) -> Path | None:
    """The file of dotted module ``name`` inside ``package`` (named ``mentor``), or None if it is not one."""
    parts = name.split(".")[1:]
    for candidate in (package.joinpath(*parts).with_suffix(".py") if parts else None,
                      package.joinpath(*parts, "__init__.py")):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def mentor_sources(nb: NotebookNode, package: Path | None = None, scheme: str = HASH_SCHEME) -> dict[str, str]:
    """SHA-256 of each ``mentor`` file that ``nb``'s code imports, directly or through other modules.

    Keys are paths relative to the package (``bench.py``); the package's ``__init__.py`` is included
    whenever any module is, since Python imports it first. A change to a module that the notebook
    never reaches cannot change its outputs, so only these files make its stored run stale.
    """
    package = MENTOR if package is None else package
    code = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "code")
    pending, seen = list(imported_modules(code)), set()
    while pending:
        name = pending.pop()
        path = _module_file(name, package)
        if name in seen or path is None:
            continue
        seen.add(name)
        pending.append(name.rpartition(".")[0] if "." in name else name)  # the parent package runs first
        pending.extend(imported_modules(path.read_text(), module=name if path.name != "__init__.py" else name + ".x"))
    files = {_module_file(name, package) for name in seen}
    return {str(path.relative_to(package)): _file_hash(path, scheme) for path in sorted(f for f in files if f is not None)}


def _file_hash(path: Path, scheme: str) -> str:
    """SHA-256 of a module: of its :func:`module_fingerprint` (``ast-1``) or of its bytes (``raw``)."""
    if scheme == "raw":
        return hashlib.sha256(path.read_bytes()).hexdigest()
    return hashlib.sha256(module_fingerprint(path.read_text(encoding="utf-8")).encode()).hexdigest()


def stored_scheme(meta: dict) -> str:
    """The :data:`HASH_SCHEME` a stored run's hashes were made with: ``raw`` when it records none."""
    return meta.get("hash_scheme", "raw")


def outputs_hash(nb: NotebookNode) -> str:
    """SHA-256 of every code cell's outputs, as stored (so a hand edit of an output changes it)."""
    import json

    outputs = [cell.get("outputs", []) for cell in nb.cells if cell.cell_type == "code"]
    return hashlib.sha256(json.dumps(outputs, sort_keys=True).encode()).hexdigest()


def drop_hidden_stderr(nb: NotebookNode) -> int:
    """Remove the stderr stream outputs of code cells tagged ``remove-stderr``; returns how many were removed.

    The tag hides them on the rendered page; gpu-run also leaves them out of the stored notebook, so that a
    downloaded notebook does not carry what the page does not show (warnings that name the GPU machine's paths).
    """
    removed = 0
    for cell in nb.cells:
        if cell.cell_type != "code" or "remove-stderr" not in cell.get("metadata", {}).get("tags", []):
            continue
        kept = [out for out in cell.get("outputs", [])
                if not (out.get("output_type") == "stream" and out.get("name") == "stderr")]
        removed += len(cell.get("outputs", [])) - len(kept)
        cell.outputs = kept
    return removed


MACHINE_PATH = re.compile(r"(?:/[\w.+-]+)+/(?=site-packages/)")
"""The machine-specific start of a path into an installed package (``/opt/torch/.venv/lib/python3.12/``)."""
CARRIED_SITE = re.compile(r"/tmp/site/(?=[A-Za-z_])")
"""The folder on the GPU machine where ``.whl/install.sh`` installs the carried wheels (``pip --target``): a path
into a package installed there (``/tmp/site/lightning/...``) has no ``site-packages/`` to cut at."""


def _shorten(text: str) -> tuple[str, int]:
    """``text`` without the machine's prefixes (``MACHINE_PATH``, ``CARRIED_SITE``), and how many were cut."""
    text, n = MACHINE_PATH.subn("", text)
    text, m = CARRIED_SITE.subn("", text)
    return text, n + m


def shorten_paths(nb: NotebookNode) -> int:
    """Cut the machine's own prefix from every path into ``site-packages/`` in the stream outputs and
    tracebacks of ``nb`` (a warning's ``/opt/x/lib/python3.12/site-packages/torch/a.py:3`` becomes
    ``site-packages/torch/a.py:3``), and ``/tmp/site/`` from a path into a carried wheel (``CARRIED_SITE``);
    returns how many paths were cut.

    >>> from nbformat.v4 import new_code_cell, new_notebook, new_output
    >>> nb = new_notebook(cells=[new_code_cell("x", outputs=[new_output("stream", name="stderr",
    ...     text="/opt/t/lib/python3.12/site-packages/torch/a.py:3: UserWarning")])])
    >>> shorten_paths(nb), nb.cells[0].outputs[0].text
    (1, 'site-packages/torch/a.py:3: UserWarning')
    """
    cut = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if out.get("output_type") == "stream":
                out.text, n = _shorten("".join(out.text) if isinstance(out.text, list) else out.text)
                cut += n
            elif out.get("output_type") == "error":
                lines = [_shorten(line) for line in out.get("traceback", [])]
                out.traceback = [line for line, _ in lines]
                cut += sum(n for _, n in lines)
    return cut


def forbidden(nb: NotebookNode) -> list[str]:
    """Why a notebook's run cannot be trusted: tags that skip or hide errors, %%capture or ``!`` lines."""
    problems = []
    for index, cell in enumerate(nb.cells):
        tags = [t for t in cell.get("metadata", {}).get("tags", []) if t in FORBIDDEN_TAGS]
        if tags:
            problems.append(f"cell {index} is tagged {', '.join(tags)}, which skips it or hides its error; remove the tag")
        if cell.cell_type == "code" and FORBIDDEN_LINE.search(cell.source):
            problems.append(f"cell {index} uses %%capture or a ! shell line, whose failure the run would not see; "
                            "call Python instead")
    return problems


def figures_without_images(nb: NotebookNode) -> list[str]:
    """One message per code cell whose outputs hold a matplotlib figure as text only, with no image beside it.

    >>> from nbformat.v4 import new_code_cell, new_notebook, new_output
    >>> cell = new_code_cell("fig", outputs=[new_output("display_data", data={"text/plain": "<Figure size 640x480 with 1 Axes>"})])
    >>> figures_without_images(new_notebook(cells=[cell]))
    ['cell 0 stored a matplotlib figure without its image (<Figure size 640x480 with 1 Axes>)']

    A glued figure counts too: myst_nb keeps its bundle under ``application/papermill.record/<mime>``.
    """
    problems = []
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            # a glued value (myst_nb.glue) keeps its mime bundle under "application/papermill.record/<mime>"
            data = {key.removeprefix(GLUE_PREFIX): value for key, value in output.get("data", {}).items()}
            text = "".join(data.get("text/plain", ""))
            if FIGURE_REPR.match(text.strip()) and not any(key.startswith("image/") for key in data):
                problems.append(f"cell {index} stored a matplotlib figure without its image ({text.strip()})")
                break
    return problems


def code_hash(nb: NotebookNode, scheme: str = HASH_SCHEME) -> str:
    """SHA-256 of the code cells: of their :func:`cell_fingerprint` (``ast-1``), or of their sources with trailing
    whitespace stripped (``raw``); outputs, metadata and markdown don't count."""
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        source = "".join(cell.source) if isinstance(cell.source, list) else cell.source
        if scheme == "raw":
            cells.append("\n".join(line.rstrip() for line in source.splitlines()))
        else:
            cells.append(cell_fingerprint(source))
    return hashlib.sha256(CELL_SEPARATOR.join(cells).encode()).hexdigest()


@contextlib.contextmanager
def kernel_env(**values: str) -> Iterator[None]:
    """Set environment variables (inherited by kernels started inside) and restore them afterwards."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def execute_notebook(nb: NotebookNode, cwd: Path, name: str, timeout: int = TIMEOUT_S,
                     env: dict[str, str] | None = None) -> float:
    """Execute ``nb`` in place in a fresh ``python3`` kernel started in ``cwd``; return the seconds taken.

    Raises NotebookFailed naming ``name`` and the failing cell. The kernel gets ``env`` (default:
    os.environ, read now), with the repository root prepended to PYTHONPATH so that ``import mentor``
    works anywhere; os.environ itself is left alone, so notebooks can run in several threads at once.
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import CellControlSignal, CellExecutionError, CellTimeoutError, DeadKernelError

    current: dict[str, int] = {}
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name=KERNEL,
        resources={"metadata": {"path": str(cwd)}},
        on_cell_execute=lambda cell, cell_index: current.update(index=cell_index),
    )
    kernel = dict(os.environ if env is None else env)
    kernel["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), kernel.get("PYTHONPATH", "")) if p)
    start = time.perf_counter()
    try:
        client.execute(env=kernel)
    except (CellExecutionError, CellTimeoutError, DeadKernelError, CellControlSignal) as error:
        index = current.get("index")
        if index is None:
            raise NotebookFailed(f"{name}: the kernel failed before any cell ran: {error}") from error
        first_line = next(iter(nb.cells[index].source.strip().splitlines()), "")
        detail = ANSI.sub("", str(error))
        raise NotebookFailed(
            f"{name}: cell {index} (starts with {first_line!r}) failed: {type(error).__name__}\n{detail}"
        ) from error
    return time.perf_counter() - start


def smoke_each(notebooks: Sequence[Path], book: Path = BOOK, workdir: Path | None = None,
               jobs: int = 1) -> dict[Path, float | NotebookFailed]:
    """Execute each notebook with MENTOR_PROFILE=smoke in its own copy of ``book`` (in ``workdir`` or a temp dir),
    ``jobs`` at a time; returns, per notebook as given, its seconds or the NotebookFailed that stopped it.

    Nothing under ``book`` is modified. With ``jobs`` 1 the notebooks run one after the other in one copy (a
    later one sees the files an earlier one wrote) and the first failure ends the run, so later notebooks are
    missing from the result; with ``jobs`` > 1 each runs in a copy of its own, and each kernel gets
    ``OMP_NUM_THREADS=1`` (unless set), so that the kernels share the cores instead of each taking all of them.
    """
    from concurrent.futures import ThreadPoolExecutor

    book = book.resolve()
    for nb_path in notebooks:
        if not Path(nb_path).is_file():
            raise NotebookFailed(f"{nb_path}: no such notebook; pass the path of a .ipynb file in {display_path(book)}/")
        try:
            Path(nb_path).resolve().relative_to(book)
        except ValueError:
            raise ValueError(f"{nb_path} is not inside {book}; smoke runs notebooks of that folder") from None
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a whole number of notebooks to run at once, >= 1, not {jobs!r}")
    env = {**os.environ, "MENTOR_PROFILE": "smoke"}
    if jobs > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nbsmoke-")))
        if jobs == 1:  # one copy for all, as a sequential run in place would see it
            shutil.copytree(book, Path(workdir) / book.name, ignore=COPY_IGNORE)

        def one(index: int, nb_path: Path) -> float | NotebookFailed:
            rel = Path(nb_path).resolve().relative_to(book)
            copy = Path(workdir) / book.name
            if jobs > 1:  # a copy of its own: notebooks running at once must not see each other's files
                copy = Path(workdir) / f"{index:02d}" / book.name
                shutil.copytree(book, copy, ignore=COPY_IGNORE)
            target = copy / rel
            nb = nbformat.read(target, as_version=4)
            problems = forbidden(nb)
            if problems:
                return NotebookFailed(f"{display_path(book / rel)}: " + "; ".join(problems))
            try:
                return execute_notebook(nb, target.parent, display_path(book / rel), env=env)
            except NotebookFailed as error:
                return error

        if jobs == 1:
            outcomes: dict[Path, float | NotebookFailed] = {}
            for index, nb_path in enumerate(notebooks):
                outcomes[nb_path] = one(index, nb_path)
                if isinstance(outcomes[nb_path], NotebookFailed):
                    break
            return outcomes
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            return dict(zip(notebooks, pool.map(one, range(len(notebooks)), notebooks)))


def smoke(notebooks: Sequence[Path], book: Path = BOOK, workdir: Path | None = None,
          jobs: int = 1) -> list[tuple[str, float]]:
    """Execute each notebook with MENTOR_PROFILE=smoke in a copy of ``book`` (in ``workdir`` or a temp dir).

    Nothing under ``book`` is modified. Returns (name, seconds) per notebook; raises the first NotebookFailed
    (see :func:`smoke_each` for ``jobs``).
    """
    results = []
    for nb_path, outcome in smoke_each(notebooks, book, workdir, jobs).items():
        if isinstance(outcome, NotebookFailed):
            raise outcome
        results.append((display_path(Path(nb_path).resolve()), outcome))
    return results


def require_installed_mentor() -> None:
    """Raise NotebookFailed unless ``mentor`` is installed in this Python with its pytest plugin registered.

    Chapter 11 runs pytest inside the notebook, and pytest loads the ``no_syncs`` plugin through the entry
    point that ``pip install`` writes; a checkout that is only on ``PYTHONPATH`` has none, and the chapter's
    tests would stop at "fixture 'no_syncs' not found".
    """
    from importlib.metadata import entry_points

    if not [ep for ep in entry_points(group="pytest11") if ep.name == "mentor"]:
        raise NotebookFailed(
            "mentor is not installed in this Python, so pytest would not load its no_syncs plugin (chapter 11 "
            "needs it); install it first: python -m pip install --no-deps --no-build-isolation -e . "
            "(or make gpu-run, which uses .venv)")


def gpu_run(notebooks: Sequence[Path]) -> list[tuple[str, float]]:
    """Execute each notebook in place (cwd: its folder) and write it back with outputs and provenance.

    MENTOR_PROFILE defaults to ``full``; reproducibility.ipynb runs last. Returns (name, seconds).
    """
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from mentor.lab.env import environment_report

    require_installed_mentor()
    # the kernels draw figures with ipykernel's inline backend: another MPLBACKEND (Agg, say) would store each
    # figure as its text repr only
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    env["MENTOR_PROFILE"] = os.environ.get("MENTOR_PROFILE") or "full"
    results = []
    with kernel_env(MENTOR_PROFILE=env["MENTOR_PROFILE"]):
        for nb_path in run_order([Path(p) for p in notebooks]):
            name = display_path(nb_path)
            nb = nbformat.read(nb_path, as_version=4)
            executed = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
            problems = forbidden(nb)
            if problems:
                raise NotebookFailed(f"{name}: " + "; ".join(problems))
            read = {other: _executed(nb_path.parent / other) for other in reads_of(nb_path)}
            seconds = execute_notebook(nb, nb_path.resolve().parent, name, env=env)
            drop_hidden_stderr(nb)
            shorten_paths(nb)
            nb.metadata["mentor"] = {
                "provenance": environment_report(),
                "executed": executed,
                "duration_s": round(seconds, 3),
                "hash_scheme": HASH_SCHEME,
                "code_sha256": code_hash(nb),
                "mentor_sha256": mentor_hash(),
                "mentor_sources": mentor_sources(nb),
            }
            if read:  # the runs of the notebooks it read, as it found them (see read_after)
                nb.metadata["mentor"]["read"] = read
            nbformat.write(nb, nb_path)
            nb = nbformat.read(nb_path, as_version=4)  # hash the outputs exactly as stored
            nb.metadata["mentor"]["outputs_sha256"] = outputs_hash(nb)
            nbformat.write(nb, nb_path)
            print(f"{name}: {seconds:.1f} s", flush=True)
            results.append((name, seconds))
    return results


def sources_digest(sources: dict[str, str]) -> str:
    """SHA-256 of a :func:`mentor_sources` mapping (module path -> hash), independent of its order."""
    import json

    return hashlib.sha256(json.dumps(sources, sort_keys=True).encode()).hexdigest()


def changed_modules(recorded: dict[str, str], current: dict[str, str]) -> list[str]:
    """The module paths whose hash differs between two :func:`mentor_sources` mappings (added and removed ones too)."""
    return sorted(f for f in set(recorded) | set(current) if recorded.get(f) != current.get(f))


def _run_box() -> Any:
    """book/_ext/run_box.py, the Sphinx extension that shows a waiver on the page (it owns the waiver's wording)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_box", BOOK / "_ext" / "run_box.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def waiver_text(meta: dict) -> str | None:
    """The sentence the rendered page shows for ``meta``'s waiver (book/_ext/run_box.py); None without one."""
    return _run_box().waiver_text(meta)


class WaiverRefused(ValueError):
    """``waive`` cannot accept the notebook's change (it is not a mentor change only, or there is none)."""


def waive(nb_path: Path, reason: str, renames: dict[str, str] | None = None) -> dict:
    """Accept, in ``nb_path``'s metadata, the change of the mentor modules it imports since its stored run.

    The waiver (``metadata.mentor.waiver``) names the changed modules (and which of them are new or
    gone: ``added``, ``removed``), the hash of the module mapping it accepts (:func:`sources_digest`) and
    ``reason``; :func:`stale` then accepts exactly that change and still fails on any other mentor change,
    a code-cell change or an edited output. Only a run that is otherwise current can be waived.

    ``renames`` (``{"mentor.env": "mentor.lab.env"}``) is for a module that moved: the code cells must then
    import it under its new name. The waiver records the renames and accepts code cells that, with every new
    name put back to its old one (:func:`unrenamed`), are exactly the code of the stored run; any other code
    change is still refused, by ``waive`` and by :func:`stale`. Returns the waiver.
    """
    name = display_path(Path(nb_path))
    if not isinstance(reason, str) or not reason.strip():
        raise WaiverRefused(f"{name}: a waiver needs a reason, e.g. --reason \"needs two GPUs; none available\"")
    nb = nbformat.read(nb_path, as_version=4)
    meta = nb.metadata.get("mentor", {})
    if meta.get("code_sha256") is None or meta.get("mentor_sources") is None:
        raise WaiverRefused(f"{name}: no stored GPU run with per-module hashes to waive a change of; "
                            f"run it first: make gpu-run NB={name}")
    renames = _check_renames(name, renames or {})
    others = [r for r in _run_reasons(nb, meta) if not r.startswith(_SOURCES_CHANGED)
              and not (r == _CODE_CHANGED and renames
                       and code_hash(unrenamed(nb, renames), stored_scheme(meta)) == meta["code_sha256"])]
    if others:
        raise WaiverRefused(f"{name}: a waiver accepts a change of mentor modules only, and this run also "
                            f"{'; '.join(others)}; rerun it: make gpu-run NB={name}")
    current = mentor_sources(nb, scheme=stored_scheme(meta))
    modules = changed_modules(meta["mentor_sources"], current)
    if not modules:
        raise WaiverRefused(f"{name}: the mentor modules it imports are unchanged since its stored run: "
                            "there is nothing to waive")
    recorded = meta["mentor_sources"]
    waiver = {"reason": reason.strip(), "modules": modules,
              "added": [m for m in modules if m not in recorded], "removed": [m for m in modules if m not in current],
              "accepts": sources_digest(current), "written": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    if renames:
        if code_hash(nb, stored_scheme(meta)) == meta["code_sha256"]:
            raise WaiverRefused(f"{name}: its code cells do not use the renamed modules "
                                f"({', '.join(f'{old} -> {new}' for old, new in renames.items())}): leave --rename out")
        waiver["renames"] = renames
    nb.metadata["mentor"]["waiver"] = waiver
    nbformat.write(nb, nb_path)
    return waiver


_SOURCES_CHANGED = "the mentor source it imports changed since its stored GPU run"
_CODE_CHANGED = "code cells changed since its stored GPU run"
_MODULE_NAME = re.compile(r"^mentor(\.[A-Za-z_]\w*)+$")


def _check_renames(name: str, renames: dict[str, str]) -> dict[str, str]:
    """``renames`` checked: dotted ``mentor`` module names, old to new, each old and new name used once."""
    for old, new in renames.items():
        if not (isinstance(old, str) and isinstance(new, str) and _MODULE_NAME.match(old) and _MODULE_NAME.match(new)):
            raise WaiverRefused(f"{name}: a rename maps an old mentor module to its new name, e.g. "
                                f"mentor.env=mentor.lab.env; got {old!r} -> {new!r}")
        if old == new:
            raise WaiverRefused(f"{name}: the rename {old} -> {new} renames nothing")
    if len(set(renames.values())) != len(renames):
        raise WaiverRefused(f"{name}: two modules are renamed to one name: {renames}")
    return dict(sorted(renames.items()))


def unrenamed(nb: NotebookNode, renames: dict[str, str]) -> NotebookNode:
    """A copy of ``nb`` whose code cells name every module of ``renames`` ``{old: new}`` by its old name again.

    A new name is replaced where it stands as a whole dotted name (``mentor.lab.env`` in
    ``from mentor.lab.env import x`` or ``mentor.lab.env.get_profile``, not in ``mentor.lab.envs``).

    >>> from nbformat.v4 import new_code_cell, new_notebook
    >>> nb = new_notebook(cells=[new_code_cell("from mentor.lab.env import x\nimport mentor.lab.envs")])
    >>> unrenamed(nb, {"mentor.env": "mentor.lab.env"}).cells[0].source
    'from mentor.env import x\nimport mentor.lab.envs'
    """
    import copy

    out = copy.deepcopy(nb)
    for cell in out.cells:
        if cell.cell_type != "code":
            continue
        source = "".join(cell.source) if isinstance(cell.source, list) else cell.source
        for old, new in renames.items():
            source = re.sub(rf"(?<![\w.]){re.escape(new)}(?![\w])", old, source)
        cell.source = source
    return out


def _run_reasons(nb: NotebookNode, meta: dict, package: str | None = None) -> list[str]:
    """Why the stored run in ``meta`` does not match ``nb``, waiver not applied (empty when it matches)."""
    reasons = forbidden(nb) + figures_without_images(nb)
    if not nb.cells:
        reasons.append("has no cells")
    if meta.get("code_sha256") is None:
        reasons.append("has no stored GPU run (metadata.mentor.code_sha256 is missing)")
        return reasons
    if meta["code_sha256"] != code_hash(nb, stored_scheme(meta)):
        reasons.append(_CODE_CHANGED)
    recorded = meta.get("mentor_sources")
    if recorded is not None:
        changed = changed_modules(recorded, mentor_sources(nb, scheme=stored_scheme(meta)))
        if changed:
            reasons.append(f"{_SOURCES_CHANGED} ({', '.join('mentor/' + f for f in changed)})")
    elif meta.get("mentor_sha256") != (mentor_hash() if package is None else package):
        reasons.append("the mentor package changed since its stored GPU run" if meta.get("mentor_sha256")
                       else "its stored GPU run does not record the mentor source it ran with")
    if meta.get("outputs_sha256") != outputs_hash(nb):
        reasons.append("its outputs were edited after its stored GPU run" if meta.get("outputs_sha256")
                       else "its stored GPU run does not record a hash of its outputs")
    return reasons


def _apply_waiver(nb: NotebookNode, meta: dict, reasons: list[str], name: str) -> list[str]:
    """``reasons`` with the mentor change removed when the notebook's waiver accepts exactly that change.

    A waiver that accepts another change, or one left behind when nothing changed, is a reason of its own.
    """
    waiver = meta.get("waiver")
    if not waiver:
        return reasons
    sources = [r for r in reasons if r.startswith(_SOURCES_CHANGED)]
    if not sources:
        if meta.get("code_sha256") is not None and meta.get("mentor_sources") is not None:
            return reasons + ["carries a waiver, but the mentor modules it imports are unchanged since its stored "
                              "run: remove metadata.mentor.waiver"]
        return reasons
    current = mentor_sources(nb, scheme=stored_scheme(meta))
    if (waiver.get("accepts") == sources_digest(current)
            and waiver.get("modules") == changed_modules(meta["mentor_sources"], current)):
        renames = waiver.get("renames") or {}
        renamed_only = bool(renames) and code_hash(unrenamed(nb, renames), stored_scheme(meta)) == meta.get("code_sha256")
        return [r for r in reasons if r not in sources and not (r == _CODE_CHANGED and renamed_only)]
    return [r + f", and its waiver ({waiver.get('reason')!r}) accepts another change (waive this one with "
            f"python scripts/nbtools.py waive {name} --reason ...)" if r in sources else r for r in reasons]


def reads_of(nb_path: Path) -> tuple[str, ...]:
    """The notebooks beside ``nb_path`` whose results or metadata it reads (:data:`READS`; every one for EVERY)."""
    folder, name = Path(nb_path).parent, Path(nb_path).name
    if name == EVERY:
        return tuple(p.name for p in sorted(folder.glob("*.ipynb")) if p.name != name)
    return READS.get(name, ())


def _executed(path: Path) -> str | None:
    """The ``executed`` time of the stored run in the notebook at ``path``; None when it has none or is unreadable."""
    import json

    try:
        return json.loads(path.read_text(encoding="utf-8"))["metadata"]["mentor"]["executed"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_after(nb_path: Path, meta: dict) -> list[str]:
    """Why ``nb_path``'s stored run (metadata ``meta``) did not read the current runs of the notebooks it reads.

    ``gpu-run`` records, in ``meta["read"]``, the ``executed`` time of each notebook it read as it found it; each
    must still be that notebook's stored run. A run stored without that record must at least be newer than each.
    Notebooks beside it that are missing or unreadable are left to their own check.
    """
    executed = meta.get("executed")
    if executed is None:
        return []
    folder = Path(nb_path).parent
    recorded = meta.get("read")
    problems = []
    for other in reads_of(nb_path):
        when = _executed(folder / other)
        if when is None:
            continue
        if recorded is not None:
            if recorded.get(other) != when:
                problems.append(f"it read the stored run of {other} from {recorded.get(other) or 'nowhere'}, and that "
                                f"notebook's stored run is now from {when}; rerun it after {other}")
        elif dt.datetime.fromisoformat(when) > dt.datetime.fromisoformat(executed):
            problems.append(f"its stored run ({executed}) is older than the stored run of {other} ({when}), "
                            f"whose results it reads; rerun it after {other}")
    return problems


def stale(notebooks: Sequence[Path]) -> list[str]:
    """One message per notebook whose stored GPU run is missing or no longer matches it.

    A stored run matches when its code cells, the ``mentor`` modules it imports and its outputs
    hash as they did when ``gpu-run`` wrote it, no cell skips itself or hides an error, every figure
    was stored with its image, and it ran after the notebooks whose results it reads (:func:`read_after`).
    A waiver (:func:`waive`) accepts one change of the modules: exactly the one it names. A notebook
    that cannot be read gets a message too, and the others are still checked.
    """
    messages = []
    package = mentor_hash()
    for nb_path in notebooks:
        name = display_path(Path(nb_path))
        refresh = f"refresh it with: make gpu-run NB={name}"
        try:
            nb = nbformat.read(nb_path, as_version=4)
        except FileNotFoundError:
            messages.append(f"{name}: no such notebook; pass the path of a .ipynb file in book/")
            continue
        except Exception as error:  # nbformat raises several types for bad JSON and bad schema
            messages.append(f"{name}: not a readable notebook ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); "
                            "restore it from git or re-save it from Jupyter")
            continue
        meta = nb.metadata.get("mentor", {})
        reasons = _apply_waiver(nb, meta, _run_reasons(nb, meta, package), name) + read_after(Path(nb_path), meta)
        messages.extend(f"{name}: {reason}; {refresh}" for reason in reasons)
    return messages


def waived(notebooks: Sequence[Path]) -> list[str]:
    """``name: sentence`` for each readable notebook that carries a waiver (see :func:`waiver_text`)."""
    out = []
    for nb_path in notebooks:
        try:
            text = waiver_text(nbformat.read(nb_path, as_version=4).metadata.get("mentor", {}))
        except Exception:  # noqa: BLE001 - stale() reports unreadable notebooks
            continue
        if text:
            out.append(f"{display_path(Path(nb_path))}: {text}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for command, text in [
        ("smoke", "execute copies on the CPU (MENTOR_PROFILE=smoke); fail on any error"),
        ("gpu-run", "execute in place (MENTOR_PROFILE=full) and store outputs and provenance"),
        ("check", "fail if a notebook's stored GPU run is not current (code, mentor source, outputs, tags)"),
    ]:
        sub = commands.add_parser(command, help=text, description=text)
        sub.add_argument("notebooks", nargs="*", type=Path, metavar="NB", help="default: every book/*.ipynb")
        if command == "smoke":
            sub.add_argument("-j", "--jobs", type=int, default=1,
                             help="notebooks run at once, each in a copy of its own (default: 1, one copy in turn)")
            sub.add_argument("--json", type=Path, metavar="FILE",
                             help="write each notebook's outcome to FILE ({NB: {seconds} or {error}}) and run every "
                                  "notebook, also after a failure")
    text = ("accept the change of the mentor modules NB imports since its stored run, for a reason the "
            "rendered page shows (a rerun that needs hardware that is not available)")
    sub = commands.add_parser("waive", help=text, description=text)
    sub.add_argument("notebook", type=Path, metavar="NB")
    sub.add_argument("--reason", required=True, help='e.g. "needs two GPUs; none available"')
    sub.add_argument("--rename", action="append", default=[], metavar="OLD=NEW",
                     help="a module that moved, e.g. mentor.env=mentor.lab.env: accept code cells that differ from "
                          "the stored run's only by importing it under its new name (repeat for each module)")
    args = parser.parse_args(argv)
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
        else:
            messages = stale(notebooks)
            for message in messages:
                print(message)
            if messages:
                return 1
            notes = waived(notebooks)
            print(f"ok: {len(notebooks)} notebook(s) match their stored GPU run"
                  + (f", {len(notes)} of them under a waiver:" if notes else ""))
            for note in notes:
                print(f"  {note}")
    except NotebookFailed as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
