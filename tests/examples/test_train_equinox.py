"""An equinox language model, trained 20 steps on the mesh and shardings the planner chose (8 CPU devices)."""

import equinox as eqx
import jax
import optax

import meshplan
from tests.examples._common import SPEC, assert_planned_bytes, cpu_cluster, train


class Block(eqx.Module):
    gate_proj: eqx.nn.Linear
    up_proj: eqx.nn.Linear
    down_proj: eqx.nn.Linear

    def __call__(self, x: jax.Array) -> jax.Array:
        h = x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6)
        return x + (jax.nn.silu(h @ self.gate_proj.weight.T) * (h @ self.up_proj.weight.T)) @ self.down_proj.weight.T


class LM(eqx.Module):
    embed_tokens: eqx.nn.Embedding
    layers: list[Block]
    lm_head: eqx.nn.Linear

    def __call__(self, tokens: jax.Array, constrain) -> jax.Array:  # constrain(x, "residual" | "logits")
        x = constrain(self.embed_tokens.weight[tokens], "residual")
        for layer in self.layers:
            x = constrain(layer(x), "residual")
        return constrain(x @ self.lm_head.weight.T, "logits")


def make_lm(key: jax.Array) -> LM:
    keys, (d, f, v) = iter(jax.random.split(key, 32)), (SPEC.hidden_size, SPEC.intermediate_size, SPEC.vocab_size)
    linear = lambda i, o: eqx.nn.Linear(i, o, use_bias=False, key=next(keys))  # weight (out, in), as in PyTorch
    layers = [Block(linear(d, f), linear(d, f), linear(f, d)) for _ in range(SPEC.num_layers)]
    return LM(eqx.nn.Embedding(v, d, key=next(keys)), layers, linear(d, v))


def test_equinox_lm_trains_on_the_planned_mesh_with_the_planned_bytes() -> None:
    params, static = eqx.partition(make_lm(jax.random.key(0)), eqx.is_array)
    opt = optax.adamw(1e-2)
    best = meshplan.search_meshes(SPEC, cpu_cluster(), params=params, batch=8, seq=32, fixed={"tp": 2}).best
    mesh = meshplan.create_mesh(best.axis_sizes, best.axis_names)
    layout = best.training_layout(params, jax.eval_shape(opt.init, params))
    sh = layout.shardings(mesh)
    params, opt_state = meshplan.place((params, opt.init(params)), layout.state, mesh)
    constrain = lambda x, name: jax.lax.with_sharding_constraint(x, sh.activations[name])

    @jax.jit(in_shardings=(*sh.state, sh.batch, sh.batch), out_shardings=(*sh.state, None))
    def step(params, opt_state, x, y):
        loss_fn = lambda p: optax.softmax_cross_entropy_with_integer_labels(eqx.combine(p, static)(x, constrain), y)
        loss, grads = jax.value_and_grad(lambda p: loss_fn(p).mean())(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    params, opt_state, losses = train(step, params, opt_state)
    assert losses[-1] < 0.5 * losses[0], losses
    assert_planned_bytes(best, layout, params, opt_state, mesh)
