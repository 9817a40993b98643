"""Keep ``file:line`` in docstrings a piece of text, not a link.

mentor's docstrings say that a report names each sync's ``file:line``. Where one writes it bare, docutils
reads ``file:line`` as a URI of the ``file`` scheme and the API page links to it: a link that goes nowhere. This
extension marks every bare ``file:`` token of a docstring as inline literal when autodoc reads it, so the
source can stay plain prose and the page shows the words as code.
"""

from __future__ import annotations

import re
from typing import Any

BARE_FILE_TOKEN = re.compile(r"(?<![`\w/])(file:[\w\-/]+(?:\.[\w\-/]+)*)(?![`\w])")


def literal_file_tokens(line: str) -> str:
    """``line`` with each bare ``file:...`` token written as an inline literal.

    >>> literal_file_tokens("every sync with its file:line, and (file:line is where it points)")
    'every sync with its ``file:line``, and (``file:line`` is where it points)'
    >>> literal_file_tokens("already ``file:line``, and profile:3 is no file token; a sentence ends at file:line.")
    'already ``file:line``, and profile:3 is no file token; a sentence ends at ``file:line``.'
    """
    return BARE_FILE_TOKEN.sub(r"``\1``", line)


def _process(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    lines[:] = [literal_file_tokens(line) for line in lines]


def setup(app: Any) -> dict[str, Any]:
    app.connect("autodoc-process-docstring", _process)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
