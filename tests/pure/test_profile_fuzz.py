"""Nested garbage into every public callable of the profile and measurement rooms: typed errors only.

``tests/test_fuzz.py`` fuzzes ``meshplan``, ``meshplan.pure`` and several of its subpackages; these names live in
``meshplan.pure.cluster`` and ``meshplan.pure.cost``, which it does not enumerate yet, so they are fuzzed here with
its garbage and its contract (return, or raise a MeshplanError that is a ValueError or TypeError).
"""

from __future__ import annotations

import inspect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.pure import cluster, cost
from tests.test_fuzz import _check_call, garbage

_NAMES = {
    cluster: ("CollectiveTiming", "MachineProfile", "MatmulTiming", "MemoryTiming", "StepTiming",
              "check_profile_device", "cpu_device", "device_for_kind", "link_grid", "machine_cluster",
              "measure_document", "rank_measured", "read_measure"),
    cost: ("ProfilePricing", "fit_link", "fit_matmuls", "fit_steps", "matmul_shapes", "profile_document",
           "profile_figures", "profiled_cluster", "profiled_device", "refine_profile", "ring_terms", "sweep_shapes"),
}
_TARGETS = [(f"{mod.__name__}.{name}", getattr(mod, name)) for mod, names in _NAMES.items() for name in names]
_CLASSMETHODS = [("MachineProfile.from_json", cluster.MachineProfile.from_json),
                 ("MachineProfile.from_dict", cluster.MachineProfile.from_dict),
                 ("StepTiming.from_dict", cluster.StepTiming.from_dict),
                 ("ProfilePricing.from_dict", cost.ProfilePricing.from_dict)]


@pytest.mark.parametrize("label, fn", _TARGETS + _CLASSMETHODS, ids=[t[0] for t in _TARGETS + _CLASSMETHODS])
@settings(max_examples=25)
@given(data=st.data())
def test_garbage_gets_a_typed_error(label: str, fn, data: st.DataObject) -> None:
    params = [p for p in inspect.signature(fn).parameters.values() if p.kind is not p.VAR_KEYWORD]
    args, kwargs = [], {}
    for p in params:
        if p.default is not p.empty and not data.draw(st.booleans()):
            continue
        value = data.draw(garbage)
        if p.kind is p.KEYWORD_ONLY:
            kwargs[p.name] = value
        else:
            args.append(value)
    _check_call(label, fn, args, kwargs)
