"""The TPU catalogue's HBM is what libtpu lets one device's program use: an array of exactly ``hbm_bytes``
compiles onto one device ahead of time, and one 1 MiB larger is refused as out of memory. So a plan's budget
(``hbm_bytes`` less the headroom) is a share of memory a program really gets, not the docs' capacity read in
the wrong unit (v6e's "32 GB" is 29.8 GiB; a v6e program gets 31.25 GiB)."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.facade.verify._compilers import libtpu_available
from meshplan.facade.verify._targets import _topology_devices
from meshplan.pure.cluster import DEVICE_SPECS, parse_cluster, tpu_topology

needs_libtpu = pytest.mark.skipif(not libtpu_available(), reason="needs libtpu (pip install 'meshplan[tpu]')")

# The smallest slice of each generation with a full host (the limit is per device, whatever the slice).
_SLICES = {"v4": "v4-8", "v5e": "v5e-4", "v5p": "v5p-8", "v6e": "v6e-4", "tpu7x": "tpu7x-8"}


def _compiles(devices: tuple, nbytes: int) -> bool:
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    one = NamedSharding(Mesh(np.array(devices[:1]), ("x",)), PartitionSpec())
    step = jax.jit(lambda: jnp.zeros((nbytes,), jnp.uint8), out_shardings=one)
    try:
        step.lower().compile()
    except Exception as err:  # noqa: BLE001 -- only XLA's out-of-memory refusal is an answer; anything else fails
        if "RESOURCE_EXHAUSTED" not in str(err):
            raise
        return False
    return True


def test_every_tpu_in_the_catalogue_has_a_slice_here() -> None:
    assert sorted(_SLICES) == sorted(n for n, d in DEVICE_SPECS.items() if d.ici_scope == "slice")


@needs_libtpu
@pytest.mark.parametrize("name", sorted(_SLICES))
def test_a_tpu_program_gets_exactly_the_catalogue_hbm(name: str) -> None:
    hbm = DEVICE_SPECS[name].hbm_bytes
    devices = _topology_devices(tpu_topology(parse_cluster(_SLICES[name])))
    assert _compiles(devices, hbm), f"{name}: an array of hbm_bytes={hbm} does not compile onto one device"
    assert not _compiles(devices, hbm + 2**20), f"{name}: libtpu gives a program more than hbm_bytes={hbm}"
