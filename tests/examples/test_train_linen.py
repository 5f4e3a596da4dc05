"""A flax linen language model, trained 20 steps on the mesh and shardings the planner chose (8 CPU devices)."""

from typing import Any

import flax.linen as nn
import jax
import optax

import meshplan
from tests.examples._common import SPEC, TOKENS, assert_planned_bytes, cpu_cluster, train


class Block(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        (b, s, d), h = x.shape, nn.RMSNorm(name="input_layernorm")(x)
        q, k, v = (nn.Dense(d, use_bias=False, name=f"{n}_proj")(h).reshape(b, s, SPEC.num_heads, -1) for n in "qkv")
        attention = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(b, s, d)
        x = x + nn.Dense(d, use_bias=False, name="o_proj")(attention)
        h = nn.RMSNorm(name="post_attention_layernorm")(x)
        gate, up = (nn.Dense(SPEC.intermediate_size, use_bias=False, name=n)(h) for n in ("gate_proj", "up_proj"))
        return x + nn.Dense(d, use_bias=False, name="down_proj")(nn.silu(gate) * up)


class LM(nn.Module):
    constrain: Any  # constrain(x, "residual" | "logits")

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.constrain(nn.Embed(SPEC.vocab_size, SPEC.hidden_size, name="embed_tokens")(tokens), "residual")
        for i in range(SPEC.num_layers):
            x = self.constrain(Block(name=f"layers_{i}")(x), "residual")
        logits = nn.Dense(SPEC.vocab_size, use_bias=False, name="lm_head")(nn.RMSNorm(name="norm")(x))
        return self.constrain(logits, "logits")


def test_linen_lm_trains_on_the_planned_mesh_with_the_planned_bytes() -> None:
    params = LM(lambda x, _: x).init(jax.random.key(1), TOKENS[:, :-1])  # {"params": {...}}: linen's layout
    opt = optax.adamw(1e-2)
    best = meshplan.search_meshes(SPEC, cpu_cluster(), params=params, batch=8, seq=32).best
    mesh = meshplan.create_mesh(best.axis_sizes, best.axis_names)
    layout = best.training_layout(params, jax.eval_shape(opt.init, params))
    sh = layout.shardings(mesh)
    params, opt_state = meshplan.place((params, opt.init(params)), layout.state, mesh)
    model = LM(lambda x, name: jax.lax.with_sharding_constraint(x, sh.activations[name]))

    @jax.jit(in_shardings=(*sh.state, sh.batch, sh.batch), out_shardings=(*sh.state, None))
    def step(params, opt_state, x, y):
        loss_fn = lambda p: optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    params, opt_state, losses = train(step, params, opt_state)
    assert losses[-1] < 0.5 * losses[0], losses
    assert_planned_bytes(best, layout, params, opt_state, mesh)
