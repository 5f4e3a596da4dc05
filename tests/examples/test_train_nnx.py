"""A flax nnx Llama-style model, trained 20 steps on the mesh and shardings the planner chose (8 CPU devices)."""

import jax
import optax
from flax import nnx

import meshplan
from tests.examples._common import SPEC, assert_planned_bytes, cpu_cluster, train


class Block(nnx.Module):
    def __init__(self, d: int, f: int, rngs: nnx.Rngs) -> None:
        dense = lambda i, o: nnx.Linear(i, o, use_bias=False, rngs=rngs)  # kernel (in, out)
        self.input_layernorm, self.post_attention_layernorm = nnx.RMSNorm(d, rngs=rngs), nnx.RMSNorm(d, rngs=rngs)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = dense(d, d), dense(d, d), dense(d, d), dense(d, d)
        self.gate_proj, self.up_proj, self.down_proj = dense(d, f), dense(d, f), dense(f, d)

    def __call__(self, x: jax.Array) -> jax.Array:
        (b, s, d), h = x.shape, self.input_layernorm(x)
        q, k, v = (p(h).reshape(b, s, SPEC.num_heads, -1) for p in (self.q_proj, self.k_proj, self.v_proj))
        x = x + self.o_proj(jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(b, s, d))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(nnx.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        d, v = SPEC.hidden_size, SPEC.vocab_size
        self.embed_tokens, self.norm = nnx.Embed(v, d, rngs=rngs), nnx.RMSNorm(d, rngs=rngs)
        self.layers = nnx.List([Block(d, SPEC.intermediate_size, rngs) for _ in range(SPEC.num_layers)])
        self.lm_head = nnx.Linear(d, v, use_bias=False, rngs=rngs)

    def __call__(self, tokens: jax.Array, constrain) -> jax.Array:  # constrain(x, "residual" | "logits")
        x = constrain(self.embed_tokens(tokens), "residual")
        for layer in self.layers:
            x = constrain(layer(x), "residual")
        return constrain(self.lm_head(self.norm(x)), "logits")


def test_nnx_llama_trains_on_the_planned_mesh_with_the_planned_bytes() -> None:
    graphdef, params = nnx.split(Llama(nnx.Rngs(0)), nnx.Param)
    opt = optax.adamw(1e-2)
    best = meshplan.search_meshes(SPEC, cpu_cluster(), params=params, batch=8, seq=32).best
    mesh = meshplan.create_mesh(best.axis_sizes, best.axis_names)
    layout = best.training_layout(params, jax.eval_shape(opt.init, params))  # params, optimizer, batch, activations
    sh = layout.shardings(mesh)  # the same, as NamedShardings
    params, opt_state = meshplan.place((params, opt.init(params)), layout.state, mesh)  # one device_put
    constrain = lambda x, name: jax.lax.with_sharding_constraint(x, sh.activations[name])

    @jax.jit(in_shardings=(*sh.state, sh.batch, sh.batch), out_shardings=(*sh.state, None))
    def step(params, opt_state, x, y):
        loss_fn = lambda p: optax.softmax_cross_entropy_with_integer_labels(nnx.merge(graphdef, p)(x, constrain), y)
        loss, grads = jax.value_and_grad(lambda p: loss_fn(p).mean())(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    params, opt_state, losses = train(step, params, opt_state)
    assert losses[-1] < 0.5 * losses[0], losses
    assert_planned_bytes(best, layout, params, opt_state, mesh)
