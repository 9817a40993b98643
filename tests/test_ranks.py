"""tests/ranks.py: the shared two-rank launch keeps each registered function's result or error apart."""

import pytest

import ranks


def _value(rank: int, world_size: int, scale: int) -> int:
    return rank * scale + world_size


def _raises(rank: int, world_size: int) -> None:
    if rank == 1:
        raise ValueError("only on rank 1")


def test_each_function_runs_in_turn_and_one_that_raises_leaves_the_others_results() -> None:
    out = ranks.run_each(1, 2, [("a", _value, (10,)), ("b", _raises, ()), ("c", _value, (3,))])
    assert out["a"] == ("ok", 12) and out["c"] == ("ok", 5)
    assert out["b"][0] == "error" and "ValueError: only on rank 1" in out["b"][1]
    assert ranks.run_each(0, 2, [("b", _raises, ())]) == {"b": ("ok", None)}


def test_a_key_that_was_not_registered_is_refused() -> None:
    with pytest.raises(KeyError, match="not registered with on_two_ranks"):
        ranks.results("nowhere.fn()")
