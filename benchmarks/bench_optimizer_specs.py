"""optimizer_state_specs on large trees, against a jax.tree.map over the same state in the same process.

Run: ``python benchmarks/bench_optimizer_specs.py``. Pure code only: no devices are used.

The baseline is the floor of any per-leaf answer: one ``jax.tree.map`` over the
optimizer state. The ratio says how many such passes deriving the specs costs.
Cases: AdamW (moments with the parameters' structure: the fast path), AdamW
under ``optax.masked`` with a mask that drops some leaves (the moments no longer
share the parameters' structure, so their leaves are matched by key path), and
Adafactor (factored statistics of other shapes).

Goal: a 50k-parameter state in well under a second.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from _table import best_of, print_table  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from meshplan.pure.specs import optimizer_state_specs  # noqa: E402


def _tree(layers: int) -> dict[str, dict[str, jax.ShapeDtypeStruct]]:
    return {f"layer_{i}": {f"w{j}": jax.ShapeDtypeStruct((64, 32), jnp.float32) for j in range(10)}
            for i in range(layers)}


def main() -> None:
    rows = []
    for layers in (500, 5000):
        params = _tree(layers)
        specs = jax.tree.map(lambda _: P("dp"), params)
        mask = jax.tree_util.tree_map_with_path(lambda path, _: not str(path[-1]).endswith("w0']"), params)
        cases = [("adamw", optax.adamw(1e-3)), ("masked adamw", optax.masked(optax.adamw(1e-3), mask))]
        if layers <= 500:  # optax's own init of a 50k-leaf adafactor state takes ~20 s here
            cases.append(("adafactor", optax.adafactor(1e-3, min_dim_size_to_factor=16)))
        for name, opt in cases:
            state = jax.eval_shape(opt.init, params)
            leaves = len(jax.tree.leaves(params))
            seconds = best_of(lambda: optimizer_state_specs(params, specs, state), repeat=3)
            floor = best_of(lambda: jax.tree.map(lambda x: x, state), repeat=3)
            rows.append((f"{name}, {leaves} params", seconds, floor))
    print_table("optimizer_state_specs", rows, "tree_map(state)")


if __name__ == "__main__":
    main()
