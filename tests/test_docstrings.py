"""Runs every docstring example in meshplan as a test.

Docstrings promise runnable examples; this keeps the promise checked. The
8 CPU devices from conftest are in place before any example runs.
"""

import doctest
import importlib
import pkgutil

import pytest

import meshplan


def _modules() -> list[str]:
    names = [meshplan.__name__]
    for info in pkgutil.walk_packages(meshplan.__path__, prefix="meshplan."):
        # Importing __main__ would run the command line.
        if not info.name.endswith("__main__"):
            names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("module_name", _modules())
def test_docstring_examples_run(module_name: str) -> None:
    module = importlib.import_module(module_name)
    result = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False
    )
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {module_name}"
