"""Mesh creation: cache miss and cache hit, against jax.make_mesh in the same process.

Run: ``python benchmarks/bench_mesh.py`` (8 simulated CPU devices).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

from _table import best_of, print_table  # noqa: E402
from jax.sharding import AxisType  # noqa: E402

from meshplan import create_mesh  # noqa: E402
from meshplan.facade._mesh import clear_mesh_cache  # noqa: E402


def main() -> None:
    shape, names = (2, 2, 2), ("dp", "fsdp", "tp")
    auto = (AxisType.Auto,) * 3

    def baseline() -> object:
        return jax.make_mesh(shape, names, axis_types=auto)

    def miss() -> object:
        clear_mesh_cache()
        return create_mesh(shape, names)

    def hit() -> object:
        return create_mesh(shape, names)

    hit()
    base = best_of(baseline, repeat=9, number=50)
    rows = [
        ("create_mesh, cache miss", best_of(miss, repeat=9, number=50), base),
        ("create_mesh, cache hit", best_of(hit, repeat=9, number=200), base),
    ]
    print_table("meshplan.create_mesh on 8 CPU devices", rows, "jax.make_mesh")


if __name__ == "__main__":
    main()
