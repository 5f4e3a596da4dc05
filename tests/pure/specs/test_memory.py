"""estimate_memory equals what live jax.Arrays hold, per device, byte for byte."""

import json
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from meshplan.pure import (
    MeshplanTypeError,
    SpecError,
    estimate_memory,
    estimate_training_memory,
    optimizer_state_specs,
    validate_specs,
)
from meshplan.pure.specs import UNCONSTRAINED, dtype_bits, validate_and_estimate
from meshplan.testing import mesh_for, mesh_shapes, sharded_trees
from tests.hash_seed import outputs_under_two_hash_seeds

DTYPES = [np.float32, np.int8, np.bool_, np.complex64, jnp.bfloat16, jnp.int4, jnp.uint2,
          jnp.float8_e4m3fn, jnp.float4_e2m1fn]


def placed_trees(*, even: bool = True):
    """Sharded flat dicts of 1-3 leaves (nesting is tree_facts' concern) on meshes over the 8
    test devices, dims possibly 0.

    ``even``: dims are multiples of the mesh size, so every drawn split divides;
    else dims are small numbers and splits may be uneven. Shrinks to one rank-0 leaf.
    """
    return sharded_trees(mesh_shape=mesh_shapes(num_devices=8), divisible=even, allow_empty=True,
                         allow_uneven=not even, dtypes=DTYPES, max_leaves=1)


def leaves_and_specs(case):
    """The drawn tree's leaves and their specs, in the same order."""
    specs = jax.tree.leaves(case.specs, is_leaf=lambda x: isinstance(x, P))
    return list(zip(jax.tree.leaves(case.tree), specs, strict=True))


def live_bytes_per_device(mesh, tree, specs) -> dict[int, int]:
    """Sum of addressable_shards[i].data.nbytes per device id of the tree placed by device_put."""
    arrays = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), tree)
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))
    placed = jax.device_put(arrays, shardings)
    out = {d.id: 0 for d in mesh.devices.flat}
    for x in jax.tree.leaves(placed):
        for shard in x.addressable_shards:
            out[shard.device.id] += shard.data.nbytes
    return out


@given(placed_trees())
def test_estimate_equals_live_shard_bytes_on_every_device(case):
    mesh, tree, specs = mesh_for(case.axis_sizes), case.tree, case.specs
    est = estimate_memory(tree, specs, case.axis_sizes)
    by_device = dict(zip((d.id for d in mesh.devices.flat), est.per_device, strict=True))
    assert by_device == live_bytes_per_device(mesh, tree, specs)
    assert not est.padded and est.exact
    pairs = leaves_and_specs(case)
    full = [math.prod(s.shape) * np.dtype(s.dtype).itemsize for s, _ in pairs]
    assert est.total_unsharded_bytes == sum(full)
    replicated = [n for n, (_, spec) in zip(full, pairs) if NamedSharding(mesh, spec).is_fully_replicated]
    assert est.replicated_bytes == sum(replicated)
    assert est.max_per_device == max(est.per_device) and est.num_arrays == len(pairs)


@given(placed_trees())
def test_packed_subbyte_counts_each_shard_packed(case):
    mesh = mesh_for(case.axis_sizes)
    est = estimate_memory(case.tree, case.specs, case.axis_sizes, packed_subbyte=True)
    expected = 0
    for s, spec in leaves_and_specs(case):
        n = math.prod(NamedSharding(mesh, spec).shard_shape(s.shape))
        expected += -(-n * dtype_bits(s.dtype) // 8)
    assert est.per_device == (expected,) * mesh.size


@given(placed_trees(even=False))
def test_uneven_splits_count_padded_buffers_or_the_real_slice_each_device_gets(case):
    mesh, sizes = mesh_for(case.axis_sizes), case.axis_sizes
    actual = estimate_memory(case.tree, case.specs, sizes, padding="actual")
    padded = estimate_memory(case.tree, case.specs, sizes)
    # Oracle: jax's device -> slice map for the padded-up shape, clipped to the real shape
    # (XLA puts the padding at the end of each split dim).
    expected_actual = {d.id: 0 for d in mesh.devices.flat}
    expected_padded = 0
    pairs = leaves_and_specs(case)
    for s, spec in pairs:
        itemsize = np.dtype(s.dtype).itemsize
        up = padded_shape(s.shape, spec, sizes)
        sharding = NamedSharding(mesh, spec)
        for device, index in sharding.devices_indices_map(up).items():
            real = math.prod(len(range(d)[sl]) for sl, d in zip(index, s.shape, strict=True))
            expected_actual[device.id] += real * itemsize
        expected_padded += math.prod(sharding.shard_shape(up)) * itemsize
    assert dict(zip((d.id for d in mesh.devices.flat), actual.per_device, strict=True)) == expected_actual
    assert padded.per_device == (expected_padded,) * mesh.size
    uneven = any(padded_shape(s.shape, spec, sizes) != s.shape for s, spec in pairs)
    assert padded.padded == actual.padded == uneven
    assert actual.total_unsharded_bytes == padded.total_unsharded_bytes


def padded_shape(shape, spec, sizes):
    """``shape`` with every split dim rounded up to a multiple of its split."""
    entries = list(spec) + [None] * (len(shape) - len(spec))
    out = []
    for d, e in zip(shape, entries, strict=True):
        axes = () if e is None else (e,) if isinstance(e, str) else tuple(e)
        n = math.prod(sizes[a] for a in axes)
        out.append(-(-d // n) * n)
    return tuple(out)


SIZES = {"dp": 2, "tp": 4}


def test_to_dict_has_the_reference_keys_with_exact_meanings():
    params = {"w": np.zeros((8, 16), np.float32), "b": np.zeros(16, np.float32)}
    d = estimate_memory(params, {"w": P("dp", "tp"), "b": P()}, SIZES).to_dict()
    assert d["total_size"] == 8 * 16 * 4 + 16 * 4
    assert d["size_per_device"] == d["max_per_device"] == 4 * 4 * 4 + 16 * 4
    assert d["replicated_bytes"] == 64 and d["sharded_bytes"] == 512 and d["num_devices"] == 8
    assert d["per_device"] == [d["size_per_device"]] * 8 and d["mean_per_device"] == d["size_per_device"]


def test_specs_that_cannot_be_counted_raise_once_with_every_path():
    params = {"a": np.zeros(8), "b": np.zeros(8), "c": np.zeros(5)}
    with pytest.raises(SpecError) as info:
        estimate_memory(params, {"a": P("zz"), "b": P("dp", "tp"), "c": P("dp")}, SIZES)
    message = str(info.value)
    assert "'a'" in message and "'b'" in message and "'c'" not in message  # uneven 'c' is countable


def test_unconstrained_dims_are_counted_replicated_and_flagged_inexact():
    est = estimate_memory([np.zeros((8, 8), np.int8)], [P(UNCONSTRAINED, "tp")], SIZES)
    assert est.per_device == (16,) * 8 and not est.exact


def test_a_leaf_with_a_dtype_jax_cannot_hold_is_named():
    with pytest.raises(MeshplanTypeError, match="leaf 'names'"):
        estimate_memory({"names": np.array(["a", "b"]), "w": np.zeros(2)}, {"names": P(), "w": P()}, SIZES)


def test_non_array_and_none_leaves_take_no_memory():
    tree = {"act": "relu", "n": None, "w": np.zeros(4, np.int8)}
    est = estimate_memory(tree, {"act": None, "n": None, "w": P()}, SIZES)
    assert est.per_device == (4,) * 8 and est.num_arrays == 1


def test_bad_padding_option_is_a_typed_error():
    # An unknown word is a wrong value (SpecError, a ValueError); a non-str is a wrong type.
    with pytest.raises(SpecError, match="padding='ceil'"):
        estimate_memory([np.zeros(4)], [P()], SIZES, padding="ceil")
    with pytest.raises(MeshplanTypeError, match="padding"):
        estimate_memory([np.zeros(4)], [P()], SIZES, padding=np.array(["padded"]))


def test_estimates_add_per_device_and_refuse_other_meshes():
    a = estimate_memory([np.zeros((8,), np.int8)], [P("dp")], SIZES)
    b = estimate_memory([np.zeros((8,), np.int8)], [P()], SIZES)
    assert (a + b).per_device == (12,) * 8 and a.scaled(3).per_device == (12,) * 8
    with pytest.raises(MeshplanTypeError, match="different meshes"):
        a + estimate_memory([np.zeros(8)], [P()], {"dp": 8})


def test_an_empty_mesh_is_one_device():
    est = estimate_memory({"w": np.zeros(3, np.float32)}, {"w": P()}, {})
    assert est.per_device == (12,) and est.mesh_shape == ()


# --- training memory ---------------------------------------------------------------------------


class AdamState(NamedTuple):  # the structure of optax.ScaleByAdamState
    count: Any
    mu: Any
    nu: Any


class FactoredState(NamedTuple):  # the structure of optax's factored (Adafactor) state
    count: Any
    v_row: Any
    v_col: Any
    v: Any


def sds(shape, dtype=np.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


PARAMS = {"embed": sds((64, 16), jnp.bfloat16), "dense": {"kernel": sds((16, 32)), "bias": sds((32,))},
          "step": sds((), np.int32)}
PARAM_SPECS = {"embed": P("tp", "dp"), "dense": {"kernel": P("dp", "tp"), "bias": P()}, "step": P()}


def test_optimizer_state_specs_follow_params_where_the_state_mirrors_them():
    adam_like = (AdamState(sds((), np.int32), PARAMS, PARAMS), ())
    specs = optimizer_state_specs(PARAMS, PARAM_SPECS, adam_like)
    assert specs == (AdamState(P(), PARAM_SPECS, PARAM_SPECS), ())


def test_factored_statistics_of_another_shape_are_replicated():
    v_row = jax.tree.map(lambda s: sds(s.shape[:1]), PARAMS)
    state = FactoredState(sds((), np.int32), v_row, v_row, PARAMS)
    specs = optimizer_state_specs(PARAMS, PARAM_SPECS, state)
    assert specs.v == PARAM_SPECS
    assert specs.v_row == {"embed": P(), "dense": {"kernel": P(), "bias": P()}, "step": P()}


def test_training_memory_equals_live_placement_of_params_grads_and_state():
    params = {"w": sds((16, 8)), "b": sds((8,), jnp.bfloat16), "n": sds((4,), np.int32)}
    mesh = jax.make_mesh((2, 4), ("dp", "tp"))
    specs = {"w": P("dp", "tp"), "b": P("tp"), "n": P()}
    state = (AdamState(sds((), np.int32), jax.tree.map(lambda s: sds(s.shape), params),
                       jax.tree.map(lambda s: sds(s.shape), params)), ())
    est = estimate_training_memory(params, specs, dict(mesh.shape), opt_state=state, grad_dtype=np.float32)
    state_specs = optimizer_state_specs(params, specs, state)
    grads = {"w": sds((16, 8)), "b": sds((8,)), "n": sds((4,), jax.dtypes.float0)}
    live = [live_bytes_per_device(mesh, params, specs),
            live_bytes_per_device(mesh, {"w": grads["w"], "b": grads["b"]}, {"w": specs["w"], "b": specs["b"]}),
            live_bytes_per_device(mesh, state, state_specs)]
    ids = [d.id for d in mesh.devices.flat]
    for part, expected in zip((est.params, est.grads, est.opt_state), live, strict=True):
        assert dict(zip(ids, part.per_device, strict=True)) == expected
    assert est.per_device == tuple(sum(x) for x in zip(*(p.per_device for p in (est.params, est.grads, est.opt_state))))
    assert est.to_dict()["total"] == est.max_per_device


def test_optimizer_copies_model_adam_without_the_step_count():
    specs = PARAM_SPECS
    state = (AdamState(sds((), np.int32), jax.tree.map(lambda s: sds(s.shape), PARAMS),
                       jax.tree.map(lambda s: sds(s.shape), PARAMS)), ())
    exact = estimate_training_memory(PARAMS, specs, SIZES, opt_state=state)
    modelled = estimate_training_memory(PARAMS, specs, SIZES, optimizer_copies=2, optimizer_dtype=np.float32)
    # The model has no step count (int32: 4 bytes per device) and gives the
    # integer param 'step' no state, where this state has two float32 scalars.
    diff = {e - m for e, m in zip(exact.opt_state.per_device, modelled.opt_state.per_device, strict=True)}
    assert diff == {4 + 2 * 4}


def test_opt_state_and_copies_are_exclusive():
    with pytest.raises(MeshplanTypeError, match="not both"):
        estimate_training_memory(PARAMS, PARAM_SPECS, SIZES, opt_state=(), optimizer_copies=2)


# --- determinism -------------------------------------------------------------------------------

_SCRIPT = """
import json
import numpy as np
from jax.sharding import PartitionSpec as P
from meshplan.pure import estimate_memory, validate_specs
tree = {name: np.zeros((6, 8), np.float32) for name in ["zeta", "alpha", "mid", "beta", "omega"]}
specs = {"zeta": P("tp"), "alpha": P("x"), "mid": P(("tp", "dp")), "beta": P(None, "dp"), "omega": P("dp", "dp")}
sizes = {"tp": 4, "dp": 2}
findings = [[f.path, f.kind, f.message] for f in validate_specs(tree, specs, sizes)]
est = estimate_memory(tree, {k: P(None, "tp") for k in tree}, sizes, padding="actual").to_dict()
print(json.dumps([findings, est]))
"""


def test_output_does_not_depend_on_the_hash_seed():
    outputs = [json.loads(out) for out in outputs_under_two_hash_seeds(_SCRIPT)]
    assert outputs[0] == outputs[1]
    assert [f[0] for f in outputs[0][0]] == ["alpha", "mid", "omega", "zeta"]


_any_entry = st.one_of(st.none(), st.sampled_from(["dp", "tp", "zz", ("dp", "tp"), ("tp", "tp"), UNCONSTRAINED]))


@given(
    shapes=st.lists(st.lists(st.sampled_from([1, 2, 3, 4, 8]), max_size=3).map(tuple), min_size=1, max_size=3),
    raw_specs=st.lists(st.lists(_any_entry, max_size=3).map(lambda e: P(*e)), min_size=3, max_size=3),
)
def test_validate_and_estimate_is_both_calls_in_one(shapes, raw_specs):
    tree = [np.zeros(s, np.float32) for s in shapes]
    specs = raw_specs[: len(tree)]
    findings, est = validate_and_estimate(tree, specs, SIZES)
    assert findings == validate_specs(tree, specs, SIZES)
    try:
        expected = estimate_memory(tree, specs, SIZES)
    except SpecError:
        expected = None
    assert est == expected
