"""Helpers shared by the tests: matching a whole error message."""

import re


def whole(message: str) -> str:
    """An anchored regex that matches ``message`` exactly (pytest.raises(match=...) only searches).

    Example:
        >>> bool(re.search(whole("a (b)."), "a (b).")), bool(re.search(whole("a (b)."), "xa (b)."))
        (True, False)
    """
    return "^" + re.escape(message) + "$"
