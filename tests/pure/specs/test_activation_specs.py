"""activation_layout: the batch, residual-stream and logits specs a training step applies.

Oracles: the memory model's documented formula (``b*s*h*a / tp`` per device
when everything divides), storage validity (``check_specs``), and jax itself
(the bytes of a live shard placed and constrained with the spec).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.profiles import examples
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from meshplan.errors import MeshplanError, MeshplanTypeError, PlanError
from meshplan.pure.specs import (
    ACTIVATION_NAMES,
    ActivationLayout,
    ActivationSpec,
    activation_layout,
    check_specs,
    spec_axes,
)
from meshplan.testing import mesh_for, mesh_shapes

AXES = ("dp", "fsdp", "sp", "tp")
ROLES = {"batch_axes": ("dp", "fsdp"), "seq_axes": ("sp",), "model_axes": ("tp",)}


@st.composite
def cases(draw: st.DrawFn) -> tuple[dict[str, int], dict[str, int]]:
    """A mesh over 8 devices (its axes in any order) and step sizes that may or may not divide."""
    mesh = draw(mesh_shapes(num_devices=8, axis_names=draw(st.permutations(AXES)))).as_dict()
    dims = {name: draw(st.sampled_from(values)) for name, values in (
        ("batch", (1, 2, 3, 4, 6, 8, 16)), ("seq", (1, 2, 4, 6, 8, 12, 16)),
        ("hidden", (1, 2, 3, 4, 6, 8, 12)), ("vocab", (1, 3, 4, 5, 8, 10)))}
    return mesh, dims


def _layout(mesh: dict[str, int], dims: dict[str, int]) -> ActivationLayout:
    return activation_layout(mesh, **dims, itemsize=2, **ROLES)


def _ways(spec: P, mesh: dict[str, int], dim: int) -> int:
    entry = spec[dim] if dim < len(spec) else None
    names = () if entry is None else (entry,) if isinstance(entry, str) else entry
    return math.prod(mesh[a] for a in names)


@given(cases())
def test_every_spec_stores_on_the_mesh(case: tuple[dict[str, int], dict[str, int]]) -> None:
    mesh, dims = case
    layout = _layout(mesh, dims)
    tree = {t.name: jax.ShapeDtypeStruct(t.shape, jnp.float32) for t in layout.tensors}
    check_specs(tree, layout.specs, mesh)  # raises on an unknown/repeated axis or an indivisible split
    assert tuple(layout.specs) == ACTIVATION_NAMES


@given(cases())
def test_axes_appear_in_mesh_order_and_size_one_axes_never(case: tuple[dict[str, int], dict[str, int]]) -> None:
    mesh, dims = case
    order = list(mesh)
    for spec in _layout(mesh, dims).specs.values():
        for entry in spec:
            names = () if entry is None else (entry,) if isinstance(entry, str) else entry
            assert [order.index(a) for a in names] == sorted(order.index(a) for a in names)
        assert all(mesh[a] > 1 for a in spec_axes(spec))


@given(cases(), st.booleans())
def test_tp_splits_the_residual_features_or_else_its_sequence_and_the_logits_vocab_only(
        case: tuple[dict[str, int], dict[str, int]], residual_split: bool) -> None:
    mesh, dims = case
    layout = activation_layout(mesh, **dims, itemsize=2, **ROLES, residual_split=residual_split)
    tp, seq_ways = mesh["tp"], _ways(layout["batch"].spec, mesh, 1)
    residual, logits = layout["residual"].spec, layout["logits"].spec
    can = residual_split and tp > 1 and (dims["hidden"] % tp == 0 or (dims["seq"] // seq_ways) % tp == 0)
    assert ("tp" in spec_axes(residual)) == can, residual
    assert ("tp" in spec_axes(logits)) == (tp > 1 and dims["vocab"] % tp == 0), logits
    for spec in (residual, logits):  # the batch split is the batch's own; the sequence's too, save a moved tp
        assert _ways(spec, mesh, 0) == _ways(layout["batch"].spec, mesh, 0)
        assert _ways(spec, mesh, 1) in (seq_ways, seq_ways * tp)


@given(cases())
def test_bytes_are_the_memory_models_formula_where_everything_divides(
        case: tuple[dict[str, int], dict[str, int]]) -> None:
    mesh, dims = case
    ways = mesh["dp"] * mesh["fsdp"]
    sp, tp = mesh["sp"], mesh["tp"]
    b, s, h, v = dims["batch"], dims["seq"], dims["hidden"], dims["vocab"]
    if b % ways or s % sp or h % tp or v % tp:
        return
    layout = _layout(mesh, dims)
    assert layout["residual"].shard_bytes(mesh) == b // ways * (s // sp) * h * 2 // tp
    assert layout["logits"].shard_bytes(mesh) == b // ways * (s // sp) * v * 4 // tp
    assert layout["batch"].shard_bytes(mesh) == b // ways * (s // sp) * 4


@settings(max_examples=examples(12))
@given(cases())
def test_shard_bytes_are_what_jax_places_and_constrains(case: tuple[dict[str, int], dict[str, int]]) -> None:
    mesh_sizes, dims = case
    mesh = mesh_for(mesh_sizes, axis_types="auto")  # with_sharding_constraint takes Auto axes
    layout = _layout(mesh_sizes, dims)
    residual = layout["residual"]
    sharding = NamedSharding(mesh, residual.spec)
    placed = jax.device_put(np.zeros(residual.shape, jnp.bfloat16), sharding)
    assert {s.data.nbytes for s in placed.addressable_shards} == {residual.shard_bytes(mesh_sizes)}
    constrained = jax.jit(lambda x: jax.lax.with_sharding_constraint(x * 2, sharding))(placed)
    assert constrained.sharding.is_equivalent_to(sharding, len(residual.shape))


@given(cases())
def test_json_round_trip(case: tuple[dict[str, int], dict[str, int]]) -> None:
    layout = _layout(*case)
    assert ActivationLayout.from_dict(layout.to_dict()) == layout


def test_a_hidden_size_tp_cannot_split_moves_tp_to_the_sequence_and_odd_logits_stay_whole() -> None:
    layout = activation_layout({"fsdp": 4, "tp": 2}, batch=8, seq=64, hidden=99, vocab=1001)
    assert layout.specs == {"batch": P("fsdp"), "residual": P("fsdp", "tp"), "logits": P("fsdp")}
    # Neither dim divides: tp is left out, and the bytes say so (not 1/tp of them).
    odd = activation_layout({"tp": 2}, batch=1, seq=3, hidden=5, vocab=7)
    assert odd["residual"].spec == P() and odd["residual"].shard_bytes({"tp": 2}) == 3 * 5 * 2


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"batch_axes": ("dp", "tp")}, PlanError, "'tp' in batch_axes and model_axes"),
    ({"batch": 0}, PlanError, "batch"),
    ({"hidden": 2.5}, MeshplanTypeError, "hidden"),
    ({"seq_axes": (3,)}, MeshplanTypeError, "seq_axes entry 3"),
    ({"residual_split": "yes"}, MeshplanTypeError, "residual_split"),
    ({"model_axes": "tp"}, MeshplanTypeError, "model_axes"),
])
def test_bad_arguments_are_typed_errors_naming_them(kwargs: dict, error: type, match: str) -> None:
    args = {"batch": 8, "seq": 8, "hidden": 8, "vocab": 8, **kwargs}
    with pytest.raises(error, match=match):
        activation_layout({"dp": 2, "tp": 2}, **args)


@pytest.mark.parametrize("bad", [
    5, {"tensors": 3}, {"tensors": [{"name": "batch"}]}, {"tensors": []}, {"tensors": [], "extra": 1},
    {"tensors": [{"name": "batch", "shape": [2, -1], "itemsize": 4, "spec": []}]},
    {"tensors": [{"name": "batch", "shape": [2, 2], "itemsize": 4, "spec": [3]}]},
    {"tensors": [{"name": "batch", "shape": [2], "itemsize": 4, "spec": ["dp", "sp"]}]},
])
def test_a_bad_saved_layout_is_a_typed_error(bad: object) -> None:
    with pytest.raises(MeshplanError):
        ActivationLayout.from_dict(bad)  # type: ignore[arg-type]


def test_an_activation_spec_needs_a_partition_spec() -> None:
    with pytest.raises(MeshplanTypeError, match="PartitionSpec"):
        ActivationSpec("residual", (2, 2, 2), 2, ("dp",))  # type: ignore[arg-type]
