"""layer_activation_specs: the heads, MLP-width and expert specs a reference step pins inside a layer.

Oracles: storage validity (``check_specs`` on the tensors' shapes), the token split
of the batch spec kept on the batch/sequence dims, and the rule the reference step
relies on: no model or expert axis, no new constraint (the experts' spec is then
the one the step always applied).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

from meshplan.errors import MeshplanTypeError, PlanError
from meshplan.pure.specs import (
    LAYER_ACTIVATION_NAMES,
    activation_layout,
    canonical_entries,
    check_specs,
    layer_activation_specs,
    spec_axes,
)
from meshplan.testing import mesh_shapes

AXES = ("dp", "fsdp", "ep", "sp", "tp")


@st.composite
def cases(draw: st.DrawFn) -> tuple[dict[str, int], P, dict[str, int]]:
    """A mesh over 8 devices, the batch spec the search's layout gives it, and layer widths."""
    mesh = draw(mesh_shapes(num_devices=8, axis_names=AXES)).as_dict()
    batch, seq = draw(st.sampled_from((8, 16, 3))), draw(st.sampled_from((8, 16, 6)))
    bspec = activation_layout(mesh, batch=batch, seq=seq, hidden=8, vocab=8).specs["batch"]
    dims = {name: draw(st.sampled_from(values)) for name, values in (
        ("heads", (1, 2, 4, 6, 8, 12)), ("kv_heads", (1, 2, 3, 4, 8)), ("mlp", (4, 6, 8, 10, 16)),
        ("experts", (0, 0, 4, 6, 8)), ("expert_mlp", (4, 6, 8)))}
    return mesh, bspec, dims


def _shapes(dims: dict[str, int]) -> dict[str, jax.ShapeDtypeStruct]:
    b, s, d, c = 16, 16, 4, 3  # batch and seq divide by every split the batch spec can make
    return {name: jax.ShapeDtypeStruct(shape, jnp.float32) for name, shape in (
        ("heads", (b, s, dims["heads"], d)), ("kv_heads", (b, s, dims["kv_heads"], d)),
        ("mlp", (b, s, dims["mlp"])), ("experts", (max(dims["experts"], 1), b, c, d)),
        ("dispatch", (max(dims["experts"], 1), b, c, d)),
        ("expert_mlp", (max(dims["experts"], 1), b, c, dims["expert_mlp"])))}


def _entry(spec: P, dim: int) -> tuple[str, ...]:
    e = spec[dim] if dim < len(spec) else None
    return () if e is None else (e,) if isinstance(e, str) else tuple(e)


@given(cases())
def test_every_spec_stores_and_keeps_the_token_split(case: tuple[dict[str, int], P, dict[str, int]]) -> None:
    mesh, bspec, dims = case
    specs = layer_activation_specs(mesh, bspec, **dims)
    assert list(specs) == [n for n in LAYER_ACTIVATION_NAMES if n in specs]
    shapes = _shapes(dims)
    check_specs({n: shapes[n] for n in specs}, specs, mesh)  # raises on an indivisible or repeated axis
    for name, spec in specs.items():
        assert all(mesh[a] > 1 for a in spec_axes(spec))
        if name in ("heads", "kv_heads", "mlp"):
            assert (_entry(spec, 0), _entry(spec, 1)) == (_entry(bspec, 0), _entry(bspec, 1))


@given(cases())
def test_tp_pins_exactly_the_widths_it_divides(case: tuple[dict[str, int], P, dict[str, int]]) -> None:
    mesh, bspec, dims = case
    specs = layer_activation_specs(mesh, bspec, **dims)
    tp = mesh["tp"]
    for name, dim in (("heads", 2), ("kv_heads", 2), ("mlp", 2)):
        assert (name in specs) == (tp > 1 and dims[name] % tp == 0), (name, specs)
        if name in specs:
            assert _entry(specs[name], dim) == ("tp",)
    assert ("expert_mlp" in specs) == (tp > 1 and dims["experts"] > 0 and dims["expert_mlp"] % tp == 0)


@given(cases())
def test_without_tp_or_ep_only_the_old_experts_constraint_remains(case: tuple[dict[str, int], P, dict[str, int]]
                                                                  ) -> None:
    mesh, bspec, dims = case
    mesh = {a: (1 if a in ("tp", "ep") else n) for a, n in mesh.items()}
    bspec = activation_layout(mesh, batch=16, seq=16, hidden=8, vocab=8).specs["batch"]
    specs = layer_activation_specs(mesh, bspec, **dims)
    if not dims["experts"]:
        assert specs == {}
        return
    # The reference step always constrained the dispatched tokens (experts, batch, capacity, d) this way.
    assert list(specs) == ["experts"]
    assert canonical_entries(specs["experts"], 4) == ((), _entry(bspec, 0), (), ())


@given(cases())
def test_ep_splits_the_experts_and_leaves_the_batch_to_the_other_axes(
        case: tuple[dict[str, int], P, dict[str, int]]) -> None:
    mesh, bspec, dims = case
    specs = layer_activation_specs(mesh, bspec, **dims)
    if not dims["experts"]:
        assert "experts" not in specs
        return
    ep = mesh["ep"]
    assert _entry(specs["experts"], 0) == (("ep",) if ep > 1 and dims["experts"] % ep == 0 else ())
    # GShard: tokens are dispatched where they are (experts whole, batch as the tokens), then moved.
    assert ("dispatch" in specs) == (_entry(specs["experts"], 0) == ("ep",))
    if "dispatch" in specs:
        assert canonical_entries(specs["dispatch"], 4) == ((), _entry(bspec, 0), (), ())
    assert _entry(specs["experts"], 1) == tuple(a for a in _entry(bspec, 0) if a not in _entry(specs["experts"], 0))
    assert math.prod(mesh[a] for a in spec_axes(specs["experts"])) <= math.prod(mesh.values())


def test_examples_and_bad_input() -> None:
    got = layer_activation_specs({"fsdp": 2, "tp": 4}, P("fsdp"), heads=8, kv_heads=2, mlp=256, experts=8,
                                 expert_mlp=64)
    assert got == {"heads": P("fsdp", None, "tp"), "mlp": P("fsdp", None, "tp"),
                   "experts": P(None, "fsdp"), "expert_mlp": P(None, "fsdp", None, "tp")}
    with pytest.raises(PlanError, match="heads"):
        layer_activation_specs({"tp": 2}, P(), heads=0, kv_heads=1, mlp=2)
    with pytest.raises(PlanError, match="experts"):
        layer_activation_specs({"tp": 2}, P(), heads=2, kv_heads=1, mlp=2, experts=-1)
    with pytest.raises(MeshplanTypeError, match="batch_spec"):
        layer_activation_specs({"tp": 2}, "dp", heads=2, kv_heads=1, mlp=2)  # type: ignore[arg-type]
    with pytest.raises(MeshplanTypeError, match="model_axes"):
        layer_activation_specs({"tp": 2}, P(), heads=2, kv_heads=1, mlp=2, model_axes="tp")
