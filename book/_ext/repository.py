"""Show a link to the book's repository when the build is told where it is.

The repository's address is read from one place, the environment variable ``BOOK_REPOSITORY_URL``
(``BOOK_REPOSITORY_URL=https://github.com/OWNER/NAME make book``). When it is set, the book's header
gets sphinx-book-theme's repository button, which links to it. When it is unset or empty, the build
shows no repository button and no placeholder (``_config.yml`` turns the button off and leaves
``repository.url`` empty, since the build has no network and no address is known).

sphinx-book-theme derives the button's provider and the ``OWNER/NAME`` parts from the address at
``builder-inited`` (``update_context_with_repository_info`` in ``sphinx_book_theme/header_buttons``),
and refuses an address whose host is not GitHub, GitLab or Bitbucket. This extension checks the
address when the configuration is read, so that a wrong one fails the build with an error that names
the variable, not one from inside the theme.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

VARIABLE = "BOOK_REPOSITORY_URL"
HOSTS = ("github.com", "gitlab.com", "bitbucket.org")


def repository_url(environ: dict[str, str] | None = None) -> str | None:
    """The repository address given in ``BOOK_REPOSITORY_URL``, checked; None when it is unset or empty.

    >>> repository_url({"BOOK_REPOSITORY_URL": "https://github.com/owner/metrics-book/"})
    'https://github.com/owner/metrics-book'
    >>> repository_url({}) is None
    True
    >>> repository_url({"BOOK_REPOSITORY_URL": "github.com/owner/metrics-book"})
    Traceback (most recent call last):
    ...
    ValueError: BOOK_REPOSITORY_URL='github.com/owner/metrics-book' is not a repository address: pass \
https://HOST/OWNER/NAME with HOST one of github.com, gitlab.com, bitbucket.org, or leave it unset for no repository link
    """
    value = (os.environ if environ is None else environ).get(VARIABLE, "").strip()
    if not value:
        return None
    parts = urlsplit(value)
    path = [part for part in parts.path.split("/") if part]
    if (parts.scheme != "https" or parts.netloc.lower() not in HOSTS or len(path) != 2
            or parts.query or parts.fragment):
        raise ValueError(f"{VARIABLE}={value!r} is not a repository address: pass https://HOST/OWNER/NAME with "
                         f"HOST one of {', '.join(HOSTS)}, or leave it unset for no repository link")
    return f"https://{parts.netloc.lower()}/{path[0]}/{path[1]}"


def _set_repository(app: Any, config: Any) -> None:
    """``config-inited``: turn the repository button on, pointing at ``BOOK_REPOSITORY_URL``, when it is set."""
    from sphinx.errors import ConfigError

    try:
        url = repository_url()
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if url is None:
        return
    options = dict(config.html_theme_options or {})
    options.update(repository_url=url, use_repository_button=True)
    config.html_theme_options = options


def setup(app: Any) -> dict[str, Any]:
    app.connect("config-inited", _set_repository)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
