"""``meshplan demo``: meshes (and, as the planner grows, a placed model) on simulated CPU devices.

Everything printed is computed live: the meshes are real ``jax.sharding.Mesh``
objects over real XLA CPU devices.
"""

from __future__ import annotations

import os

__all__ = ["run", "use_cpu_devices"]


def use_cpu_devices(n: int) -> None:
    """Ask jax for ``n`` CPU devices; must run before jax's backend starts."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_num_cpu_devices", n)


def _mesh_rows(num_devices: int) -> list[tuple[str, str, str]]:
    import jax

    from meshplan import HybridMeshShape, MeshConfig, create_mesh, parse_mesh_from_string

    rows = []

    def add(label: str, mesh: jax.sharding.Mesh) -> None:
        shape = ", ".join(f"{k}={v}" for k, v in mesh.shape.items())
        ids = " ".join(str(d.id) for d in mesh.devices.flat)
        rows.append((label, shape, ids))

    add("create_mesh() default", create_mesh())
    add("create_mesh((2, -1), ('data', 'model'))", create_mesh((2, -1), ("data", "model")))
    add('parse_mesh_from_string("dp:2,tp:-1")', parse_mesh_from_string("dp:2,tp:-1", ["dp", "tp"]))
    config = MeshConfig(
        mesh_shape=(1, -1), mesh_axis_names=("data", "model"),
        mesh_rules=[("cpu-.*", HybridMeshShape((2, num_devices // 2), (1, 1)))],
    )
    add("MeshConfig rule 'cpu-.*' (selector cpu-8)", config.create_device_mesh(mesh_selector="cpu-8"))
    return rows


def run(*, num_devices: int = 8) -> int:
    """Build a few meshes on ``num_devices`` CPU devices and print them; returns 0."""
    use_cpu_devices(num_devices)
    import jax
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"[bold]meshplan demo[/bold] on {jax.device_count()} {jax.default_backend()} devices")
    table = Table(title="Meshes")
    for col in ("request", "axes", "device ids (row-major)"):
        table.add_column(col)
    for row in _mesh_rows(num_devices):
        table.add_row(*row)
    console.print(table)
    return 0
