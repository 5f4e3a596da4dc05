"""The accelerators people rent now: GB200's rack-wide NVLink domain, TPU7x's two devices per chip, the new
GPUs' figures and names, and that whole-word device kinds never confuse nested model names."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.errors import ClusterError
from meshplan.pure import search_meshes
from meshplan.pure.cluster import DEVICE_SPECS, Cluster, parse_cluster, tpu_topology

GB = 10**9


def test_a_gb200_rack_is_one_nvlink_domain_of_18_hosts_of_4() -> None:
    rack = parse_cluster("GB200-NVL72")
    assert (rack.num_nodes, rack.devices_per_node, rack.num_slices) == (18, 4, 1)
    assert rack.ici_domain_size == 72 and rack.num_ici_domains == 1 and rack.ici_domain_name == "NVLink domain"
    two = parse_cluster("2xGB200-NVL72")
    assert two.ici_domain_size == 72 and two.num_ici_domains == 2
    assert parse_cluster("36x4xGB200") == two and parse_cluster("8x4xGB200").ici_domain_size == 32
    assert [d.slice_index for d in two.device_infos()][::72] == [0, 1]  # numbered domain by domain
    assert {d.platform for d in two.device_infos()} == {"gpu"}


@given(st.integers(1, 8), st.integers(1, 18))
def test_rack_clusters_round_trip_through_their_text(racks: int, hosts: int) -> None:
    c = Cluster(DEVICE_SPECS["GB200"], num_nodes=racks * hosts, devices_per_node=4, num_slices=racks)
    if racks == 1 or hosts == 18:
        assert parse_cluster(c.text) == c
    assert c.ici_domain_size * c.num_ici_domains == c.num_devices


def test_a_domain_cannot_hold_more_hosts_than_its_rack() -> None:
    with pytest.raises(ClusterError, match="one GB200 domain joins at most domain_nodes=18 hosts; 36 hosts need "
                                           "num_slices=2"):
        Cluster(DEVICE_SPECS["GB200"], num_nodes=36, devices_per_node=4)


def test_tp_and_fsdp_span_the_racks_hosts_at_nvlink_speed_but_not_two_racks() -> None:
    one = search_meshes("llama3-70b", "GB200-NVL72", batch=72, seq=4096, top_k=10)
    assert all(c.dcn_shape == (1,) * len(c.dcn_shape) for c in one.candidates)  # every axis inside NVLink
    assert any(dict(zip(c.axis_names, c.axis_sizes))["fsdp"] > 4 for c in one.candidates)  # beyond one host
    two = search_meshes("llama3-70b", "2xGB200-NVL72", batch=144, seq=4096, top_k=10)
    for c in two.candidates:
        sizes = dict(zip(c.axis_names, c.dcn_shape))
        assert sizes.get("tp", 1) == 1  # tp stays inside one NVLink domain by default
    # The same 18 hosts with NVLink ending at each host price the fsdp all-gathers over the network instead.
    nodes = Cluster(dataclasses.replace(DEVICE_SPECS["GB200"], ici_scope="node", domain_nodes=None), 18, 4)
    hosts = search_meshes("llama3-70b", nodes, batch=72, seq=4096, top_k=10)
    assert one.best.step.exposed_s <= hosts.best.step.exposed_s


def test_a_tpu7x_name_counts_tensorcores_and_each_is_a_device() -> None:
    c = parse_cluster("tpu7x-128")
    assert c.num_devices == 128 and (c.num_nodes, c.devices_per_node) == (16, 8)
    t = tpu_topology(c)
    assert (t.topology_name, t.chip_config_name, t.chips_per_slice, t.num_devices) == ("tpu7x:4x4x4", "default", 64, 128)
    assert parse_cluster("v7x-8") == parse_cluster("tpu7x-8") and tpu_topology(parse_cluster("tpu7x-2")).grid == (1, 1, 1)
    with pytest.raises(ClusterError, match="no tpu7x slice"):
        parse_cluster("tpu7x-12")


def test_the_new_gpus_keep_the_datasheet_figures() -> None:
    b200, gb200 = DEVICE_SPECS["B200"], DEVICE_SPECS["GB200"]
    assert b200.peak_bf16_flops == 4.5e15 / 2 and b200.peak_fp8_flops == 9e15 / 2  # dense halves of the sparse
    assert gb200.peak_bf16_flops == 360e15 / 72 / 2 and gb200.hbm_bandwidth == 576e12 / 72
    assert b200.intra_bandwidth == gb200.intra_bandwidth == 1.8e12 / 2
    assert DEVICE_SPECS["H800"].intra_bandwidth == 400e9 / 2 and DEVICE_SPECS["H800"].peak_bf16_flops == 989e12
    assert DEVICE_SPECS["H20"].peak_bf16_flops == 148e12 and DEVICE_SPECS["H20"].hbm_bytes == 96 * GB
    assert DEVICE_SPECS["MI300X"].hbm_bytes == 192 * GB and DEVICE_SPECS["MI325X"].hbm_bytes == 256 * GB
    assert DEVICE_SPECS["tpu7x"].peak_bf16_flops == 2307e12 / 2  # per device: half a chip


_NESTED = [("H20", "NVIDIA H200", False), ("H200", "NVIDIA H200", True), ("H20", "NVIDIA H20", True),
           ("B200", "NVIDIA GB200", False), ("GB200", "NVIDIA GB200", True), ("B200", "NVIDIA B200", True),
           ("H100", "NVIDIA H100 80GB HBM3", True), ("A100-80GB", "NVIDIA A100-SXM4-80GB", True),
           ("MI300X", "AMD Instinct MI300X", True), ("MI300X", "AMD Instinct MI325X", False),
           ("tpu7x", "TPU7x", True), ("H100", "NVIDIA H1000", False)]


@pytest.mark.parametrize(("name", "kind", "expected"), _NESTED)
def test_a_device_kind_matches_whole_model_names_only(name: str, kind: str, expected: bool) -> None:
    assert DEVICE_SPECS[name].matches_kind(kind) is expected
