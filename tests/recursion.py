"""How much of Python's recursion budget is left: a leak of it (jaxlib 0.10's tree flatten failing on a
dict whose keys do not sort never gives frames back) makes every later deep call fail far from its cause."""

from __future__ import annotations


def recursion_budget() -> int:
    """How many more Python frames fit on the stack from here before a RecursionError."""
    depth = 0

    def down() -> None:
        nonlocal depth
        depth += 1
        down()

    try:
        down()
    except RecursionError:
        pass
    return depth
