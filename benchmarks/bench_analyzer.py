"""Spec validation and memory estimation on Llama-like trees, against one tree_map.

Run: ``python benchmarks/bench_analyzer.py`` (8 simulated CPU devices). The
baseline is ``jax.tree_util.tree_map(lambda x: x, tree)``: the least any
whole-tree pass can cost.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import gc  # noqa: E402

import numpy as np  # noqa: E402
from _table import best_of, print_table  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from meshplan import ShardingAnalyzer  # noqa: E402
from meshplan.pure import estimate_memory, tree_facts, validate_specs
from meshplan.pure.specs import validate_and_estimate

_LAYER = {  # (shape, spec) of one Llama-like block: 9 leaves
    "q": ((4096, 4096), P("fsdp", "tp")), "k": ((4096, 1024), P("fsdp", "tp")),
    "v": ((4096, 1024), P("fsdp", "tp")), "o": ((4096, 4096), P("tp", "fsdp")),
    "gate": ((4096, 14336), P("fsdp", "tp")), "up": ((4096, 14336), P("fsdp", "tp")),
    "down": ((14336, 4096), P("tp", "fsdp")), "attn_norm": ((4096,), P()), "mlp_norm": ((4096,), P()),
}


def llama_like(num_leaves: int, *, bad_every: int = 0) -> tuple[dict, dict]:
    """A tree of ``num_leaves`` bf16 ShapeDtypeStructs and its specs; every ``bad_every``-th layer's
    norm gets a too-long spec (to time the path-formatting cost of findings)."""
    params, specs = {}, {}
    for i in range(-(-num_leaves // len(_LAYER))):
        params[f"layer_{i}"] = {k: jax.ShapeDtypeStruct(s, np.dtype("bfloat16")) for k, (s, _) in _LAYER.items()}
        specs[f"layer_{i}"] = {k: p for k, (_, p) in _LAYER.items()}
        if bad_every and i % bad_every == 0:
            specs[f"layer_{i}"]["attn_norm"] = P("tp", "fsdp")  # too long: a finding
    return params, specs


def main() -> None:
    mesh = jax.make_mesh((2, 4), ("fsdp", "tp"))
    sizes = dict(mesh.shape)
    analyzer = ShardingAnalyzer(mesh)
    rows = []
    for n in (300, 3_000, 50_000):
        params, specs = llama_like(n)
        # Long-lived trees sit in the oldest GC generation in real programs;
        # freezing them keeps collections from adding noise to every row.
        gc.collect()
        gc.freeze()
        leaves = len(jax.tree.leaves(params))
        repeat = 5 if n > 10_000 else 9
        base = best_of(lambda: jax.tree_util.tree_map(lambda x: x, params), repeat=repeat)
        rows += [
            (f"{leaves} leaves: tree_facts", best_of(lambda: tree_facts(params), repeat=repeat), base),
            (f"{leaves} leaves: validate_specs",
             best_of(lambda: validate_specs(params, specs, sizes), repeat=repeat), base),
            (f"{leaves} leaves: estimate_memory",
             best_of(lambda: estimate_memory(params, specs, sizes), repeat=repeat), base),
            (f"{leaves} leaves: validate_and_estimate",
             best_of(lambda: validate_and_estimate(params, specs, sizes), repeat=repeat), base),
            (f"{leaves} leaves: analyzer.validate + estimate",
             best_of(lambda: (analyzer.validate_partition_specs(params, specs),
                              analyzer.estimate_memory_usage(params, specs)), repeat=repeat), base),
        ]
    params, specs = llama_like(50_000, bad_every=10)
    gc.collect()
    gc.freeze()
    found = len(validate_specs(params, specs, sizes))
    base = best_of(lambda: jax.tree_util.tree_map(lambda x: x, params), repeat=5)
    rows.append((f"50k leaves, {found} findings: validate_specs",
                 best_of(lambda: validate_specs(params, specs, sizes), repeat=5), base))
    print_table("meshplan validation and memory estimate (8 CPU devices)", rows, "one tree_map")


if __name__ == "__main__":
    main()
