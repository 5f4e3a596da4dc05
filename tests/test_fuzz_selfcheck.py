"""The fuzz test of tests/test_fuzz.py checked itself: it must fail on a raw error, and reach every public name.

A fuzz test that cannot fail is a defect: these run its own machinery (``_targets``, ``_fuzz``) on
callables written to leak a raw error, and require the failure, naming the error; on a callable that raises
only typed errors, and require a pass; and on a module made up here, to show that a name added to a public
``__all__`` is fuzzed with nothing else to edit.
"""

from __future__ import annotations

import os
import pkgutil
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

import meshplan.pure
import tests.test_fuzz as fuzz
from meshplan.pure.errors import MeshplanTypeError, PlanError

_SELFCHECK = "meshplan_fuzz_selfcheck"  # a module made up for one test, never imported from disk
# Calls per self-check: enough that a raw error one call in four reaches is found every time ((3/4)**100 is
# 3e-13), few enough for a second (the callables here are trivial).
_EXAMPLES = 100


def unvalidated(shape: Any) -> int:
    """Reads its argument unchecked: ``None``, ``3`` or ``{}`` make it raise a raw TypeError or KeyError."""
    return int(shape[0]) + 1


def behind_a_check(axis_sizes: Any, batch: Any) -> int:
    """Checks ``axis_sizes`` and then reads ``batch`` unchecked: garbage reaches ``batch`` only when
    ``axis_sizes`` is valid, which the fuzzer's one-bad-argument calls arrange (a quarter of the calls)."""
    if not isinstance(axis_sizes, dict):
        raise PlanError(f"axis_sizes={axis_sizes!r:.40} must be a dict.")
    return batch + 1  # type: ignore[no-any-return]


def validated(shape: Any) -> int:
    """Refuses everything but a tuple of ints with a typed error: nothing raw ever leaves it."""
    if not (isinstance(shape, tuple) and all(type(d) is int for d in shape)):
        raise MeshplanTypeError(f"shape={shape!r:.40} must be a tuple of ints.")
    return len(shape)


class Unvalidated:
    """A public class whose method and constructor read their arguments unchecked."""

    def __init__(self, shape: Any = (1,)) -> None:
        self.rank = len(shape)

    def dim(self, index: Any) -> int:
        return (4, 8)[index]


def _failures(err: BaseException) -> list[BaseException]:
    """``err``, or the failures hypothesis grouped in it when it found several distinct ones."""
    if isinstance(err, BaseExceptionGroup):
        return [leaf for inner in err.exceptions for leaf in _failures(inner)]
    return [err]


def _raw_failure(label: str, fn: Any, method: str | None = None, obj: Any = None) -> str:
    """The fuzzer's failure on ``fn`` (it must fail, with the fuzz test's own AssertionError): its messages."""
    with pytest.raises((AssertionError, BaseExceptionGroup)) as info:
        fuzz._fuzz(label, fn, method, obj, _EXAMPLES)
    failures = _failures(info.value)
    assert all(isinstance(f, AssertionError) for f in failures), failures
    return "\n".join(str(f) for f in failures)


def test_the_fuzzer_fails_on_a_raw_error_and_names_it() -> None:
    message = _raw_failure("unvalidated", unvalidated)
    assert "unvalidated(" in message and any(f"raised {e}" in message for e in ("TypeError", "KeyError",
                                                                                "IndexError", "ValueError"))


def test_the_fuzzer_reaches_a_raw_error_behind_a_checked_argument() -> None:
    assert "behind_a_check(" in _raw_failure("behind_a_check", behind_a_check)


def test_the_fuzzer_fails_on_a_raw_error_of_a_constructor_and_of_a_method() -> None:
    assert "raised TypeError" in _raw_failure("Unvalidated", Unvalidated)
    message = _raw_failure("Unvalidated().dim", None, "dim", Unvalidated())
    assert any(f"raised {e}" in message for e in ("TypeError", "IndexError"))


def test_the_fuzzer_passes_a_callable_that_raises_only_typed_errors() -> None:
    fuzz._fuzz("validated", validated, None, examples=_EXAMPLES)


@pytest.fixture
def selfcheck_module() -> Iterator[str]:
    module = types.ModuleType(_SELFCHECK)
    module.__dict__.update(unvalidated=unvalidated, Unvalidated=Unvalidated, validated=validated,
                           __all__=["Unvalidated", "unvalidated", "validated"])
    objects = (unvalidated, Unvalidated, validated)
    homes = [obj.__module__ for obj in objects]
    for obj in objects:  # _targets takes a class's members for meshplan's by their module's name
        obj.__module__ = f"meshplan.{_SELFCHECK}"
    sys.modules[_SELFCHECK] = module
    try:
        yield _SELFCHECK
    finally:
        del sys.modules[_SELFCHECK]
        for obj, home in zip(objects, homes, strict=True):
            obj.__module__ = home


def test_a_name_added_to_a_public_all_is_fuzzed_with_nothing_else_to_edit(selfcheck_module: str) -> None:
    targets = fuzz._targets((selfcheck_module,))
    assert [label for label, _, _ in targets] == ["Unvalidated", "Unvalidated().dim", "unvalidated", "validated"]
    escapes = []
    for label, fn, method in targets:
        try:
            fuzz._fuzz(label, fn, method, Unvalidated() if method else None, _EXAMPLES)
        except (AssertionError, BaseExceptionGroup):
            escapes.append(label)
    assert escapes == ["Unvalidated", "Unvalidated().dim", "unvalidated"]


def test_every_public_room_of_the_core_is_fuzzed() -> None:
    """Every ``meshplan/pure/<room>/`` package not named ``_...`` is among the fuzzed modules (found on disk,
    so this holds for a room added later), and the rooms issue 35 names are among them."""
    rooms = {f"meshplan.pure.{info.name}" for info in pkgutil.iter_modules(meshplan.pure.__path__)
             if info.ispkg and not info.name.startswith("_")}
    assert rooms | {"meshplan", "meshplan.pure"} == set(fuzz._MODULES)
    named = {"cost", "search", "rules", "cluster", "xla", "specs", "mesh", "presets", "verify", "report"}
    assert {f"meshplan.pure.{room}" for room in named} <= rooms


def test_every_fuzzed_module_lists_its_public_names() -> None:
    """A module without ``__all__`` would be fuzzed for nothing: each one has it, and each name resolves."""
    import importlib

    for name in fuzz._MODULES:
        module = importlib.import_module(name)
        assert module.__all__, name
        missing = [n for n in module.__all__ if not hasattr(module, n)]
        assert not missing, f"{name}.__all__ names {missing}, which it does not define"


def test_the_default_run_is_short_and_the_deep_one_long() -> None:
    """A few examples per callable by default (the CI run stays quick); forty times more under
    ``HYPOTHESIS_PROFILE=deep``."""
    deep = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
    assert fuzz._EXAMPLES == (400 if deep else 10)
