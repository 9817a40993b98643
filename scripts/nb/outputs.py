"""What a stored notebook's outputs may not hold: skipped cells, hidden errors, figures without images, the
machine's paths, and hidden stderr."""

from __future__ import annotations

import re

from nbformat import NotebookNode


GLUE_PREFIX = "application/papermill.record/"
FIGURE_REPR = re.compile(r"^<Figure size [\d.]+x[\d.]+ with \d+ Axes>$")
"""matplotlib's text repr of a figure: stored without an image beside it, the figure was not drawn (a kernel whose
MPLBACKEND was a non-inline backend such as Agg displays only this)."""


FORBIDDEN_TAGS = ("skip-execution", "raises-exception")
"""Cell tags that skip a cell or hide its error: a stored run with them proves nothing."""
FORBIDDEN_LINE = re.compile(r"^\s*(%%capture|!)", re.MULTILINE)
"""Cell magics whose failure a notebook run does not see: a captured error, a failing shell command."""


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
"""The folder on the GPU machine where ``.whl/install.sh`` installs the wheels copied there (``pip --target``): a path
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
