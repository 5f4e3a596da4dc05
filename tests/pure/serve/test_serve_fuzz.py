"""Nested garbage into every public callable of ``meshplan.pure.serve`` and ``meshplan.pure.report``: only typed
meshplan errors may come out (the machinery of tests/test_fuzz.py, whose module list predates these rooms)."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_fuzz import _call_args, _check_call, _EXAMPLES

_MODULES = ("meshplan.pure.serve", "meshplan.pure.report")


def _instances() -> dict[str, Callable[[], Any]]:
    from meshplan.pure import serve
    from meshplan.pure.cluster import parse_cluster
    from meshplan.pure.presets import MODEL_SPECS

    spec, layout = MODEL_SPECS["llama3-8b"], serve.ServeLayout(1, 2)
    plan = serve.plan_serving("llama3.1-8b", "1x8xH100", context=2048, concurrency=8)
    kv = serve.kv_geometry(spec, layout, "bfloat16", serve.CacheFormat())
    return {
        "ServeLayout": lambda: layout, "WeightQuant": lambda: serve.WeightQuant("int8"),
        "CacheFormat": lambda: serve.CacheFormat(), "KvGeometry": lambda: kv,
        "WeightBytes": lambda: serve.weight_bytes(spec, layout), "ServePlan": lambda: plan,
        "ServeRow": lambda: plan.rows[0], "ServeRequest": lambda: plan.request,
        "ServeCalibration": lambda: serve.SERVE_CALIBRATION, "Engine": lambda: serve.engine("vllm"),
        "KvBudget": lambda: plan.rows[0].budget, "StepTime": lambda: plan.rows[0].decode,
        "ServeColumn": lambda: importlib.import_module("meshplan.pure.report").SERVE_COLUMNS[0],
        "_cluster": lambda: parse_cluster("1x8xH100"),
    }


def _targets() -> list[tuple[str, Callable[..., Any]]]:
    out = []
    for module in _MODULES:
        mod = importlib.import_module(module)
        for name in sorted(mod.__all__):
            obj = getattr(mod, name)
            if callable(obj) and not isinstance(obj, (dict, tuple)):
                out.append((f"{module}.{name}", obj))
    return out


TARGETS = _targets()


@pytest.mark.parametrize("label,fn", TARGETS, ids=[t[0] for t in TARGETS])
@settings(max_examples=_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_public_callables_take_garbage_with_typed_errors(label: str, fn: Callable[..., Any], data: Any) -> None:
    try:
        inspect.signature(fn)
    except (TypeError, ValueError):
        return
    args, kwargs = data.draw(_call_args(fn))
    _check_call(label, fn, args, kwargs)


METHODS = [(cls, name) for cls, make in _instances().items() if not cls.startswith("_")
           for name in sorted(dir(make())) if not name.startswith("_") and callable(getattr(make(), name, None))
           and not (isinstance(make(), tuple) and name in ("count", "index"))]  # a NamedTuple's own tuple methods


@pytest.mark.parametrize("cls,method", METHODS, ids=[f"{c}.{m}" for c, m in METHODS])
@settings(max_examples=_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_public_methods_take_garbage_with_typed_errors(cls: str, method: str, data: Any) -> None:
    fn = getattr(_instances()[cls](), method)
    try:
        inspect.signature(fn)
    except (TypeError, ValueError):
        return
    args, kwargs = data.draw(_call_args(fn))
    _check_call(f"{cls}.{method}", fn, args, kwargs)
