"""Subclasses made at run time that still pickle: each is stored under its name in the module that makes it."""

from __future__ import annotations

from typing import Any


def named_subclass(namespace: dict[str, Any], prefix: str, base: type, attrs: dict[str, Any], doc: str) -> type:
    """The subclass ``prefix + base.__name__`` of ``base``, made once and stored in ``namespace``.

    ``namespace`` is the ``globals()`` of the module that makes it, so the class is a name of
    that module: instances pickle and ``torch.save`` by reference, and the same base always gives
    the same class, so ``isinstance`` works across calls. Another base of the same name is refused.

    Example:
        >>> space = {"__name__": "demo"}
        >>> made = named_subclass(space, "My", int, {}, "an int")
        >>> made.__module__, made.__name__, named_subclass(space, "My", int, {}, "an int") is made
        ('demo', 'Myint', True)
    """
    name = prefix + base.__name__
    made = namespace.get(name)
    if made is None:
        made = type(name, (base,), {**attrs, "__module__": namespace["__name__"], "__qualname__": name,
                                    "__doc__": doc})
        namespace[name] = made
    elif made.__mro__[1] is not base:
        raise TypeError(f"{namespace['__name__']}.{name} already exists for another class named {base.__name__} "
                        f"({made.__mro__[1].__module__}); give {base.__module__}.{base.__qualname__} another name "
                        "so that both can be pickled.")
    return made
