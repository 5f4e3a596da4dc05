"""optimizer_state_specs on real optax (and flax nnx) states: what mirrors a parameter is sharded like it.

Oracle for the bytes: live arrays placed with the derived specs on the 8 test
devices, against ``estimate_training_memory``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from hypothesis import given, settings

from tests.profiles import examples
from jax.sharding import PartitionSpec as P

import meshplan
from meshplan.errors import MeshplanTypeError, SpecError
from meshplan.pure.specs import estimate_training_memory, optimizer_state_specs, tree_facts
from meshplan.testing import mesh_for, mesh_shapes, sharded_trees

PARAMS = {"embed": jax.ShapeDtypeStruct((64, 16), jnp.float32), "dense": {"kernel": jax.ShapeDtypeStruct((16, 32), jnp.float32),
                                                                       "bias": jax.ShapeDtypeStruct((32,), jnp.float32)}}
SPECS = {"embed": P("tp", "dp"), "dense": {"kernel": P("dp", "tp"), "bias": P("tp")}}


def _pairs(params: object, specs: object, state: object) -> list[tuple[str, object]]:
    """(path, spec) of every state leaf, for readable assertions."""
    facts = tree_facts(state)
    derived = jax.tree.leaves(optimizer_state_specs(params, specs, state), is_leaf=lambda x: isinstance(x, P))
    return [(facts.path(i), s) for i, s in enumerate(derived)]


def test_adamw_moments_mirror_the_params_and_the_count_is_replicated() -> None:
    state = jax.eval_shape(optax.adamw(1e-3).init, PARAMS)
    got = dict(_pairs(PARAMS, SPECS, state))
    assert got["0/count"] == P()
    for moment in ("mu", "nu"):
        assert got[f"0/{moment}/embed"] == P("tp", "dp")
        assert got[f"0/{moment}/dense/kernel"] == P("dp", "tp")
        assert got[f"0/{moment}/dense/bias"] == P("tp")
    assert len(got) == 7  # count, mu x3, nu x3: the EmptyStates of the chain hold no leaves


@pytest.mark.parametrize("opt", [
    optax.masked(optax.adam(1e-3), {"embed": False, "dense": {"kernel": True, "bias": True}}),
    optax.multi_transform({"a": optax.adam(1e-3), "s": optax.sgd(1e-3, momentum=0.9)},
                          {"embed": "s", "dense": {"kernel": "a", "bias": "a"}}),
    optax.inject_hyperparams(optax.adamw)(learning_rate=1e-3),
    optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3), optax.ema(0.9)),
    optax.lion(1e-3),
], ids=["masked", "multi_transform", "inject_hyperparams", "chain_ema", "lion"])
def test_every_param_shaped_leaf_at_any_depth_gets_its_params_spec(opt: optax.GradientTransformation) -> None:
    state = jax.eval_shape(opt.init, PARAMS)
    by_suffix = {"embed": P("tp", "dp"), "dense/kernel": P("dp", "tp"), "dense/bias": P("tp")}
    mirrored = 0
    for path, spec in _pairs(PARAMS, SPECS, state):
        param = next((k for k in by_suffix if path.endswith("/" + k)), None)
        assert spec == (by_suffix[param] if param else P()), path
        mirrored += param is not None
    assert mirrored >= 2  # something was matched: the test can fail


def test_factored_statistics_of_another_shape_are_replicated() -> None:
    params = {"w": jax.ShapeDtypeStruct((256, 512), jnp.float32)}
    state = jax.eval_shape(optax.adafactor(1e-3, min_dim_size_to_factor=128).init, params)
    pairs = _pairs(params, {"w": P("dp", "tp")}, state)
    shapes = dict(zip((p for p, _ in pairs), (i.shape for i in tree_facts(state).infos)))
    for path, spec in pairs:
        assert spec == (P("dp", "tp") if shapes[path] == (256, 512) else P()), path
    assert any(shapes[p] == (256,) for p, _ in pairs)  # a factored row statistic exists, and is P()


def test_an_nnx_optimizer_state_matches_params_through_its_boxes() -> None:
    model = nnx.Linear(16, 32, rngs=nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    specs = {"kernel": P("dp", "tp"), "bias": P("tp")}  # a plain dict: box tails and containers differ
    state = nnx.state(nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param))
    got = dict(_pairs(nnx.to_pure_dict(params), specs, state))
    assert got["opt_state/0/mu/kernel/value"] == P("dp", "tp")
    assert got["opt_state/0/nu/bias/value"] == P("tp")
    assert got["opt_state/0/count/value"] == P() and got["step/value"] == P()


def test_the_longest_parameter_path_decides() -> None:
    params = {"kernel": jax.ShapeDtypeStruct((8, 8), jnp.float32),
              "q": {"kernel": jax.ShapeDtypeStruct((8, 8), jnp.float32)}}
    specs = {"kernel": P("dp"), "q": {"kernel": P(None, "tp")}}
    got = dict(_pairs(params, specs, jax.eval_shape(optax.adam(1e-3).init, params)))
    assert got["0/mu/q/kernel"] == P(None, "tp") and got["0/mu/kernel"] == P("dp")


@settings(max_examples=examples(25))
@given(sharded_trees(mesh_shape=mesh_shapes(num_devices=8), dtypes=("float32", "bfloat16"), divisible=True))
def test_placed_adam_state_holds_the_estimated_bytes_on_every_device(case: object) -> None:
    tree, specs, sizes = case.tree, case.specs, case.axis_sizes  # type: ignore[attr-defined]
    opt = optax.adam(1e-3, mu_dtype=jnp.bfloat16)
    state = jax.eval_shape(opt.init, tree)
    state_specs = optimizer_state_specs(tree, specs, state)
    mesh = mesh_for(sizes)
    live = meshplan.place(jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), state), state_specs, mesh)
    per = {d: 0 for d in mesh.devices.flat}
    for leaf in jax.tree.leaves(live):
        for shard in leaf.addressable_shards:
            per[shard.device] += shard.data.nbytes
    est = estimate_training_memory(tree, specs, sizes, opt_state=state, opt_state_specs=state_specs)
    assert est.opt_state.per_device == tuple(per[d] for d in mesh.devices.flat)


def test_specs_that_do_not_match_the_params_are_an_error_naming_them() -> None:
    with pytest.raises(SpecError):
        optimizer_state_specs(PARAMS, {"embed": P()}, jax.eval_shape(optax.adam(1e-3).init, PARAMS))
    with pytest.raises(MeshplanTypeError, match="opt_state"):
        optimizer_state_specs(PARAMS, SPECS, {1: 0, "w": 1})
