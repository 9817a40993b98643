"""Let the search find a name by one of its parts: "scatter" finds ``scatter_stat_scores``.

Sphinx's English search splits text into words with the regular expression ``\\w+``
(``SearchLanguage.split`` in ``sphinx/search/__init__.py``), so an identifier such as
``scatter_stat_scores`` is one word. Its searchtools.js looks at partial matches only for a query word
that is not itself a word of the index, so once any page has "scatter" on its own, a search for it
misses the pages that name only ``scatter_stat_scores``. This extension registers, through
``app.add_search_language``, an English search language whose ``split`` also yields the parts of each
word joined by underscores. The parts go through the same stemming and stop-word rules as any word.
"""

from __future__ import annotations

from typing import Any

from sphinx.search.en import SearchEnglish


def with_parts(words: list[str]) -> list[str]:
    """``words`` followed by the parts of each one that underscores join (a word with no inner underscore adds none).

    >>> with_parts(["scatter_stat_scores", "flat_sync", "_private", "plain"])
    ['scatter_stat_scores', 'flat_sync', '_private', 'plain', 'scatter', 'stat', 'scores', 'flat', 'sync']
    """
    return words + [part for word in words if "_" in word.strip("_") for part in word.split("_") if part]


class SearchEnglishParts(SearchEnglish):
    """Sphinx's English search, with the underscore-joined parts of each word indexed as words too."""

    def split(self, input: str) -> list[str]:  # noqa: A002 (Sphinx's name)
        return with_parts(super().split(input))


def setup(app: Any) -> dict[str, Any]:
    app.add_search_language(SearchEnglishParts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
