"""tpu_topology: Cluster -> libtpu's AOT topology arguments; properties over every TPU slice size."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.errors import ClusterError, MeshplanTypeError
from meshplan.pure.cluster import parse_cluster, tpu_topology

# A sample of MaxText's accelerator_to_spec_map (name -> topology, chip config, wrap).
MAXTEXT = {
    "v6e-1": ("v6e:1x1", "default", (False, False, False)),
    "v6e-128": ("v6e:8x16", "default", (False, True, False)),
    "v5e-8": ("v5e:2x4", "default", (False, False, False)),
    "v5e-256": ("v5e:16x16", "default", (True, True, False)),
    "v4-8": ("v4:2x2x1", "megacore", (False, False, False)),
    "v4-64": ("v4:2x4x4", "megacore", (False, False, False)),
    "v4-4096": ("v4:8x16x16", "megacore", (True, True, True)),
    "v5p-128": ("v5:4x4x4", "megacore", (True, True, True)),
    "v5p-256": ("v5:4x4x8", "megacore", (True, True, True)),
    "v5p-384": ("v5:4x4x12", "megacore", (True, True, True)),
    "v5p-1152": ("v5:4x12x12", "megacore", (True, True, True)),
    "v5p-4480": ("v5:4x20x28", "megacore", (True, True, True)),
    "v5p-6912": ("v5:12x12x24", "megacore", (True, True, True)),
    "v5p-9216": ("v5:12x16x24", "megacore", (True, True, True)),
    "v5p-10368": ("v5:12x12x36", "megacore", (True, True, True)),
    "v5p-12288": ("v5:16x16x24", "megacore", (True, True, True)),
}


@pytest.mark.parametrize("name", sorted(MAXTEXT))
def test_matches_maxtext(name):
    t = tpu_topology(parse_cluster(name))
    assert (t.topology_name, t.chip_config_name, t.wrap) == MAXTEXT[name]
    assert t.chips_per_host_bounds == ((1, 1, 1) if name.endswith("-1") else (2, 2, 1))


def _tpu_names() -> st.SearchStrategy[str]:
    small_3d = st.sampled_from([4, 8, 16, 32])
    big_3d = st.integers(1, 96).map(lambda n: 64 * n)
    chips_3d = st.one_of(small_3d, big_3d)
    three_d = st.tuples(st.sampled_from(["v4", "v5p"]), chips_3d).filter(
        lambda g: g[1] <= (4096 if g[0] == "v4" else 6144)).map(lambda g: f"{g[0]}-{2 * g[1]}")
    two_d = st.tuples(st.sampled_from(["v5e", "v6e"]), st.sampled_from([1, 4, 8, 16, 32, 64, 128, 256])).map(
        lambda g: f"{g[0]}-{g[1]}")
    one = st.one_of(three_d, two_d)
    return st.tuples(st.integers(1, 4), one).map(lambda s: s[1] if s[0] == 1 else f"{s[0]}x{s[1]}")


@given(_tpu_names())
def test_grid_holds_the_cluster(name):
    cluster = parse_cluster(name)
    t = tpu_topology(cluster)
    assert math.prod(t.grid) == t.chips_per_slice == cluster.devices_per_slice
    assert t.num_devices == cluster.num_devices and t.num_slices == cluster.num_slices
    assert t.kwargs()["topology_name"] == t.topology_name and t.kwargs()["platform"] == "tpu"
    three_d = cluster.device.name in ("v4", "v5p")
    assert len(t.grid) == (3 if three_d else 2)
    assert t.chip_config_name == ("megacore" if three_d else "default")
    if three_d and t.chips_per_slice >= 64:
        blocks = [d // 4 for d in t.grid]
        assert all(d % 4 == 0 for d in t.grid) and blocks == sorted(blocks) and t.wrap == (True, True, True)
        # The most cubic box of 4x4x4 blocks: no factorisation has a smaller longest side.
        n = t.chips_per_slice // 64
        best = min(max(a, b, n // (a * b)) for a in range(1, n + 1) if n % a == 0
                   for b in range(1, n // a + 1) if (n // a) % b == 0)
        assert blocks[-1] == best


@given(st.sampled_from(["8xH100", "2xH200", "A100-80GB"]))
def test_gpu_clusters_have_no_tpu_topology(name):
    with pytest.raises(ClusterError, match="not a TPU cluster"):
        tpu_topology(parse_cluster(name))


def test_not_a_cluster():
    with pytest.raises(MeshplanTypeError, match="must be a Cluster"):
        tpu_topology("v5p-256")  # type: ignore[arg-type]
