"""mentor._named: a subclass made at run time is a name of the module that makes it, so that its instances pickle,
and a second base of the same name is refused (its docstring's example shows the name and the reuse)."""

import pickle

import pytest

from exact import whole
from mentor._named import named_subclass


class Base:
    """A base class of this module, whose subclass this module makes at run time."""

    def __init__(self, value: int) -> None:
        self.value = value


def test_a_made_subclass_is_a_name_of_its_module_and_its_instances_pickle() -> None:
    made = named_subclass(globals(), "Named", Base, {"double": lambda self: 2 * self.value}, "a Base that doubles")
    assert globals()["NamedBase"] is made
    assert (made.__module__, made.__name__, made.__qualname__, made.__doc__, made.__bases__) == (
        __name__, "NamedBase", "NamedBase", "a Base that doubles", (Base,))
    copy = pickle.loads(pickle.dumps(made(21)))  # by reference: test_named.NamedBase
    assert type(copy) is made and copy.double() == 42
    assert named_subclass(globals(), "Named", Base, {}, "ignored the second time") is made


def test_a_second_base_of_the_same_name_is_refused_naming_both() -> None:
    space = {"__name__": "demo"}
    mine = named_subclass(space, "My", int, {}, "an int")
    other = type("int", (), {"__module__": "elsewhere", "__qualname__": "Holder.int"})
    with pytest.raises(TypeError, match=whole(
            "demo.Myint already exists for another class named int (builtins); give elsewhere.Holder.int another "
            "name so that both can be pickled.")):
        named_subclass(space, "My", other, {}, "another int")
    assert space["Myint"] is mine and mine.__bases__ == (int,)


def test_the_refusal_names_the_module_of_the_base_already_made_not_of_its_parent() -> None:
    space = {"__name__": "demo"}
    named_subclass(space, "My", Base, {}, "a Base")  # Base's parent, object, lives in builtins; Base in this module
    other = type("Base", (), {"__module__": "elsewhere"})
    with pytest.raises(TypeError, match=whole(
            f"demo.MyBase already exists for another class named Base ({__name__}); give elsewhere.Base another "
            "name so that both can be pickled.")):
        named_subclass(space, "My", other, {}, "another Base")
