"""Train a flax nnx Llama-style model for 20 steps on the mesh and layout the planner chose (8 CPU devices)."""

from functools import partial

import jax
import optax
from flax import nnx

import meshplan
from tests.examples._live import cpu_cluster, live_bytes

SPEC = meshplan.ModelSpec("nnx-llama", "llama", vocab_size=256, hidden_size=64, num_layers=2, num_heads=4,
                          num_kv_heads=4, head_dim=16, intermediate_size=128)


class Block(nnx.Module):
    def __init__(self, d: int, f: int, rngs: nnx.Rngs) -> None:
        self.input_layernorm, self.post_attention_layernorm = nnx.RMSNorm(d, rngs=rngs), nnx.RMSNorm(d, rngs=rngs)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nnx.Linear(d, d, use_bias=False, rngs=rngs) for _ in "qkvo")
        self.gate_proj, self.up_proj = nnx.Linear(d, f, use_bias=False, rngs=rngs), nnx.Linear(d, f, use_bias=False, rngs=rngs)
        self.down_proj = nnx.Linear(f, d, use_bias=False, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        (b, s, d), h = x.shape, self.input_layernorm(x)
        q, k, v = (p(h).reshape(b, s, SPEC.num_heads, SPEC.head_dim) for p in (self.q_proj, self.k_proj, self.v_proj))
        x = x + self.o_proj(jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(b, s, d))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(jax.nn.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        d, v = SPEC.hidden_size, SPEC.vocab_size
        self.embed_tokens = nnx.Embed(v, d, rngs=rngs)
        self.layers = nnx.List([Block(d, SPEC.intermediate_size, rngs) for _ in range(SPEC.num_layers)])
        self.norm, self.lm_head = nnx.RMSNorm(d, rngs=rngs), nnx.Linear(d, v, use_bias=False, rngs=rngs)

    def __call__(self, tokens: jax.Array, constrain) -> jax.Array:  # constrain(x, "residual" | "logits")
        x = constrain(self.embed_tokens(tokens), "residual")
        for layer in self.layers:
            x = constrain(layer(x), "residual")
        return constrain(self.lm_head(self.norm(x)), "logits")


def test_nnx_llama_trains_on_the_planned_mesh_with_the_planned_bytes() -> None:
    graphdef, params = nnx.split(Llama(nnx.Rngs(0)), nnx.Param)
    opt = optax.adamw(1e-2)
    best = meshplan.search_meshes(SPEC, cpu_cluster(2**20), params=params, batch=8, seq=32).best
    mesh = meshplan.create_mesh(best.axis_sizes, best.axis_names)
    layout = best.training_layout(params, jax.eval_shape(opt.init, params))
    sh = layout.shardings(mesh)
    params, opt_state = meshplan.place((params, opt.init(params)), layout.state, mesh)  # one device_put

    def constrain(x: jax.Array, name: str) -> jax.Array:
        return jax.lax.with_sharding_constraint(x, sh.activations[name])

    @partial(jax.jit, in_shardings=(*sh.state, sh.batch, sh.batch), out_shardings=(*sh.state, None))
    def step(params, opt_state, x, y):
        def loss_fn(p):
            logits = nnx.merge(graphdef, p)(x, constrain)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    tokens = jax.random.randint(jax.random.key(0), (8, 33), 0, SPEC.vocab_size)
    losses = []
    for _ in range(20):
        params, opt_state, loss = step(params, opt_state, tokens[:, :-1], tokens[:, 1:])
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0], losses
    est = meshplan.estimate_training_memory(params, layout.params, best.mesh_shape, opt_state=opt_state,
                                            opt_state_specs=layout.opt_state)
    assert est.params.per_device == tuple(live_bytes(params, mesh))
    assert est.opt_state.per_device == tuple(live_bytes(opt_state, mesh))
    assert best.memory.params == max(live_bytes(params, mesh))
    assert best.memory.optimizer + 4 == max(live_bytes(opt_state, mesh))  # + adamw's int32 step count
    print(best.text, losses[0], losses[-1])
