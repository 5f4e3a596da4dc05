"""What the training examples share: a CPU 'cluster' of the test devices and the live bytes per device."""

import jax

import meshplan


def cpu_cluster(hbm_bytes: int) -> meshplan.Cluster:
    """One node of the 8 simulated CPU devices, with made-up NVLink-like links and ``hbm_bytes`` each."""
    device = meshplan.DeviceSpec("cpu-sim", hbm_bytes=hbm_bytes, intra_bandwidth=100e9, inter_bandwidth=10e9,
                                 intra_latency_s=5e-6, inter_latency_s=2e-5, devices_per_node=8)
    return meshplan.Cluster(device, num_nodes=1, devices_per_node=8)


def live_bytes(tree: object, mesh: jax.sharding.Mesh) -> list[int]:
    """Bytes each device of ``mesh`` holds for ``tree`` (sum of its addressable shards), in mesh order."""
    per = {d: 0 for d in mesh.devices.flat}
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            per[shard.device] += shard.data.nbytes
    return [per[d] for d in mesh.devices.flat]
